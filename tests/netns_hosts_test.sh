#!/usr/bin/env bash
# scripts/netns_hosts.sh's emulated hosts with their own CPUs and link delay (root; exit 77 otherwise, or where the
# kernel lacks namespaces, CPU quotas or a way to delay packets):
# - bad --host_cpus / --latency / --cpu_period_us values are refused (exit 2) with a message naming the option,
#   leaving nothing behind;
# - up 3 --host_cpus=0.25 --latency=10 --bandwidth=1gbit: a busy loop started by `exec` (as a child of a shell:
#   the group is inherited) runs in its host's group and gets 0.25 of a core (0.10..0.35 over 1.5 s), two at once
#   on two hosts each their own quarter; TCP connects between two hosts take at least 2 x 10 ms (and less than
#   2 x 10 + 15 ms), and 20 MB cross the delayed, capped link whole;
# - down leaves no namespace, group, state or delay daemon; an `up` that fails half-way (its delay daemon dies)
#   leaves nothing either.
# About 15 s on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export DTRAIN_BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
NETNS="$ROOT/scripts/netns_hosts.sh"
PY=/usr/bin/python3

source "$(dirname "$0")/skipping.sh"
if ! why="$("$NETNS" check --host_cpus --latency)"; then skip "$why"; fi
echo "$why"

