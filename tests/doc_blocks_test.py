#!/usr/bin/python3
"""Every shell block of the README and docs/*.md runs: each ```sh, ```bash or ```console block (in a console
block, the lines that start with "$ ") is run by bash with -e and -o pipefail in a fresh temporary directory that
looks like the repository's root (scripts/, build/, deploy/, examples/, tests/ and the rest linked there, so
`scripts/...` and `build/bin/...` resolve), with build/bin first on PATH, in a process group of its own that is
killed at the end (with every process that carries the block's DTRAIN_DOC_BLOCK marker, sessions of their own
included), within a deadline. A block that needs what CI lacks (root, a GPU, Slurm or Kubernetes, the
network, many minutes) is marked just before its fence:

    <!-- doc-test: skip needs root: network namespaces -->

and reported as skipped with that reason; `<!-- doc-test: timeout 120 -->` gives a block more than the default
60 s; `<!-- doc-test: continues the job started above -->` runs a block in the same shell right after the block
before it (a job started in the background there, joined here). The test fails when a block fails or runs past its deadline, when a mark has no reason or is not understood,
and when a relative link of a page does not resolve (a file, or a heading's anchor in a Markdown file).
Output examples belong in ```text fences, which are not run.

  tests/doc_blocks_test.py README.md docs/models.md   # those pages (ctest runs one entry per page)
  tests/doc_blocks_test.py --list                     # every block and whether it would run, without running it
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_FENCES = {"sh", "bash", "console", "shell"}
MARK = re.compile(r"^\s*<!--\s*doc-test:(.*?)-->\s*$")
DEFAULT_TIMEOUT = 60


class Block:
    def __init__(self, page, line, lang, body):
        self.page, self.line, self.lang, self.body = page, line, lang, body
        self.skip = None      # the reason, when marked skip
        self.timeout = DEFAULT_TIMEOUT
        self.continues = False  # run after the page's previous block, in its shell

    def where(self):
        return "%s:%d" % (os.path.relpath(self.page, ROOT), self.line)

    def script(self):
        if self.lang != "console":
            return self.body
        cmds = []
        for line in self.body.split("\n"):
            if line.startswith("$ "):
                cmds.append(line[2:])
            elif cmds and cmds[-1].endswith("\\"):
                cmds.append(line)
        return "\n".join(cmds) + "\n"


def parse(page):
    """The page's shell blocks with their marks, and the errors of marks that are not understood."""
    blocks, errors, marks = [], [], []
    lines = open(page, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            words = m.group(1).strip().split(None, 1)
            here = "%s:%d" % (os.path.relpath(page, ROOT), i + 1)
            if not words:
                errors.append("%s: an empty doc-test mark" % here)
            elif words[0] == "skip":
                if len(words) < 2 or len(words[1].strip()) < 8:
                    errors.append("%s: `doc-test: skip` needs a reason (e.g. `doc-test: skip needs a GPU`)" % here)
                else:
                    marks.append(("skip", words[1].strip(), here))
            elif words[0] == "timeout" and len(words) == 2 and words[1].strip().isdigit():
                marks.append(("timeout", int(words[1]), here))
            elif words[0] == "continues":
                marks.append(("continues", True, here))
            else:
                errors.append("%s: doc-test mark %r not understood (skip REASON | timeout SECONDS)" % (here, m.group(1)))
            i += 1
            continue
        fence = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence:
            indent, ticks, lang = fence.group(1), fence.group(2), fence.group(3).lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(ticks[0] * len(ticks)):
                j += 1
            body = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j]) + "\n"
            if lang in SHELL_FENCES:
                b = Block(page, i + 1, lang, body)
                for kind, value, where in marks:
                    if kind == "skip":
                        b.skip = value
                    elif kind == "timeout":
                        b.timeout = value
                    elif not blocks:
                        errors.append("%s: `doc-test: continues` on the page's first block" % where)
                    else:
                        b.continues = True
                if b.continues and blocks and not b.skip:
                    prev = blocks[-1]  # one script: the block before and this one, in one shell and deadline
                    if prev.skip:
                        b.skip = "continues %s, which is skipped" % prev.where()
                        blocks.append(b)
                    else:
                        prev.body = prev.script() + "\n# " + b.where() + "\n" + b.script()
                        prev.lang = "sh"
                        prev.timeout += b.timeout if b.timeout != DEFAULT_TIMEOUT else 0
                        prev.joined = getattr(prev, "joined", []) + [b.where()]
                else:
                    blocks.append(b)
            elif marks:
                errors.append("%s: doc-test mark before a ```%s block, which is not run" % (marks[0][2], lang or "(plain)"))
            marks = []
            i = j + 1
            continue
        if marks and line.strip():
            errors.append("%s: doc-test mark not followed by a code block" % marks[0][2])
            marks = []
        i += 1
    if marks:
        errors.append("%s: doc-test mark at the end of the page" % marks[0][2])
    return blocks, errors


