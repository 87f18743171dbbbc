#!/usr/bin/env bash
# Emulated hosts on one machine: N network namespaces ("hosts") with one interface each (eth0, 10.x address),
# cabled to a bridge that lives in its own namespace (the "switch"), so nothing is added to the caller's network
# namespace. Optionally every link is capped in both directions with `tc tbf` (like a NIC of that speed: each
# host's upload at its eth0, its download at its switch port), every host gets its own share of the CPUs (a
# cgroup CPU quota), and every link a propagation delay. Needs root and a kernel with network namespaces, veth,
# bridge (sch_tbf for --bandwidth; the cgroup cpu controller for --host_cpus; netem, or NFQUEUE with iptables and
# build/bin/dtrain_netdelay, for --latency). docs/emulated_hosts.md says how faithful each part is.
#
#   scripts/netns_hosts.sh check [--host_cpus] [--latency]
#                        # exit 0 if usable here (and says how quotas and delays would be made), else why, exit 77
#   scripts/netns_hosts.sh up NAME N [--bandwidth=1gbit] [--host_cpus=F] [--latency=MS] [--subnet=10.77.0]
#                        [--cpu_period_us=US]         # prints "NAME-hK ADDRESS" for K = 0..N-1
#   scripts/netns_hosts.sh exec NAME K CMD [ARGS...]  # runs CMD on host K (its namespace and its CPU quota)
#   scripts/netns_hosts.sh addr NAME K                # prints host K's address
#   scripts/netns_hosts.sh info NAME                  # prints NAME's settings (host_cpus=... latency_ms=...)
#   scripts/netns_hosts.sh down NAME                  # removes every namespace, group and daemon of NAME
#   scripts/netns_hosts.sh cut NAME A B               # partitions hosts A and B from each other (both ways)
#   scripts/netns_hosts.sh heal NAME A B              # ends that partition
#
# --host_cpus=F: every host gets F cores (0.01 up to the cores here; 0.25 = a quarter core) through a CPU quota:
# cgroup v1 (cpu.cfs_quota_us = F x cpu.cfs_period_us) or v2 (cpu.max), groups dtrain-netns-NAME/hK; a short
# period (--cpu_period_us, default 10000, raised where F x period would be under the kernel's 1 ms minimum quota)
# spreads the throttling finely. `exec` puts CMD into its host's group before it starts; its children stay there.
# --latency=MS: every packet between two hosts is delayed MS milliseconds on its way (a round trip: 2 x MS), with
# netem on each eth0 where the kernel has it, else by one dtrain_netdelay per host (NFQUEUE; $DTRAIN_NETDELAY, or
# found in $DTRAIN_BIN, else in build/bin), which runs in the host's namespace but outside its quota.
# NETNS_DELAY=netem|netdelay chooses one of the two.
#
# `cut` is a network partition between two hosts only (each still reaches every other host): their frames to
# each other silently vanish, as on a failed link, and TCP sees no error, only silence (its retransmissions
# resume when the link is healed). It gives each host a permanent neighbour (ARP) entry for the other's address
# pointing to a MAC address no host has; `heal` deletes both entries, so the hosts resolve each other again.
#
# Host K has address SUBNET.(K+1)/24. NAME (letters, digits, '.', '_', '-'; at most 40) keeps clusters apart:
# pick a unique one (e.g. with $$) when several may run at once. `down` also ends processes still running in
# NAME's namespaces and groups (by pid), so that the namespaces and groups really go away; a failed `up` leaves
# nothing behind. What `up` set is kept in $NETNS_HOSTS_STATE/NAME (default /run/dtrain_netns_hosts/NAME).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE_ROOT="${NETNS_HOSTS_STATE:-/run/dtrain_netns_hosts}"
NETDELAY="${DTRAIN_NETDELAY:-}"
if [ -z "$NETDELAY" ]; then  # beside the binaries in use, else this tree's build
  NETDELAY="$ROOT/build/bin/dtrain_netdelay"
  [ -z "${DTRAIN_BIN:-}" ] || [ ! -x "$DTRAIN_BIN/dtrain_netdelay" ] || NETDELAY="$DTRAIN_BIN/dtrain_netdelay"
