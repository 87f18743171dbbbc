#!/usr/bin/env bash
# Compares wall-clock training time across cluster sizes (local, 1 ps with 1, 2, ... workers; sync and async).
# See scripts/compare_cluster_sizes.py --help. Uses Debian's /usr/bin/python3 so --plot can use matplotlib.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/scripts/compare_cluster_sizes.py" "$@"
