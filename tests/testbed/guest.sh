#!/usr/bin/env bash
# Runs inside the testbed VM as root: brings up the topology, then the command recorded in
# OUT/command, from the repository, with its output and exit code written to OUT.
#
# Topology (all inside the VM; the VM has no network of its own):
#   veth0 192.168.77.1/24, fd77::1/64  <-- veth pair -->  veth1 192.168.77.2/24
#   veth0.100 (VLAN 100) 192.168.100.1/24
#   rxe0 on veth0, rxe1 on veth1. rxe0's GIDs: 0 link-local, 1 IPv4, 2 IPv6, then the VLAN's.
# Two rxe devices in one network namespace only talk if their traffic really crosses the veth
# pair: by default the kernel routes a packet for its own address through lo, where no rxe
# device listens. Policy routing sends locally generated packets for the other end's address out
# of the own veth (table 77, consulted before the local table); accept_local lets the other
# end take packets whose source address is local too.
set -u
OUT=$1
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cut -d' ' -f1 /proc/uptime > "$OUT/booted"   # first sign of life: the host waits for it
exec 3>"$OUT/setup.log"
log() { echo "testbed: $*" >&3; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
fail() { log "$*"; echo "testbed: $*" > "$OUT/stderr"; echo 1 > "$OUT/rc"; exit 1; }
step() { echo "$(uptime_s) $*" >&3; timeout 60 "$@" >&3 2>&1 || fail "failed: $*"; }

# wait_gid DEVICE GID-SUFFIX: the port is ACTIVE and a GID ending so is in its table (20 s).
wait_gid() {
    local dev=$1 suffix=$2
    for _ in $(seq 200); do
        grep -qs ACTIVE "/sys/class/infiniband/$dev/ports/1/state" \
            && grep -qs "$suffix\$" /sys/class/infiniband/"$dev"/ports/1/gids/* && return 0
        sleep 0.1
    done
    fail "$dev/1 never became ACTIVE with a GID ending $suffix: $(cat "/sys/class/infiniband/$dev/ports/1/state" 2>&1)"
}

# gid_index DEVICE GID-SUFFIX [NETDEV]: the lowest index holding that GID (on that netdev).
gid_index() {
    local dev=$1 suffix=$2 ndev=${3:-} f i
    for f in $(grep -ls "$suffix\$" /sys/class/infiniband/"$dev"/ports/1/gids/* | sort -t/ -k9 -n); do
        i=${f##*/}
        if [ -z "$ndev" ] || [ "$(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/ndevs/$i" 2>/dev/null)" = "$ndev" ]; then
            echo "$i"; return 0
        fi
    done
}

setup() {
    echo "$(uptime_s) modprobe rdma_rxe" >&3
    timeout 60 modprobe rdma_rxe >&3 2>&1 \
        || fail "module rdma_rxe cannot be loaded in the guest (kernel $(uname -r)): see setup.log"
    step modprobe 8021q
    modprobe sch_netem >/dev/null 2>&1 || log "no sch_netem: netem faults will fail"
    # Keep static IPv6 addresses (and their GIDs) across link down/up faults.
    sysctl -qw net.ipv6.conf.default.keep_addr_on_down=1 net.ipv6.conf.all.keep_addr_on_down=1
    step ip link add veth0 type veth peer name veth1
    step ip link add link veth0 name veth0.100 type vlan id 100
    for dev in veth0 veth1 veth0.100; do
        sysctl -qw "net.ipv6.conf.$dev.keep_addr_on_down=1" "net.ipv4.conf.$dev.rp_filter=0" \
            "net.ipv4.conf.$dev.accept_local=1"
    done
    sysctl -qw net.ipv4.conf.all.rp_filter=0
    step ip addr add 192.168.77.1/24 dev veth0
    step ip addr add 192.168.77.2/24 dev veth1
    step ip -6 addr add fd77::1/64 dev veth0 nodad
    step ip addr add 192.168.100.1/24 dev veth0.100
    step ip link set veth0 up
    step ip link set veth1 up
    step ip link set veth0.100 up
    step ip route add 192.168.77.2 dev veth0 src 192.168.77.1 table 77
    step ip route add 192.168.77.1 dev veth1 src 192.168.77.2 table 77
    step ip rule add pref 50 iif lo lookup 77
    step ip rule add pref 100 lookup local
    step ip rule del pref 0 lookup local
    step rdma link add rxe0 type rxe netdev veth0
    step rdma link add rxe1 type rxe netdev veth1
    echo "$(uptime_s) waiting for the GIDs" >&3
    wait_gid rxe0 ffff:c0a8:4d01
    wait_gid rxe0 fd77:0000:0000:0000:0000:0000:0000:0001
    wait_gid rxe0 ffff:c0a8:6401
    wait_gid rxe1 ffff:c0a8:4d02
    echo "$(uptime_s) writing the topology" >&3
    cat > /run/ibtool-testbed.env <<ENV
IBTOOL_TESTBED=1
IBTOOL_TESTBED_INFO=/run/ibtool-testbed.json
HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis
IBTOOL_TB_KERNEL=$(uname -r)
IBTOOL_TB_RELEASE=$(cat "$OUT/release" 2>/dev/null)
IBTOOL_TB_OUT=$OUT
IBTOOL_TB_DEVICE=rxe0
IBTOOL_TB_NETDEV=veth0
IBTOOL_TB_IPV4=192.168.77.1
IBTOOL_TB_IPV4_GID_INDEX=$(gid_index rxe0 ffff:c0a8:4d01 veth0)
IBTOOL_TB_IPV6=fd77::1
IBTOOL_TB_IPV6_GID_INDEX=$(gid_index rxe0 fd77:0000:0000:0000:0000:0000:0000:0001 veth0)
IBTOOL_TB_VLAN_NETDEV=veth0.100
IBTOOL_TB_VLAN_ID=100
IBTOOL_TB_VLAN_IPV4=192.168.100.1
IBTOOL_TB_VLAN_GID_INDEX=$(gid_index rxe0 ffff:c0a8:6401 veth0.100)
IBTOOL_TB_PEER_DEVICE=rxe1
IBTOOL_TB_PEER_NETDEV=veth1
IBTOOL_TB_PEER_IPV4=192.168.77.2
IBTOOL_TB_PEER_IPV4_GID_INDEX=$(gid_index rxe1 ffff:c0a8:4d02 veth1)
ENV
    /usr/bin/python3 - /run/ibtool-testbed.env /run/ibtool-testbed.json "$OUT/topology.json" <<'PY'
import json, sys
env = dict(line.split("=", 1) for line in open(sys.argv[1]).read().splitlines() if "=" in line)
info = {k[len("IBTOOL_TB_"):].lower(): v for k, v in env.items() if k.startswith("IBTOOL_TB_")}
for path in sys.argv[2:]:
    with open(path, "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
PY
    log "topology up after $(uptime_s) s of uptime: rxe0 on veth0 (192.168.77.1, fd77::1, VLAN veth0.100 192.168.100.1), rxe1 on veth1 (192.168.77.2)"
}

setup
set -a
# shellcheck disable=SC1091
. /run/ibtool-testbed.env
set +a
cd "$REPO" || fail "no repository at $REPO"
budget=$(cat "$OUT/command-timeout" 2>/dev/null || echo 600)
eval "timeout -k 10 $budget $(cat "$OUT/command")" > "$OUT/stdout" 2> "$OUT/stderr"
rc=$?
[ $rc -eq 124 ] && echo "testbed: the command ran out of its ${budget} s" >> "$OUT/stderr"
log "command exit $rc after $(uptime_s) s of uptime"
echo $rc > "$OUT/rc"