fi
DEFAULT_PERIOD_US=10000

die() { echo "netns_hosts: $*" >&2; exit 2; }

usage() { sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

check_name() {
  [[ "$1" =~ ^[A-Za-z0-9._-]{1,40}$ ]] || die "bad NAME '$1' (letters, digits, '.', '_', '-'; at most 40)"
}

# Converts a tc rate (e.g. 1gbit, 100mbit, 500kbit, 2.5gbit) to bytes per second; dies on anything else.
rate_bytes() {
  local r="$1" num unit mult
  [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] ||
    die "bad --bandwidth '$r' (expected a number with bit, kbit, mbit or gbit, e.g. 1gbit)"
  num="${BASH_REMATCH[1]}"; unit="${BASH_REMATCH[3]}"
  case "$unit" in bit) mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;; esac
  awk -v n="$num" -v m="$mult" 'BEGIN { b = n * m / 8; if (b < 1000) exit 1; printf "%d\n", b }' ||
    die "--bandwidth '$r' is too small (at least 8kbit)"
}

namespaces_of() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(h[0-9]+|sw)\$" || true
}

# ---- CPU quotas (cgroups) ----

# Prints "v1 DIR" or "v2 DIR" for the cpu controller's hierarchy where groups can go, or "none WHY".
cgroup_kind() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo "v2 /sys/fs/cgroup"
  elif [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    echo "v1 /sys/fs/cgroup/cpu"
  elif [ -f /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us ]; then
    echo "v1 /sys/fs/cgroup/cpu,cpuacct"
  else
    echo "none no cgroup cpu controller mounted (neither /sys/fs/cgroup/cgroup.controllers nor /sys/fs/cgroup/cpu)"
  fi
}

group_of() { echo "$2/dtrain-netns-$1"; }  # group_of NAME HIERARCHY_DIR

# make_groups NAME N F PERIOD_US: the parent group and one group per host with quota F x PERIOD_US. Dies with the
# kernel's complaint; the caller's trap removes what was made. The parent weighs as much as N ordinary processes
# (cpu.shares 1024 x N, cpu.weight 100 x N): as one group of default weight, the N hosts together would compete
# with the machine's other processes like a single one (8 busy hosts of 0.25 on 2 busy cores: 0.11 of a core each
# instead of 0.20).
make_groups() {
  local name="$1" n="$2" f="$3" period="$4" kind dir parent quota k
  read -r kind dir <<<"$(cgroup_kind)"
  [ "$kind" != none ] || die "--host_cpus: $dir"
  parent="$(group_of "$name" "$dir")"
  quota="$(awk -v f="$f" -v p="$period" 'BEGIN { printf "%d\n", f * p + 0.5 }')"
  echo "$parent" >"$STATE/cgroup"
  if [ "$kind" = v2 ]; then
    if ! grep -qw cpu "$dir/cgroup.subtree_control"; then
      echo +cpu >"$dir/cgroup.subtree_control" 2>/dev/null ||
        die "--host_cpus: cannot enable the cpu controller in $dir/cgroup.subtree_control"
    fi
    mkdir "$parent" || die "--host_cpus: cannot create $parent"
    echo $((n * 100 > 10000 ? 10000 : n * 100)) >"$parent/cpu.weight" || die "--host_cpus: cannot weigh $parent"
    echo +cpu >"$parent/cgroup.subtree_control" || die "--host_cpus: cannot enable cpu in $parent"
    for ((k = 0; k < n; k++)); do
      mkdir "$parent/h$k"
      echo "$quota $period" >"$parent/h$k/cpu.max" || die "--host_cpus: cannot write $parent/h$k/cpu.max"
    done
  else
    mkdir "$parent" || die "--host_cpus: cannot create $parent"
    echo $((n * 1024 > 262144 ? 262144 : n * 1024)) >"$parent/cpu.shares" || die "--host_cpus: cannot weigh $parent"
    for ((k = 0; k < n; k++)); do
      mkdir "$parent/h$k"
      echo "$period" >"$parent/h$k/cpu.cfs_period_us" || die "--host_cpus: cannot set $parent/h$k/cpu.cfs_period_us"
      echo "$quota" >"$parent/h$k/cpu.cfs_quota_us" || die "--host_cpus: cannot set $parent/h$k/cpu.cfs_quota_us"
    done
  fi
}

