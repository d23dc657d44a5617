#!/usr/bin/env bash
# A test host for egress tests: a network namespace joined to the host by a
# veth pair, 10.213.N.1/30 on the host side and 10.213.N.2 inside.
#   scripts/test-host.sh up NAME N [NET]
#                                      create it (N: 1..250, unique per run);
#                                      NET (e.g. 198.51.100) puts it on NET.1/30
#                                      and NET.2 instead of 10.213.N
#   scripts/test-host.sh down NAME     remove it (and everything running in it)
# Run servers in it with `ip netns exec NAME ...`. Needs root (ip netns).
set -euo pipefail
cmd=${1:-}; name=${2:-}
[ -n "$cmd" ] && [ -n "$name" ] || { echo "usage: $0 up NAME N [NET] | down NAME" >&2; exit 2; }
case "$cmd" in
  up)
    n=${3:?N (1..250) is required}
    net=${4:-10.213.$n}
    ip netns add "$name"
    ip link add "${name:0:10}-h" type veth peer name "${name:0:10}-n"
    ip link set "${name:0:10}-n" netns "$name"
    ip addr add "$net.1/30" dev "${name:0:10}-h"
    ip link set "${name:0:10}-h" up
    ip -n "$name" addr add "$net.2/30" dev "${name:0:10}-n"
    ip -n "$name" link set "${name:0:10}-n" up
    ip -n "$name" link set lo up
    ;;
  down)
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip link del "${name:0:10}-h" 2>/dev/null || true
    ip netns del "$name" 2>/dev/null || true
    ;;
  *) echo "usage: $0 up NAME N | down NAME" >&2; exit 2 ;;
esac
