"""The BLAS PyTorch runs on, for every comparison script (compare_pytorch.py, compare_onnx_pytorch.py,
dlrm_pytorch.py and compare_dlrm.py through it).

Debian's python3-torch pulls in only the reference BLAS, with which PyTorch runs ~4-30x slower; the pthread
OpenBLAS fights PyTorch's OpenMP pool. A fair comparison loads the OpenMP OpenBLAS (libopenblas0-openmp, which
scripts/install_deps.sh installs) through LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp, and checks
that PyTorch really mapped it (/work/shared/BENCHMARKS.md). require_openblas_openmp() is that check: a figure
taken on another BLAS is refused unless the caller allows it (and then labelled with the library's name).

The allocator too: every dtrain binary tunes glibc's malloc at start (common/malloc_tuning.cc,
TuneMallocForLargeReusedBuffers: mmap threshold 256 MiB, trim threshold 512 MiB), so that a step's large buffers
are reused instead of mapped and faulted in afresh. PyTorch on glibc's defaults maps every tensor above the dynamic
threshold (at most 32 MiB) anew each step; measured on the 2-core machine, its MLP at batch 100 then ran anywhere
from 11.6 K to 47 K examples/sec from one launch to the next, and 44-49 K with the same tuning. torch_env() gives
the PyTorch side the same settings through GLIBC_TUNABLES, and require_openblas_openmp() checks them too."""
import os
import sys

OPENBLAS_OPENMP = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
DEBIAN_PYTHON = "/usr/bin/python3"
# glibc's tunables for what common/malloc_tuning.cc sets with mallopt (keep the two equal).
MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold=268435456", "glibc.malloc.trim_threshold=536870912")


def with_malloc_tunables(tunables):
    """A GLIBC_TUNABLES value: `tunables` (may be empty) with MALLOC_TUNABLES set, other tunables kept."""
    names = {t.split("=")[0] for t in MALLOC_TUNABLES}
    kept = [t for t in (tunables or "").split(":") if t and t.split("=")[0] not in names]
    return ":".join(kept + list(MALLOC_TUNABLES))


def malloc_tuned():
    """Whether this process's GLIBC_TUNABLES hold MALLOC_TUNABLES (as dtrain's binaries tune malloc)."""
    have = set(os.environ.get("GLIBC_TUNABLES", "").split(":"))
    return all(t in have for t in MALLOC_TUNABLES)


def torch_env(threads, **extra):
    """os.environ with the OpenMP OpenBLAS first on LD_LIBRARY_PATH, OMP_NUM_THREADS=threads and glibc's malloc
    tuned as dtrain's binaries tune it (MALLOC_TUNABLES in GLIBC_TUNABLES)."""
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = with_malloc_tunables(env.get("GLIBC_TUNABLES"))
    rest = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != OPENBLAS_OPENMP]
    env["LD_LIBRARY_PATH"] = ":".join([OPENBLAS_OPENMP] + rest)
    env["OMP_NUM_THREADS"] = str(threads)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def blas_in_use():
    """The BLAS mapped into this process: "openblas-openmp" when every BLAS library mapped (libblas*, libopenblas*)
    comes from the OpenMP OpenBLAS, else "other:<dir/library, ...>" ("other:none" before `import torch`). A
    reference libblas.so.3 found first on LD_LIBRARY_PATH beside the OpenBLAS that liblapack pulls in is "other":
    the BLAS calls would go to whichever the loader bound first."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in os.path.basename(line.split()[-1])}
    if libs and all(lib.startswith(OPENBLAS_OPENMP + "/") for lib in libs):
        return "openblas-openmp"
    names = sorted(os.path.join(os.path.basename(os.path.dirname(lib)), os.path.basename(lib)) for lib in libs)
    return "other:" + (",".join(names) or "none")


def require_openblas_openmp(who, allow_other=False):
    """After `import torch`: the BLAS in use; exits 2 naming it unless it is the OpenMP OpenBLAS (with
    allow_other: prints a warning and returns its name, which the caller reports beside its figures). Also exits 2
    when malloc is not tuned as dtrain's (GLIBC_TUNABLES without MALLOC_TUNABLES: start it through torch_env())."""
    if not malloc_tuned():
        sys.exit(f"{who}: PyTorch's malloc is not tuned as dtrain's binaries tune theirs (GLIBC_TUNABLES="
                 f"{os.environ.get('GLIBC_TUNABLES', '')!r} lacks {':'.join(MALLOC_TUNABLES)}; "
                 f"scripts/torch_blas.py torch_env() sets it), so its figures are not comparable")
    blas = blas_in_use()
    if blas == "openblas-openmp":
        return blas
    why = (f"{who}: PyTorch is not running on the OpenMP OpenBLAS ({blas}; LD_LIBRARY_PATH="
           f"{os.environ.get('LD_LIBRARY_PATH', '')!r}), so its figures are not comparable. Install it "
           f"(scripts/install_deps.sh installs libopenblas0-openmp) and run with LD_LIBRARY_PATH={OPENBLAS_OPENMP}")
    if not os.path.isdir(OPENBLAS_OPENMP):
        why += f" ({OPENBLAS_OPENMP} does not exist)"
    if allow_other:
        print("WARNING: " + why + "; --any_blas: going on", file=sys.stderr)
        return blas
    print(why + " (or pass --any_blas to time it anyway, labelled)", file=sys.stderr)
    sys.exit(2)
