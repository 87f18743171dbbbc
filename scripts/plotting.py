"""Drawing the pictures the comparison tools leave beside their tables (matplotlib, Debian's python3-matplotlib).

Every tool that writes a table also draws its picture; when it cannot (no matplotlib for this interpreter, a
drawing that fails, a file that cannot be written) it says so and the tool exits 1 after writing the table: a
missing picture is an error, never a silent skip. scripts/install_deps.sh installs python3-matplotlib for
Debian's /usr/bin/python3 (the python3 first on PATH may be another interpreter that cannot import it).
"""
import os
import sys


class PlotError(Exception):
    """The picture could not be drawn; the message names the file and why."""


def pyplot(path):
    """matplotlib.pyplot on the Agg backend, or PlotError naming `path` and how to get matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
            hint = "run the tool with Debian's /usr/bin/python3 (scripts/install_deps.sh installs python3-matplotlib)"
        else:
            hint = "install it: scripts/install_deps.sh (python3-matplotlib)"
        raise PlotError("cannot draw %s: %s cannot import matplotlib (%s); %s" % (path, sys.executable, e, hint))
    return plt


def save(fig, path, dpi=100):
    """Writes `fig` to `path` (PNG, or SVG by its extension) and closes it; PlotError when that fails."""
    import matplotlib.pyplot as plt
    try:
        fig.savefig(path, dpi=dpi)
    except (OSError, ValueError) as e:
        raise PlotError("cannot write the picture %s: %s" % (path, e))
    finally:
        plt.close(fig)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        raise PlotError("the picture %s was not written" % path)


def is_picture(path):
    """True when `path` holds a PNG (its 8-byte signature and an IHDR chunk) or an SVG document."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return head[12:16] == b"IHDR"
    return b"<svg" in head
