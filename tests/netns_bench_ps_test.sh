#!/usr/bin/env bash
# The netns goodput run: dtrain_bench_ps --netns puts a ps task and its client on two emulated hosts (network
# namespaces on a bridge, scripts/netns_hosts.sh) with every link capped by tc tbf, moves 4 MB each way per step
# over gRPC and prints the goodput as a fraction of the cap. Checks: exit 0, every pulled buffer's checksum, that
# the cap is real (the raw TCP reference across the same link stays near it: the shaping applied) and that the
# goodput is a sane fraction of it (above 0.3: the path is not stalled; at most 2: both directions full); then
# the cnn with the early apply (--apply_early), whose goodput must exceed one direction's cap by a quarter; and
# that no namespace is left. Needs root (exit 77 otherwise, or where the kernel lacks namespaces, veth, bridge or
# tbf).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
NETNS="$ROOT/scripts/netns_hosts.sh"

if ! why="$("$NETNS" check)"; then echo "SKIP: $why"; exit 77; fi
[ -x "$BIN/dtrain_bench_ps" ] || { echo "FAIL: $BIN/dtrain_bench_ps not built"; exit 1; }
out="$(mktemp /tmp/dtrain_netns_bench.XXXXXX)"
trap 'rm -f "$out"' EXIT

before="$(ip netns list | grep -c '^benchps' || true)"
code=0
timeout 240 "$BIN/dtrain_bench_ps" --netns --bandwidth=200mbit --netns_hosts="$NETNS" --bytes=4000000 \
  --steps=6 --warmup_steps=2 --transport=grpc >"$out" 2>&1 || code=$?
cat "$out"
[ "$code" -eq 0 ] || { echo "FAIL: dtrain_bench_ps --netns exited $code"; exit 1; }
grep -q "checksums ok" "$out" || { echo "FAIL: a pulled buffer did not match its checksum"; exit 1; }
line="$(grep -o 'goodput_fraction=[0-9.]* raw_tcp_fraction=[0-9.]*' "$out")" ||
  { echo "FAIL: no goodput line"; exit 1; }
good="$(echo "$line" | sed 's/goodput_fraction=\([0-9.]*\).*/\1/')"
raw="$(echo "$line" | sed 's/.*raw_tcp_fraction=\([0-9.]*\)/\1/')"
awk -v r="$raw" 'BEGIN { exit !(r > 0.5 && r < 1.3) }' ||
  { echo "FAIL: the raw TCP round trip ran at $raw of the 200mbit cap: the link is not shaped as asked"; exit 1; }
awk -v g="$good" 'BEGIN { exit !(g > 0.3 && g <= 2.0) }' ||
  { echo "FAIL: goodput $good of the cap (expected within (0.3, 2])"; exit 1; }
# The early apply (--apply_early=auto: the client is on another host): the pull streams the push's update back while
# the push still uploads, so both directions carry data at once: goodput well above one direction's cap.
code=0
timeout 240 "$BIN/dtrain_bench_ps" --netns --bandwidth=200mbit --netns_hosts="$NETNS" --model=cnn \
  --steps=4 --warmup_steps=1 --transport=grpc --apply_early=auto >"$out" 2>&1 || code=$?
cat "$out"
[ "$code" -eq 0 ] || { echo "FAIL: dtrain_bench_ps --netns --apply_early=auto exited $code"; exit 1; }
grep -q "checksums ok" "$out" || { echo "FAIL: a pulled buffer did not match its checksum (early apply)"; exit 1; }
early="$(grep -o 'goodput_fraction=[0-9.]*' "$out" | sed 's/.*=//')"
awk -v g="$early" 'BEGIN { exit !(g > 1.25 && g <= 2.0) }' ||
  { echo "FAIL: with the early apply, goodput $early of the cap (expected within (1.25, 2]: both directions busy)"
    exit 1; }
after="$(ip netns list | grep -c '^benchps' || true)"
[ "$after" -le "$before" ] || { echo "FAIL: dtrain_bench_ps left network namespaces behind"; ip netns list; exit 1; }
echo "PASS: goodput $good of the cap, raw TCP $raw; with the early apply $early"