# Every pid in NAME's groups (recorded in its state, or where the name says they would be).
group_pids() {
  local parent="" kind dir
  [ -f "$STATE_ROOT/$1/cgroup" ] && parent="$(cat "$STATE_ROOT/$1/cgroup")"
  if [ -z "$parent" ]; then
    read -r kind dir <<<"$(cgroup_kind)"
    [ "$kind" = none ] || parent="$(group_of "$1" "$dir")"
  fi
  [ -n "$parent" ] && [ -d "$parent" ] || return 0
  cat "$parent"/h*/cgroup.procs 2>/dev/null || true
}

remove_groups() {  # remove_groups NAME: rmdir the host groups and the parent; dies if one stays
  local parent="" kind dir g
  [ -f "$STATE_ROOT/$1/cgroup" ] && parent="$(cat "$STATE_ROOT/$1/cgroup")"
  if [ -z "$parent" ]; then
    read -r kind dir <<<"$(cgroup_kind)"
    [ "$kind" = none ] || parent="$(group_of "$1" "$dir")"
  fi
  [ -n "$parent" ] && [ -d "$parent" ] || return 0
  # A process that has just exited may hold its group for a moment: retry for up to 2 s.
  for _ in $(seq 20); do
    for g in "$parent"/h*/; do [ -d "$g" ] && rmdir "$g" 2>/dev/null; done
    rmdir "$parent" 2>/dev/null && return 0
    sleep 0.1
  done
  die "could not remove $parent (still holds: $(cat "$parent"/h*/cgroup.procs 2>/dev/null | xargs))"
}

# ---- link delay ----

# Prints the delay method usable here: "netem", "netdelay", or "none WHY". Probes in a namespace of its own.
delay_method() {
  local probe="dtrain-dprobe-$$-$RANDOM" want="${NETNS_DELAY:-}" why="" pid line
  ip netns add "$probe" 2>/dev/null || { echo "none cannot create a network namespace"; return; }
  ip -n "$probe" link set lo up
  if [ "$want" != netdelay ] && ip netns exec "$probe" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    ip netns del "$probe"; echo netem; return
  fi
  [ "$want" != netem ] || { ip netns del "$probe"; echo "none NETNS_DELAY=netem: no sch_netem in this kernel"; return; }
  if [ ! -x "$NETDELAY" ]; then
    why="no netem in this kernel, and no $NETDELAY (build it: needs libnetfilter-queue-dev, libmnl-dev)"
  elif ! command -v iptables >/dev/null; then
    why="no netem in this kernel, and no iptables for dtrain_netdelay (apt-get install iptables)"
  elif ! ip netns exec "$probe" iptables -t mangle -A PREROUTING -i lo -j NFQUEUE --queue-num 0 2>/dev/null; then
    why="no netem in this kernel, and iptables cannot add an NFQUEUE rule (no xt_NFQUEUE / nf_tables?)"
  else
    # The daemon binds its queue (nfnetlink_queue) and says so.
    exec {fd}< <(ip netns exec "$probe" timeout 5 "$NETDELAY" --queue=0 --delay_ms=1 2>&1)
    pid=$!
    line=""
    read -r -t 5 line <&"$fd" || true
    kill "$pid" 2>/dev/null || true
    exec {fd}<&-
    [[ "$line" == *ready* ]] ||
      why="no netem in this kernel, and dtrain_netdelay cannot serve a queue: ${line:-no answer}"
  fi
  ip netns del "$probe" 2>/dev/null || true
  if [ -n "$why" ]; then echo "none $why"; else echo netdelay; fi
}

