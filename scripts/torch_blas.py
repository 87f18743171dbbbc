"""The BLAS PyTorch runs on, for every comparison script (compare_pytorch.py, compare_onnx_pytorch.py,
dlrm_pytorch.py and compare_dlrm.py through it).

Debian's python3-torch pulls in only the reference BLAS, with which PyTorch runs ~4-30x slower; the pthread
OpenBLAS fights PyTorch's OpenMP pool. A fair comparison loads the OpenMP OpenBLAS (libopenblas0-openmp, which
scripts/install_deps.sh installs) through LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp, and checks
that PyTorch really mapped it (/work/shared/BENCHMARKS.md). require_openblas_openmp() is that check: a figure
taken on another BLAS is refused unless the caller allows it (and then labelled with the library's name)."""
import os
import sys

OPENBLAS_OPENMP = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
DEBIAN_PYTHON = "/usr/bin/python3"


def torch_env(threads, **extra):
    """os.environ with the OpenMP OpenBLAS first on LD_LIBRARY_PATH and OMP_NUM_THREADS=threads."""
    env = dict(os.environ)
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
    allow_other: prints a warning and returns its name, which the caller reports beside its figures)."""
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
