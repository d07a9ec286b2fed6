#!/usr/bin/env bash
# Runs inside the testbed VM as root: brings up the topology, then the command recorded in
# OUT/command, from the repository, with its output and exit code written to OUT.
#
# Topology: veth0 <-> veth1; veth0 has 192.168.77.1/24 and fd77::1/64; VLAN veth0.100 has
# 192.168.100.1/24; rxe0 on veth0. GID 0 is veth0's link-local, 1 its IPv4 (RoCE v2).
set -u
OUT=$1
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
exec 3>"$OUT/setup.log"
log() { echo "testbed: $*" >&3; }
fail() { log "$*"; echo 1 > "$OUT/rc"; echo "testbed: $*" > "$OUT/stderr"; exit 1; }

setup() {
    modprobe rdma_rxe || fail "module rdma_rxe cannot be loaded"
    ip link add veth0 type veth peer name veth1 || fail "cannot create veth0"
    ip addr add 192.168.77.1/24 dev veth0
    ip -6 addr add fd77::1/64 dev veth0 nodad
    ip link set veth0 up && ip link set veth1 up
    modprobe 8021q 2>/dev/null
    ip link add link veth0 name veth0.100 type vlan id 100 || fail "cannot create veth0.100"
    ip addr add 192.168.100.1/24 dev veth0.100
    ip link set veth0.100 up
    rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0 failed"
    local gid=/sys/class/infiniband/rxe0/ports/1/gids/1
    for _ in $(seq 100); do
        grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null \
            && grep -q ffff:c0a8:4d01 "$gid" 2>/dev/null && break
        sleep 0.1
    done
    grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state || fail "rxe0/1 never became ACTIVE"
    cat > /run/ibtool-testbed.env <<ENV
export IBTOOL_TESTBED=1
export IBTOOL_TB_DEVICE=rxe0
export IBTOOL_TB_NETDEV=veth0
export IBTOOL_TB_PEER_NETDEV=veth1
export IBTOOL_TB_IPV4=192.168.77.1
export IBTOOL_TB_IPV6=fd77::1
export IBTOOL_TB_VLAN_NETDEV=veth0.100
export IBTOOL_TB_VLAN_ID=100
export IBTOOL_TB_VLAN_IPV4=192.168.100.1
export IBTOOL_TB_OUT=$OUT
ENV
    log "topology up: rxe0 on veth0 (192.168.77.1, fd77::1), VLAN veth0.100 (192.168.100.1)"
}

setup
# shellcheck disable=SC1091
. /run/ibtool-testbed.env
cd "$REPO" || fail "no repository at $REPO"
eval "$(cat "$OUT/command")" > "$OUT/stdout" 2> "$OUT/stderr"
echo $? > "$OUT/rc"