# start_netdelay NAME K MS: one daemon in host K's namespace (its own session, outside the host's group), its
# rule once it is ready: every packet coming in on eth0 waits MS. Delaying at the receiving host's eth0, not the
# sender's: a packet held before it leaves still counts against its TCP socket (TCP small queues), which then
# sends only a few packets per delay (1 Gbit fell to 7-9 Mbit/s with 5 ms); past the veth it no longer does.
# Every packet between two hosts is received by exactly one host, so it is delayed exactly once either way.
start_netdelay() {
  local name="$1" k="$2" ms="$3" h="$1-h$2" log pid
  log="$STATE/netdelay_$k.log"
  setsid ip netns exec "$h" "$NETDELAY" --queue=0 --delay_ms="$ms" >"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$STATE/netdelay_$k.pid"
  for _ in $(seq 50); do
    grep -q ready "$log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || die "dtrain_netdelay for $h exited: $(cat "$log")"
    sleep 0.1
  done
  grep -q ready "$log" || die "dtrain_netdelay for $h not ready after 5 s: $(cat "$log")"
  ip netns exec "$h" iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0 ||
    die "cannot add the NFQUEUE rule in $h"
}

stop_netdelays() {  # by pid file (the namespace may be gone already); only our own daemons (their flag)
  local f pid
  for f in "$STATE_ROOT/$1"/netdelay_*.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--delay_ms="; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
}

# ---- commands ----

cmd_check() {
  local want_cpus=0 want_latency=0 a kind dir method
  for a in "$@"; do
    case "$a" in
      --host_cpus) want_cpus=1 ;;
      --latency) want_latency=1 ;;
      *) die "unknown option '$a' for check (--host_cpus, --latency)" ;;
    esac
  done
  if [ "$(id -u)" != 0 ]; then echo "netns_hosts: needs root (ip netns add)"; exit 77; fi
  command -v ip >/dev/null || { echo "netns_hosts: no 'ip' command (apt-get install iproute2)"; exit 77; }
  local probe="dtrain-probe-$$-$RANDOM" why=""
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns_hosts: this kernel or sandbox does not allow network namespaces (ip netns add failed)"; exit 77
  fi
  if ! ip -n "$probe" link add name br0 type bridge 2>/dev/null; then
    why="no bridge support in this kernel"
  elif ! ip -n "$probe" link add name v0 type veth peer name v1 2>/dev/null; then
    why="no veth support in this kernel"
  elif [ "${NETNS_CHECK_TBF:-1}" = 1 ] &&
       ! ip netns exec "$probe" tc qdisc add dev v0 root tbf rate 1gbit burst 128kb latency 50ms 2>/dev/null; then
    why="no tc tbf (sch_tbf) in this kernel"
  fi
  ip netns del "$probe" 2>/dev/null || true
  if [ -n "$why" ]; then echo "netns_hosts: $why"; exit 77; fi

  # CPU quotas: a group made and removed again.
  read -r kind dir <<<"$(cgroup_kind)"
  if [ "$kind" != none ]; then
    local g="$dir/dtrain-netns-probe-$$-$RANDOM"
    if [ "$kind" = v2 ]; then
      if ! { grep -qw cpu "$dir/cgroup.subtree_control" || echo +cpu >"$dir/cgroup.subtree_control"; } 2>/dev/null; then
        kind=none dir="cannot enable the cpu controller in $dir/cgroup.subtree_control"
      elif ! { mkdir "$g" && echo "25000 100000" >"$g/cpu.max"; } 2>/dev/null; then
        kind=none dir="cannot create a group with cpu.max under $dir"
      fi
    elif ! { mkdir "$g" && echo 10000 >"$g/cpu.cfs_period_us" && echo 2500 >"$g/cpu.cfs_quota_us"; } 2>/dev/null; then
      kind=none dir="cannot create a group with cpu.cfs_quota_us under $dir"
    fi
    rmdir "$g" 2>/dev/null || true
  fi
  if [ "$kind" = none ]; then
    echo "netns_hosts: --host_cpus unusable: $dir"
    [ "$want_cpus" = 0 ] || exit 77
  else
    echo "netns_hosts: --host_cpus usable: cgroup $kind quotas under $dir"
  fi
  read -r method why <<<"$(delay_method)"
  case "$method" in
    netem) echo "netns_hosts: --latency usable: tc netem on each host's eth0" ;;
    netdelay) echo "netns_hosts: --latency usable: $NETDELAY (no netem in this kernel)" ;;
    *) echo "netns_hosts: --latency unusable: $why"; [ "$want_latency" = 0 ] || exit 77 ;;
  esac
  return 0
}

