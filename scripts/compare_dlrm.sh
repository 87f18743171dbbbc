#!/usr/bin/env bash
# dlrm in dtrain against the same model in PyTorch with equal resources on both sides, interleaved launches and
# medians: scripts/compare_dlrm.py (its --help says everything; this name is kept for the README and the scripts
# that call it).
#
#   scripts/compare_dlrm.sh --data_dir=/tmp/ctr --table_rows=1000000 --batch_size=512 --examples=200000
exec python3 "$(dirname "$0")/compare_dlrm.py" "$@"
