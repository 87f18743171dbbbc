#!/usr/bin/env bash
# Emulated hosts on one machine: N network namespaces ("hosts") with one interface each (eth0, 10.x address),
# cabled to a bridge that lives in its own namespace (the "switch"), so nothing is added to the caller's network
# namespace. Optionally every link is capped in both directions with `tc tbf` (like a NIC of that speed: each
# host's upload at its eth0, its download at its switch port). Needs root and a kernel with network namespaces,
# veth, bridge (and sch_tbf for --bandwidth).
#
#   scripts/netns_hosts.sh check                      # exit 0 if usable here, else print why and exit 77
#   scripts/netns_hosts.sh up NAME N [--bandwidth=1gbit] [--subnet=10.77.0]
#                                                    # prints "NAME-hK ADDRESS" for K = 0..N-1
#   scripts/netns_hosts.sh exec NAME K CMD [ARGS...]  # runs CMD on host K (ip netns exec NAME-hK)
#   scripts/netns_hosts.sh addr NAME K                # prints host K's address
#   scripts/netns_hosts.sh down NAME                  # removes every namespace of NAME (idempotent)
#   scripts/netns_hosts.sh cut NAME A B               # partitions hosts A and B from each other (both ways)
#   scripts/netns_hosts.sh heal NAME A B              # ends that partition
#
# `cut` is a network partition between two hosts only (each still reaches every other host): their frames to
# each other silently vanish, as on a failed link, and TCP sees no error, only silence (its retransmissions
# resume when the link is healed). It gives each host a permanent neighbour (ARP) entry for the other's address
# pointing to a MAC address no host has; `heal` deletes both entries, so the hosts resolve each other again.
#
# Host K has address SUBNET.(K+1)/24. NAME (letters, digits, '.', '_', '-'; at most 40) keeps clusters apart:
# pick a unique one (e.g. with $$) when several may run at once. `down` also ends processes still running in
# NAME's namespaces (by pid, from `ip netns pids`), so that the namespaces really go away.
set -euo pipefail

die() { echo "netns_hosts: $*" >&2; exit 2; }

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

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

cmd_check() {
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
  return 0
}

cmd_down() {
  check_name "$1"
  local ns pid
  for ns in $(namespaces_of "$1"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
  done
  # Bounded: up to 5 s for processes to end, then SIGKILL.
  for _ in $(seq 50); do
    local left=0
    for ns in $(namespaces_of "$1"); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for ns in $(namespaces_of "$1"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  [ -z "$(namespaces_of "$1")" ] || die "could not remove all namespaces of $1: $(namespaces_of "$1" | xargs)"
}

shape() {  # shape NAMESPACE DEVICE BYTES_PER_SEC
  local burst=$(( $3 / 100 ))  # 10 ms at full rate, and at least one 64 KB GSO packet
  [ "$burst" -ge 131072 ] || burst=131072
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$(( $3 * 8 ))bit" burst "$burst" latency 100ms
}

cmd_up() {
  local name="$1" n="$2"; shift 2
  check_name "$name"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "bad host count '$n' (1..200)"
  local bandwidth="" subnet="10.77.0"
  for a in "$@"; do
    case "$a" in
      --bandwidth=*) bandwidth="${a#*=}" ;;
      --subnet=*) subnet="${a#*=}" ;;
      *) die "unknown option '$a' for up (--bandwidth=RATE, --subnet=A.B.C)" ;;
    esac
  done
  [[ "$subnet" =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "bad --subnet '$subnet' (expected 10.B.C)"
  local bytes=""
  [ -z "$bandwidth" ] || bytes="$(rate_bytes "$bandwidth")"
  [ -z "$(namespaces_of "$name")" ] || die "namespaces of '$name' already exist (run: $0 down $name)"

  # Whatever fails half-way, nothing is left behind.
  trap 'rc=$?; if [ $rc != 0 ]; then cmd_down "$name" >/dev/null 2>&1 || true; fi' EXIT
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
    if [ -n "$bytes" ]; then
      shape "$h" eth0 "$bytes"
      shape "$sw" "p$k" "$bytes"
    fi
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

[ $# -ge 1 ] || usage
case "$1" in
  check) cmd_check ;;
  up) [ $# -ge 3 ] || usage; shift; cmd_up "$@" ;;
  down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
  addr) [ $# -eq 3 ] || usage; cmd_addr "$2" "$3" ;;
  cut | heal) [ $# -eq 4 ] || usage; cmd_cut "$@" ;;
  exec)
    [ $# -ge 4 ] || usage
    check_name "$2"
    [[ "$3" =~ ^[0-9]+$ ]] || die "bad host index '$3'"
    h="$2-h$3"; shift 3
    ip netns list | awk '{print $1}' | grep -qx "$h" || die "no host $h (run up first)"
    exec ip netns exec "$h" "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$1' (check, up, down, exec, addr, cut, heal)" ;;
esac