cmd_down() {
  check_name "$1"
  local ns pid
  STATE="$STATE_ROOT/$1"
  for ns in $(namespaces_of "$1"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
  done
  for pid in $(group_pids "$1"); do kill -TERM "$pid" 2>/dev/null || true; done
  stop_netdelays "$1"
  # Bounded: up to 5 s for processes to end, then SIGKILL.
  for _ in $(seq 50); do
    local left=0
    for ns in $(namespaces_of "$1"); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || left=1; done
    [ -z "$(group_pids "$1")" ] || left=1
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for pid in $(group_pids "$1"); do kill -KILL "$pid" 2>/dev/null || true; done
  for ns in $(namespaces_of "$1"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  remove_groups "$1"
  rm -rf "${STATE_ROOT:?}/$1"
  [ -z "$(namespaces_of "$1")" ] || die "could not remove all namespaces of $1: $(namespaces_of "$1" | xargs)"
}

shape() {  # shape NAMESPACE DEVICE BYTES_PER_SEC [PARENT]
  # The bucket: 4 ms at full rate (tc-tbf(8): at least rate/HZ, and this kernel's HZ is 250; less and a 1 Gbit link
  # carried 0.90 of its rate), and at least two 64 KB GSO packets. A larger one lets a message through above the
  # rate: with 10 ms, a 13 MB exchange crossed a 10 Gbit link at twice its rate (raw TCP 1.99 of the cap).
  local burst=$(( $3 / 250 ))
  [ "$burst" -ge 131072 ] || burst=131072
  local where=(root)
  [ -z "${4:-}" ] || where=(parent "$4" handle 10:)
  ip netns exec "$1" tc qdisc add dev "$2" "${where[@]}" tbf rate "$(( $3 * 8 ))bit" burst "$burst" latency 100ms
}

cmd_up() {
  local name="$1" n="$2"; shift 2
  check_name "$name"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "bad host count '$n' (1..200)"
  local bandwidth="" subnet="10.77.0" host_cpus="" latency="" period="" a
  for a in "$@"; do
    case "$a" in
      --bandwidth=*) bandwidth="${a#*=}" ;;
      --subnet=*) subnet="${a#*=}" ;;
      --host_cpus=*) host_cpus="${a#*=}" ;;
      --latency=*) latency="${a#*=}" ;;
      --cpu_period_us=*) period="${a#*=}" ;;
      *) die "unknown option '$a' for up (--bandwidth=RATE, --host_cpus=F, --latency=MS, --subnet=A.B.C," \
             "--cpu_period_us=US)" ;;
    esac
  done
  [[ "$subnet" =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "bad --subnet '$subnet' (expected 10.B.C)"
  local bytes=""
  [ -z "$bandwidth" ] || bytes="$(rate_bytes "$bandwidth")"
  local cores
  cores="$(nproc)"
  if [ -n "$host_cpus" ]; then
    [[ "$host_cpus" =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
      die "bad --host_cpus '$host_cpus' (expected a number of cores, e.g. 0.25 or 1)"
    awk -v f="$host_cpus" 'BEGIN { exit !(f >= 0.01) }' ||
      die "--host_cpus=$host_cpus is too small (at least 0.01 of a core)"
    awk -v f="$host_cpus" -v c="$cores" 'BEGIN { exit !(f <= c) }' ||
      die "--host_cpus=$host_cpus is more than the $cores cores of this machine"
    if [ -n "$period" ]; then
      [[ "$period" =~ ^[0-9]+$ ]] && [ "$period" -ge 1000 ] && [ "$period" -le 1000000 ] ||
        die "bad --cpu_period_us '$period' (1000..1000000)"
    else
      # The kernel wants a quota of at least 1 ms: a longer period where F x 10 ms is less.
      period="$(awk -v f="$host_cpus" -v p="$DEFAULT_PERIOD_US" \
                'BEGIN { if (f * p < 1000) p = int(1000 / f + 0.999); print p }')"
    fi
    awk -v f="$host_cpus" -v p="$period" 'BEGIN { exit !(f * p >= 999.5) }' ||
      die "--host_cpus=$host_cpus with --cpu_period_us=$period gives a quota under the kernel's 1000 us minimum"
    awk -v f="$host_cpus" -v n="$n" -v c="$cores" 'BEGIN { exit !(f * n > c) }' &&
      echo "netns_hosts: warning: $n hosts x $host_cpus cores = more than the $cores cores here: busy hosts will" \
           "share cores, not only their quotas" >&2
  elif [ -n "$period" ]; then
    die "--cpu_period_us needs --host_cpus"
  fi
  if [ -n "$latency" ]; then
    [[ "$latency" =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
      die "bad --latency '$latency' (expected milliseconds >= 0, e.g. 5 or 0.5)"
    awk -v l="$latency" 'BEGIN { exit !(l <= 10000) }' || die "--latency=$latency is more than 10000 ms"
    awk -v l="$latency" 'BEGIN { exit !(l > 0) }' || latency=""  # 0: no delay
  fi
  local method="" why=""
  if [ -n "$latency" ]; then
    read -r method why <<<"$(delay_method)"
    [ "$method" != none ] || die "--latency: $why"
  fi
  [ -z "$(namespaces_of "$name")" ] || die "namespaces of '$name' already exist (run: $0 down $name)"
  [ ! -e "$STATE_ROOT/$name" ] || die "state of '$name' already exists in $STATE_ROOT/$name (run: $0 down $name)"
  if [ -n "$host_cpus" ]; then
    local kind dir
    read -r kind dir <<<"$(cgroup_kind)"
    [ "$kind" = none ] || [ ! -e "$(group_of "$name" "$dir")" ] ||
      die "group $(group_of "$name" "$dir") already exists (run: $0 down $name)"
  fi

  # Whatever fails half-way, nothing is left behind.
  trap 'rc=$?; if [ $rc != 0 ]; then cmd_down "$name" >/dev/null 2>&1 || true; fi' EXIT
  STATE="$STATE_ROOT/$name"
  mkdir -p "$STATE"
  {
    echo "hosts=$n"
    echo "bandwidth=${bandwidth:-none}"
    echo "host_cpus=${host_cpus:-none}"
    echo "cpu_period_us=${period:-none}"
    echo "latency_ms=${latency:-0}"
    echo "delay=${method:-none}"
  } >"$STATE/settings"
  [ -z "$host_cpus" ] || make_groups "$name" "$n" "$host_cpus" "$period"
  local sw="$name-sw"
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add name br0 type bridge
  ip -n "$sw" link set br0 up
  for ((k = 0; k < n; k++)); do
    local h="$name-h$k"
    ip netns add "$h"
    ip -n "$h" link set lo up
    ip -n "$sw" link add name "p$k" type veth peer name eth0 netns "$h"
    ip -n "$sw" link set "p$k" master br0
    ip -n "$sw" link set "p$k" up
    ip -n "$h" addr add "$subnet.$((k + 1))/24" dev eth0
    ip -n "$h" link set eth0 up
    if [ "$method" = netem ]; then
      # netem first, the cap as its child (a large limit: a fast link's packets in flight must fit).
      ip netns exec "$h" tc qdisc add dev eth0 root handle 1: netem delay "${latency}ms" limit 1000000
      [ -z "$bytes" ] || shape "$h" eth0 "$bytes" 1:1
    elif [ -n "$bytes" ]; then
      shape "$h" eth0 "$bytes"
    fi
    [ -z "$bytes" ] || shape "$sw" "p$k" "$bytes"
    [ "$method" != netdelay ] || start_netdelay "$name" "$k" "$latency"
  done
  trap - EXIT
  for ((k = 0; k < n; k++)); do echo "$name-h$k $subnet.$((k + 1))"; done
}

cmd_addr() {
  check_name "$1"
  local h="$1-h$2"
  ip netns list | awk '{print $1}' | grep -qx "$h" || die "no host $h (run up first)"
  ip -n "$h" -4 -o addr show dev eth0 | awk '{split($4, a, "/"); print a[1]}'
}

cmd_info() {
  check_name "$1"
  [ -f "$STATE_ROOT/$1/settings" ] || die "no hosts named $1 (run up first)"
  xargs <"$STATE_ROOT/$1/settings"
}

# The MAC address no host has (locally administered): frames sent to it are flooded by the bridge and dropped by
# every host.
NOWHERE_MAC=02:00:5e:00:de:ad

cmd_cut() {  # cut|heal NAME A B
  local op="$1" name="$2" a="$3" b="$4"
  check_name "$name"
  [[ "$a" =~ ^[0-9]+$ && "$b" =~ ^[0-9]+$ && "$a" != "$b" ]] || die "bad host pair '$a' '$b'"
  local addr_a addr_b
  addr_a="$(cmd_addr "$name" "$a")"; addr_b="$(cmd_addr "$name" "$b")"
  if [ "$op" = cut ]; then
    ip -n "$name-h$a" neigh replace "$addr_b" lladdr "$NOWHERE_MAC" nud permanent dev eth0
    ip -n "$name-h$b" neigh replace "$addr_a" lladdr "$NOWHERE_MAC" nud permanent dev eth0
  else
    ip -n "$name-h$a" neigh del "$addr_b" dev eth0 2>/dev/null || true
    ip -n "$name-h$b" neigh del "$addr_a" dev eth0 2>/dev/null || true
  fi
}

cmd_exec() {  # exec NAME K CMD...: into host K's group (if it has one), then its namespace
  local name="$1" k="$2" h="$1-h$2" parent
  shift 2
  ip netns list | awk '{print $1}' | grep -qx "$h" || die "no host $h (run up first)"
  if [ -f "$STATE_ROOT/$name/cgroup" ]; then
    parent="$(cat "$STATE_ROOT/$name/cgroup")"
    [ -d "$parent/h$k" ] || die "no CPU group $parent/h$k for host $h"
    echo $$ >"$parent/h$k/cgroup.procs" || die "cannot move into $parent/h$k"
  fi
  # nsenter enters the network namespace alone; `ip netns exec` would also remount /sys for it, and that sysfs hides
  # /sys/fs/cgroup: a process on the host could not read its own CPU quota (dtrain's --threads=auto, profiles).
  if command -v nsenter >/dev/null && [ -e "/run/netns/$h" ]; then exec nsenter --net="/run/netns/$h" -- "$@"; fi
  exec ip netns exec "$h" "$@"
}

[ $# -ge 1 ] || usage
case "$1" in
  check) shift; cmd_check "$@" ;;
  up) [ $# -ge 3 ] || usage; shift; cmd_up "$@" ;;
  down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
  addr) [ $# -eq 3 ] || usage; cmd_addr "$2" "$3" ;;
  info) [ $# -eq 2 ] || usage; cmd_info "$2" ;;
  cut | heal) [ $# -eq 4 ] || usage; cmd_cut "$@" ;;
  exec)
    [ $# -ge 4 ] || usage
    check_name "$2"
    [[ "$3" =~ ^[0-9]+$ ]] || die "bad host index '$3'"
    shift; cmd_exec "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$1' (check, up, down, exec, addr, info, cut, heal)" ;;
esac