def anchors(page):
    """GitHub's anchors of a Markdown page's headings."""
    out, seen = set(), {}
    in_code = False
    for line in open(page, encoding="utf-8"):
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).lower().replace("`", "")).replace(" ", "-")
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else "%s-%d" % (a, n))
    return out


def check_links(page):
    errors = []
    text = open(page, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # links inside code blocks are not links
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        where = "%s: link (%s)" % (os.path.relpath(page, ROOT), target)
        if not os.path.exists(full):
            errors.append("%s: no such file %s" % (where, os.path.relpath(full, ROOT)))
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            errors.append("%s: no heading with anchor #%s in %s" % (where, anchor, os.path.relpath(full, ROOT)))
    return errors


def make_root(tmp):
    """A directory that looks like the repository's root: every top-level entry linked, nothing written back."""
    for name in os.listdir(ROOT):
        if name.startswith(".") or name in ("README.md",):
            continue
        os.symlink(os.path.join(ROOT, name), os.path.join(tmp, name))


def kill_leftovers(marker):
    """SIGKILL every process that still carries this block's DTRAIN_DOC_BLOCK marker in its environment: what the
    block started in sessions of their own (compare_cluster_sizes does), which the process group does not reach."""
    want = ("DTRAIN_DOC_BLOCK=%s" % marker).encode() + b"\0"
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if want in f.read() + b"\0":
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def run(block, bin_dir, keep):
    tmp = tempfile.mkdtemp(prefix="dtrain_doc_block.")
    try:
        make_root(tmp)
        if bin_dir != os.path.join(ROOT, "build", "bin"):
            os.unlink(os.path.join(tmp, "build"))
            os.makedirs(os.path.join(tmp, "build"))
            os.symlink(bin_dir, os.path.join(tmp, "build", "bin"))
        with open(os.path.join(tmp, ".block.sh"), "w") as f:
            f.write(block.script())
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""), DTRAIN_BIN=bin_dir,
                   DTRAIN_BIN_DIR=bin_dir, TMPDIR=tmp, DTRAIN_DOC_BLOCK=tmp)
        start = time.time()
        log_path = os.path.join(tmp, ".block.log")
        with open(log_path, "wb") as log:  # a file, not a pipe: what the block leaves running cannot hold it open
            p = subprocess.Popen(["bash", "-e", "-o", "pipefail", ".block.sh"], cwd=tmp, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            timed_out = False
            try:
                p.wait(timeout=block.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:  # whatever the block left running in the background
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                kill_leftovers(tmp)
                p.wait()
        secs = time.time() - start
        with open(log_path, "rb") as f:
            out = f.read()
        return p.returncode, timed_out, out.decode("utf-8", "replace"), secs
    finally:
        if keep:
            print("  (kept %s)" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pages", nargs="*", help="Markdown pages (default: README.md and docs/*.md)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="the binaries (first on PATH)")
    ap.add_argument("--list", action="store_true", help="list the blocks and marks; run nothing")
    ap.add_argument("--keep", action="store_true", help="keep each block's directory")
    a = ap.parse_args(argv)
    pages = [os.path.abspath(p) for p in a.pages] or \
        [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    failures, ran, skipped, t0 = [], 0, 0, time.time()
    for page in pages:
        if not os.path.isfile(page):
            failures.append("%s: no such page" % page)
            continue
        blocks, errors = parse(page)
        failures += errors + check_links(page)
        for b in blocks:
            if b.skip:
                skipped += 1
                print("SKIP %s: %s" % (b.where(), b.skip))
                continue
            what = b.where() + "".join(" + " + w.split(":")[-1] for w in getattr(b, "joined", []))
            if a.list:
                print("RUN  %s (%d lines, deadline %d s)" % (what, b.script().count("\n"), b.timeout))
                continue
            if not os.path.isdir(a.bin):
                failures.append("%s: no binaries at %s: build first (scripts/build.sh)" % (b.where(), a.bin))
                continue
            rc, timed_out, out, secs = run(b, a.bin, a.keep)
            ran += 1 + len(getattr(b, "joined", []))
            if rc == 0 and not timed_out:
                print("ok   %s in %.1f s" % (what, secs))
                continue
            why = "ran past its %d s deadline" % b.timeout if timed_out else "exited %d" % rc
            tail = "\n".join("    | " + l for l in out.rstrip().split("\n")[-25:])
            failures.append("%s: the block %s after %.1f s; its last lines:\n%s" % (what, why, secs, tail))
            print("FAIL %s: %s" % (what, why))
    print("doc blocks: %d run, %d skipped, %d failure(s), %.1f s" % (ran, skipped, len(failures), time.time() - t0))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