NAME="dthosts$$-$RANDOM"
dir="$(mktemp -d /tmp/dtrain_netns_hosts_test.XXXXXX)"
cleanup() {
  "$NETNS" down "$NAME" >/dev/null 2>&1 || true
  "$NETNS" down "$NAME-f" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# nothing_left NAME WHAT: no namespace, cgroup, state or daemon of NAME remains.
nothing_left() {
  local left
  left="$(ip netns list | awk '{print $1}' | grep "^$1-" | xargs || true)"
  [ -z "$left" ] || fail "$2: namespaces left: $left"
  for g in /sys/fs/cgroup/dtrain-netns-"$1" /sys/fs/cgroup/cpu/dtrain-netns-"$1" \
           /sys/fs/cgroup/cpu,cpuacct/dtrain-netns-"$1"; do
    [ ! -e "$g" ] || fail "$2: group $g left"
  done
  [ ! -e "/run/dtrain_netns_hosts/$1" ] || fail "$2: state /run/dtrain_netns_hosts/$1 left"
}

# ---- refusals ----
refused() {  # refused PATTERN ARGS...: up exits 2 with PATTERN in its message and leaves nothing
  local pattern="$1" rc=0
  shift
  "$NETNS" up "$NAME" 2 "$@" >"$dir/refused.out" 2>&1 || rc=$?
  if [ "$rc" != 2 ] || ! grep -q -- "$pattern" "$dir/refused.out"; then
    fail "up $* : exit $rc, $(cat "$dir/refused.out") (wanted exit 2 and '$pattern')"
  fi
  nothing_left "$NAME" "up $*"
}
cores="$(nproc)"
refused "host_cpus=0 is too small" --host_cpus=0
refused "bad --host_cpus '-1'" --host_cpus=-1
refused "bad --host_cpus 'abc'" --host_cpus=abc
refused "too small" --host_cpus=0.001
refused "more than the $cores cores" --host_cpus=$((cores + 1))
refused "bad --latency '-1'" --latency=-1
refused "bad --latency 'abc'" --latency=abc
refused "more than 10000 ms" --latency=20000
refused "bad --cpu_period_us" --host_cpus=0.5 --cpu_period_us=100
refused "needs --host_cpus" --cpu_period_us=10000

# ---- up ----
"$NETNS" up "$NAME" 3 --host_cpus=0.25 --latency=10 --bandwidth=1gbit >"$dir/hosts"
cat "$dir/hosts"
"$NETNS" info "$NAME" | tee "$dir/info"
grep -q "host_cpus=0.25" "$dir/info" && grep -q "latency_ms=10" "$dir/info" || fail "info: $(cat "$dir/info")"
A1="$(sed -n 2p "$dir/hosts" | cut -d' ' -f2)"
# A process on a host sees its own quota (what dtrain's --threads=auto and --profile_out read): `ip netns exec`'s
# own /sys would hide /sys/fs/cgroup.
q="$("$NETNS" exec "$NAME" 1 sh -c 'p=$(grep -E "^[0-9]+:(cpu|cpu,cpuacct|cpuacct,cpu):" /proc/self/cgroup | cut -d: -f3);
  cat /sys/fs/cgroup/cpu"$p"/cpu.cfs_quota_us /sys/fs/cgroup/cpu"$p"/cpu.cfs_period_us 2>/dev/null ||
  cat /sys/fs/cgroup"$(grep "^0::" /proc/self/cgroup | cut -d: -f3)"/cpu.max' | xargs)"
echo "quota seen on host 1: $q"
/usr/bin/python3 -c "import sys; v=sys.argv[1].split(); assert abs(float(v[0]) / float(v[1]) - 0.25) < 1e-6" "$q" ||
  fail "a process on host 1 does not see its quota of 0.25 core ('$q')"

# The quota: CPU seconds a busy loop got over 1.5 s of wall-clock, read from its own /proc/self/stat (utime +
# stime), in a child of a shell `exec` started (the group is inherited).
cat >"$dir/busy.py" <<'PY'
import os, sys, time
end = time.monotonic() + 1.5
t0 = time.monotonic()
while time.monotonic() < end:
    pass
wall = time.monotonic() - t0
f = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
lines = [l.rstrip("\n").split(":", 2) for l in open("/proc/self/cgroup")]
group = [path for _, ctl, path in lines if "cpu" in ctl.split(",") or ctl == ""]
print("%.3f %s" % (cpu / wall, group[0] if group else "?"))
PY
"$NETNS" exec "$NAME" 1 sh -c "$PY $dir/busy.py" >"$dir/busy1.out"
cat "$dir/busy1.out"
read -r share group <"$dir/busy1.out"
[[ "$group" == *"dtrain-netns-$NAME/h1"* ]] || fail "the busy loop ran in group '$group', not host 1's"
# At most the quota (a loop without one gets a whole core); at least some of it (the machine may be busy).
awk -v s="$share" 'BEGIN { exit !(s >= 0.10 && s <= 0.35) }' || fail "host 1's busy loop got $share cores, not 0.25"
# Two hosts at once: each its own quarter (together half a core, well under the machine's cores).
"$NETNS" exec "$NAME" 1 "$PY" "$dir/busy.py" >"$dir/busy_a.out" &
pa=$!
"$NETNS" exec "$NAME" 2 "$PY" "$dir/busy.py" >"$dir/busy_b.out"
wait "$pa"
for f in busy_a busy_b; do
  read -r share group <"$dir/$f.out"
  echo "$f: $share cores in $group"
  awk -v s="$share" 'BEGIN { exit !(s >= 0.10 && s <= 0.35) }' || fail "$f: $share cores, not 0.25"
done

# The delay: TCP connects from host 0 to host 1 (a SYN and its SYN-ACK: one round trip, 2 x 10 ms), then 20 MB
# across the capped, delayed link (tests/netdelay/link_probe.py).
PROBE="$ROOT/tests/netdelay/link_probe.py"
"$NETNS" exec "$NAME" 1 timeout 40 "$PY" "$PROBE" serve >"$dir/serve.out" 2>&1 &
ps_=$!
sleep 0.5
"$NETNS" exec "$NAME" 0 timeout 40 "$PY" "$PROBE" probe "$A1" --connects=5 --bulk_mb=20 >"$dir/connect.out" 2>&1 ||
  fail "connects: $(cat "$dir/connect.out")"
wait "$ps_" || fail "the receiver: $(cat "$dir/serve.out")"
cat "$dir/connect.out" "$dir/serve.out"
rtt="$(sed -n 's/.*; min \([0-9.]*\);.*/\1/p' "$dir/connect.out")"
awk -v r="${rtt:-0}" 'BEGIN { exit !(r >= 20 && r < 35) }' || fail "a connect took ${rtt:-?} ms, not 20..35 (2 x 10 ms)"
grep -q "^received 20971520 bytes" "$dir/serve.out" || fail "the 20 MB did not arrive whole"

# ---- down ----
pids="$(cat /run/dtrain_netns_hosts/"$NAME"/netdelay_*.pid 2>/dev/null | xargs || true)"
"$NETNS" down "$NAME"
nothing_left "$NAME" "down"
for p in $pids; do
  st="$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo gone)"
  [ "$st" = gone ] || [ "$st" = Z ] || fail "delay daemon $p still running after down (state $st)"
done

# ---- a failed up: the second host's delay daemon dies at start (after the probe, the first host and the
# groups were made) ----
cat >"$dir/fake_netdelay" <<EOF
#!/bin/sh
n=\$(cat "$dir/starts" 2>/dev/null || echo 0); echo \$((n + 1)) >"$dir/starts"
if [ "\$n" -ge 2 ]; then echo "fake daemon: broken"; exit 1; fi
echo \$\$ >>"$dir/fake_pids"
echo "dtrain_netdelay: ready"; exec sleep 30
EOF
chmod +x "$dir/fake_netdelay"
rc=0
NETNS_DELAY=netdelay DTRAIN_NETDELAY="$dir/fake_netdelay" "$NETNS" up "$NAME-f" 3 --host_cpus=0.25 --latency=5 \
  --bandwidth=1gbit >"$dir/failed.out" 2>&1 || rc=$?
cat "$dir/failed.out"
[ "$rc" != 0 ] && grep -q "fake daemon: broken" "$dir/failed.out" || fail "the failing up: exit $rc"
nothing_left "$NAME-f" "the failed up"
sleep 0.2
for p in $(cat "$dir/fake_pids" 2>/dev/null); do
  st="$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo gone)"
  [ "$st" = gone ] || [ "$st" = Z ] || fail "the failed up left daemon $p running (state $st)"
done

if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed"
exit 1
