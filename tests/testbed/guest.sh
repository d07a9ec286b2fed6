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
#
# Pair mode (`testbed pair`, ROLE runner or peer): two guests, each with its own kernel, whose
# virtio-net NICs share one QEMU link; one rxe0 on each NIC (setup_pair below).
set -u
OUT=$1
ROLE=${2:-single}
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

# write_topology ENV-FILE: /run/ibtool-testbed.json and OUT/topology.json from the env file.
write_topology() {
    /usr/bin/python3 - "$1" /run/ibtool-testbed.json "$OUT/topology.json" <<'PY'
import json, sys
env = dict(line.split("=", 1) for line in open(sys.argv[1]).read().splitlines() if "=" in line)
env = {k: v[1:-1] if len(v) > 1 and v[0] == v[-1] == '"' else v for k, v in env.items()}
info = {k[len("IBTOOL_TB_"):].lower(): v for k, v in env.items() if k.startswith("IBTOOL_TB_")}
for path in sys.argv[2:]:
    with open(path, "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
PY
}

setup() {
    # A home that takes writes, as a host's does: ibtool keeps its plugins' cache there
    # (~/.cache/ibtool), else every start in the guest reads all the distributions' metadata.
    writable_root
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
    write_topology /run/ibtool-testbed.env
    log "topology up after $(uptime_s) s of uptime: rxe0 on veth0 (192.168.77.1, fd77::1, VLAN veth0.100 192.168.100.1), rxe1 on veth1 (192.168.77.2)"
}

# -- pair mode -------------------------------------------------------------------------------
# runner (guest A): 10.77.0.1/24, fd77:1::1/64; peer (guest B): 10.77.0.2/24, fd77:1::2/64; each
# rxe0 on its virtio-net NIC (found by the MAC the host gave it, OUT/mac). The peer runs dropbear
# for root (the client key's public half in OUT/authorized_keys, written by the host per run) and
# writes its topology to its OUT (OUT/peer on the host: the runner reads it there, as
# OUT/peer/topology.json); the runner waits for it, opens an ssh master connection to it and
# exports both sides' facts. The peer's command is to wait: the host ends its VM when the
# runner's command is done.

# writable_root: /root as an overlay on a tmpfs upper layer. virtme-ng mounts /etc, /var, /tmp,
# /home, ... as overlays, not /root (measured: `touch /root/x` fails, read-only file system);
# ssh and dropbear read ~root/.ssh.
writable_root() {
    mkdir -p /run/ibtool-root/upper /run/ibtool-root/work
    step mount -t overlay ibtool-root -o lowerdir=/root,upperdir=/run/ibtool-root/upper,workdir=/run/ibtool-root/work /root
    mkdir -p /root/.ssh
    chmod 700 /root /root/.ssh
    # bash sources ~/.bashrc for every command sshd runs (bash(1), INVOCATION: "run by the remote
    # shell daemon"); the host's own (here: pyenv init) cost seconds per command under TCG and
    # put its shims first in PATH. The guest's is empty.
    : > /root/.bashrc
}

nic_by_mac() {
    local f
    for _ in $(seq 200); do
        for f in /sys/class/net/*/address; do
            [ "$(cat "$f")" = "$1" ] && { basename "$(dirname "$f")"; return 0; }
        done
        sleep 0.1
    done
    return 1
}

# fabric_rxe NIC K: node K's fabric address on NIC (10.77.0.K/24, fd77:1::K/64), NIC up, rxe0 on
# it, and both its GIDs in the table (the two-host and the mesh guests alike).
fabric_rxe() {
    local nic=$1 me=$2
    step ip addr add "10.77.0.$me/24" dev "$nic"
    step ip -6 addr add "fd77:1::$me/64" dev "$nic" nodad
    step ip link set "$nic" up
    step rdma link add rxe0 type rxe netdev "$nic"
    echo "$(uptime_s) waiting for the GIDs" >&3
    wait_gid rxe0 "ffff:0a4d:000$me"
    wait_gid rxe0 "fd77:0001:0000:0000:0000:0000:0000:000$me"
}

setup_pair() {
    local me other ip6 ip6_gid nic mac
    case $ROLE in
        runner) me=1; other=2 ;;
        peer) me=2; other=1 ;;
        *) fail "unknown role $ROLE" ;;
    esac
    mac=$(cat "$OUT/mac")
    ip6=fd77:1::$me
    ip6_gid=fd77:0001:0000:0000:0000:0000:0000:000$me
    echo "$(uptime_s) modprobe virtio_net rdma_rxe" >&3
    timeout 60 modprobe virtio_net >&3 2>&1 || fail "module virtio_net cannot be loaded in the guest"
    timeout 60 modprobe rdma_rxe >&3 2>&1 \
        || fail "module rdma_rxe cannot be loaded in the guest (kernel $(uname -r)): see setup.log"
    # What rdma-core's rdma-load-modules@rdma.service loads on a RoCE host (kernel-boot/
    # modules/rdma.conf): rdma_ucm, which librdmacm needs; ibtool doctor checks for it.
    timeout 60 modprobe rdma_ucm >&3 2>&1 || fail "module rdma_ucm cannot be loaded in the guest"
    nic=$(nic_by_mac "$mac") \
        || fail "no NIC with MAC $mac: $(cat /sys/class/net/*/address | tr '\n' ' ')"
    sysctl -qw "net.ipv6.conf.$nic.keep_addr_on_down=1" net.ipv6.conf.default.keep_addr_on_down=1
    fabric_rxe "$nic" "$me"
    writable_root
    cat > /run/ibtool-testbed.env <<ENV
IBTOOL_TESTBED=1
IBTOOL_TESTBED_INFO=/run/ibtool-testbed.json
HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis
IBTOOL_TB_PAIR=1
IBTOOL_TB_ROLE=$ROLE
IBTOOL_TB_KERNEL=$(uname -r)
IBTOOL_TB_RELEASE=$(cat "$OUT/release" 2>/dev/null)
IBTOOL_TB_OUT=$OUT
IBTOOL_TB_REPO=$REPO
IBTOOL_TB_RDMA_CORE=$(dpkg-query -W -f='${Version}' rdma-core 2>/dev/null)
IBTOOL_TB_DEVICE=rxe0
IBTOOL_TB_NETDEV=$nic
IBTOOL_TB_IPV4=10.77.0.$me
IBTOOL_TB_IPV4_GID_INDEX=$(gid_index rxe0 "ffff:0a4d:000$me" "$nic")
IBTOOL_TB_IPV6=$ip6
IBTOOL_TB_IPV6_GID_INDEX=$(gid_index rxe0 "$ip6_gid" "$nic")
IBTOOL_TB_PEER_HOST=10.77.0.$other
ENV
    if [ "$ROLE" = peer ]; then
        # dropbear (dropbear-bin): no service of its own. -R makes the host keys on first use
        # (into /etc/dropbear, an overlay here), -s refuses passwords, -F stays in the
        # foreground (setsid detaches it from this script), -E logs to stderr.
        install -m 600 "$OUT/authorized_keys" /root/.ssh/authorized_keys \
            || fail "no client key in $OUT/authorized_keys"
        mkdir -p /etc/dropbear
        echo "$(uptime_s) dropbear -R -F -E -s -p 10.77.0.2:22" >&3
        setsid dropbear -R -F -E -s -p 10.77.0.2:22 </dev/null >>"$OUT/dropbear.log" 2>&1 &
        for _ in $(seq 200); do
            grep -q ':0016 00000000:0000 0A' /proc/net/tcp && break   # 0x16 = 22, 0A = LISTEN
            sleep 0.1
        done
        grep -q ':0016 00000000:0000 0A' /proc/net/tcp || fail "dropbear did not listen: $(cat "$OUT/dropbear.log")"
        write_topology /run/ibtool-testbed.env
        touch "$OUT/ready"   # after the topology: the runner waits for this, then reads it
        log "peer up after $(uptime_s) s of uptime: rxe0 on $nic (10.77.0.2, $ip6), dropbear on :22"
        return 0
    fi
    # The runner: the peer's facts (its OUT is OUT/peer here), then ssh to it.
    local peer_topo=$OUT/peer/topology.json waited=0 peer_budget
    peer_budget=$(cat "$OUT/peer-timeout" 2>/dev/null || echo 300)
    echo "$(uptime_s) waiting for the peer ($OUT/peer/ready, up to $peer_budget s)" >&3
    until [ -f "$OUT/peer/ready" ]; do
        [ "$waited" -ge $((peer_budget * 10)) ] && fail "the peer did not come up within $peer_budget s (see $OUT/peer/setup.log)"
        sleep 0.1
        waited=$((waited + 1))
    done
    /usr/bin/python3 - "$peer_topo" >> /run/ibtool-testbed.env <<'PY' || fail "unreadable $peer_topo"
import json, sys
peer = json.load(open(sys.argv[1]))
for key in ("device", "netdev", "ipv4", "ipv4_gid_index", "ipv6", "ipv6_gid_index", "kernel",
            "release", "repo", "rdma_core"):
    print(f"IBTOOL_TB_PEER_{key.upper()}={peer.get(key, '')}")
PY
    install -m 600 "$OUT/ssh/id" /root/.ssh/id_ed25519 || fail "no client key in $OUT/ssh/id"
    # `ssh peer CMD`: a master connection opened here, which every later ssh reuses (under TCG a
    # new connection's key exchange takes seconds). ControlMaster=no in the config: a client
    # that became a master itself would keep its caller's pipes open in the background.
    mkdir -p /run/ibtool-ssh
    cat > /root/.ssh/config <<SSH
Host peer 10.77.0.$other
    HostName 10.77.0.$other
    User root
    IdentityFile /root/.ssh/id_ed25519
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    BatchMode yes
    LogLevel ERROR
    ConnectTimeout 30
    ControlMaster no
    ControlPath /run/ibtool-ssh/%C
SSH
    echo "$(uptime_s) ssh master connection to the peer" >&3
    timeout 120 ssh -o ControlMaster=yes -o ControlPersist=yes -f -N peer </dev/null >&3 2>&1 \
        || fail "ssh to the peer failed (see $OUT/setup.log, $OUT/peer/dropbear.log)"
    step ssh peer true
    write_topology /run/ibtool-testbed.env
    log "runner up after $(uptime_s) s of uptime: rxe0 on $nic (10.77.0.1, $ip6); peer 10.77.0.2 kernel $(sed -n 's/^IBTOOL_TB_PEER_KERNEL=//p' /run/ibtool-testbed.env)"
}

# -- mesh mode -------------------------------------------------------------------------------
# ROLE meshK: node K of N (OUT/nodes) on one shared Ethernet segment (QEMU multicast dgram,
# tests/testbed/testbed boot_mesh): hostname nodeK, 10.77.0.K/24 and fd77:1::K/64 on the
# fabric NIC with MAC 52:54:00:77:00:0K (OUT/mac), rxe0 on it, every node in /etc/hosts
# (nodeK: 10.77.0.K and fd77:1::K), 10.78.0.K/24 on the management NIC (MAC
# 52:54:00:78:00:0K, OUT/mgmt-mac; `ssh nodeK` goes there, see /root/.ssh/config), dropbear
# for root with the run's key (OUT/ssh/id, its private half on every node: any node reaches
# any other, and itself, as `ssh nodeJ`), the run's munge key installed (Slurm's daemons are
# started by the tests: tests/integration/mesh_slurm.py), `ibtool` on PATH
# (/usr/local/bin/ibtool runs the checkout's with the testbed environment). Each node writes
# its topology to its OUT and touches OUT/ready; node1 (whose OUT holds node2..nodeN's as
# OUT/nodeK) waits for all of them and opens an ssh master connection to every node.
# Everything written outside /run stays inside the guest: /etc/hosts, /etc/hostname and
# /usr/local/bin are bind mounts or overlays on the guest's tmpfs.

# writable_dir DIR: DIR as an overlay on a tmpfs upper layer (the guest sees the host's files
# read-only there).
writable_dir() {
    local name
    name=$(echo "$1" | tr / _)
    mkdir -p "/run/ibtool-overlay/$name/upper" "/run/ibtool-overlay/$name/work"
    step mount -t overlay "ibtool$name" -o "lowerdir=$1,upperdir=/run/ibtool-overlay/$name/upper,workdir=/run/ibtool-overlay/$name/work" "$1"
}

# nic_by_mac MAC: the name of the NIC with that address (waits up to 20 s for virtio_net).
setup_mesh() {
    local me=${ROLE#mesh} n mac nic mgmt k ip6_gid
    n=$(cat "$OUT/nodes")
    mac=$(cat "$OUT/mac")
    ip6_gid=fd77:0001:0000:0000:0000:0000:0000:000$me
    echo "$(uptime_s) modprobe virtio_net rdma_rxe rdma_ucm sch_netem nf_tables" >&3
    timeout 60 modprobe virtio_net >&3 2>&1 || fail "module virtio_net cannot be loaded in the guest"
    timeout 60 modprobe rdma_rxe >&3 2>&1 \
        || fail "module rdma_rxe cannot be loaded in the guest (kernel $(uname -r)): see setup.log"
    timeout 60 modprobe rdma_ucm >&3 2>&1 || fail "module rdma_ucm cannot be loaded in the guest"
    step modprobe sch_netem
    step modprobe nf_tables
    step hostname "node$me"
    echo "node$me" > /run/ibtool-hostname
    step mount --bind /run/ibtool-hostname /etc/hostname
    {
        printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n'
        for k in $(seq "$n"); do printf '10.77.0.%s node%s\n' "$k" "$k"; done
        for k in $(seq "$n"); do printf 'fd77:1::%s node%s\n' "$k" "$k"; done
    } > /run/ibtool-hosts
    step mount --bind /run/ibtool-hosts /etc/hosts
    nic=$(nic_by_mac "$mac") || fail "no NIC with MAC $mac: $(cat /sys/class/net/*/address | tr '\n' ' ')"
    mgmt=$(nic_by_mac "$(cat "$OUT/mgmt-mac")") || fail "no management NIC with MAC $(cat "$OUT/mgmt-mac")"
    sysctl -qw "net.ipv6.conf.$mgmt.disable_ipv6=1"
    step ip addr add "10.78.0.$me/24" dev "$mgmt"
    step ip link set "$mgmt" up
    # accept_dad=0: the segment echoes every frame to its sender too (multicast loop), and a
    # node's own neighbour solicitation coming back would fail its link-local address's DAD.
    sysctl -qw "net.ipv6.conf.$nic.keep_addr_on_down=1" net.ipv6.conf.default.keep_addr_on_down=1 \
        "net.ipv6.conf.$nic.accept_dad=0"
    fabric_rxe "$nic" "$me"
    step nft list ruleset
    writable_root
    writable_dir /usr/local/bin
    install -m 600 "$OUT/ssh/id" /root/.ssh/id_ed25519 || fail "no client key in $OUT/ssh/id"
    install -m 600 "$OUT/ssh/id.pub" /root/.ssh/authorized_keys || fail "no public key in $OUT/ssh/id.pub"
    # The run's munge key (Slurm across the nodes: one key on all of them).
    if getent passwd munge >/dev/null; then   # not in a --release root
        mkdir -p /etc/munge
        install -o munge -g munge -m 400 "$OUT/ssh/munge.key" /etc/munge/munge.key \
            || fail "cannot install the munge key"
    fi
    # Any node to any (itself too): the first ssh to a node becomes the master connection the
    # next ones reuse (ControlPersist keeps it open in the background, its stdin, stdout and
    # stderr on /dev/null, so a caller reading its pipes is not held up by it).
    mkdir -p /run/ibtool-ssh
    for k in $(seq "$n"); do printf 'Host node%s\n    HostName 10.78.0.%s\n' "$k" "$k"; done > /root/.ssh/config
    cat >> /root/.ssh/config <<SSH
Host node* 10.77.0.* 10.78.0.* fd77:1::*
    User root
    IdentityFile /root/.ssh/id_ed25519
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    BatchMode yes
    LogLevel ERROR
    ConnectTimeout 30
    ControlMaster auto
    ControlPersist yes
    ControlPath /run/ibtool-ssh/%C
SSH
    cat > /run/ibtool-testbed.env <<ENV
IBTOOL_TESTBED=1
IBTOOL_TESTBED_INFO=/run/ibtool-testbed.json
HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis
IBTOOL_TB_MESH=1
IBTOOL_TB_NODES="$(seq -f 'node%g' -s ' ' "$n")"
IBTOOL_TB_NODE=node$me
IBTOOL_TB_ROLE=$([ "$me" -eq 1 ] && echo runner || echo node)
IBTOOL_TB_KERNEL=$(uname -r)
IBTOOL_TB_RELEASE=$(cat "$OUT/release" 2>/dev/null)
IBTOOL_TB_OUT=$OUT
IBTOOL_TB_REPO=$REPO
IBTOOL_TB_RDMA_CORE=$(dpkg-query -W -f='${Version}' rdma-core 2>/dev/null)
IBTOOL_TB_DEVICE=rxe0
IBTOOL_TB_NETDEV=$nic
IBTOOL_TB_MAC=$mac
IBTOOL_TB_IPV4=10.77.0.$me
IBTOOL_TB_IPV4_GID_INDEX=$(gid_index rxe0 "ffff:0a4d:000$me" "$nic")
IBTOOL_TB_GID_INDEX=$(gid_index rxe0 "ffff:0a4d:000$me" "$nic")
IBTOOL_TB_IPV6=fd77:1::$me
IBTOOL_TB_IPV6_GID_INDEX=$(gid_index rxe0 "$ip6_gid" "$nic")
IBTOOL_TB_MGMT_NETDEV=$mgmt
IBTOOL_TB_MGMT_IPV4=10.78.0.$me
ENV
    # `ibtool` for non-interactive ssh commands (ClusterShell, the tests): the checkout's, with
    # the testbed environment, as commands on the pair's peer run. dropbear's PATH for root
    # (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin) finds it.
    cat > /usr/local/bin/ibtool <<SH
#!/bin/sh
set -a
. /run/ibtool-testbed.env
set +a
exec $REPO/.venv/bin/python -m ibtool "\$@"
SH
    chmod 755 /usr/local/bin/ibtool
    mkdir -p /etc/dropbear
    echo "$(uptime_s) dropbear -R -F -E -s -p 10.78.0.$me:22 -p 10.77.0.$me:22 -p [fd77:1::$me]:22" >&3
    setsid dropbear -R -F -E -s -p "10.78.0.$me:22" -p "10.77.0.$me:22" -p "[fd77:1::$me]:22" \
        </dev/null >>"$OUT/dropbear.log" 2>&1 &
    for _ in $(seq 200); do
        grep -q ':0016 00000000:0000 0A' /proc/net/tcp && break   # 0x16 = 22, 0A = LISTEN
        sleep 0.1
    done
    grep -q ':0016 00000000:0000 0A' /proc/net/tcp || fail "dropbear did not listen: $(cat "$OUT/dropbear.log")"
    # node1's topology is written once the mesh is up: the host reports the mesh ready then.
    [ "$me" -eq 1 ] || write_topology /run/ibtool-testbed.env
    touch "$OUT/ready"
    log "node$me up after $(uptime_s) s of uptime: rxe0 on $nic (10.77.0.$me, fd77:1::$me), management $mgmt 10.78.0.$me, dropbear on :22"
    [ "$me" -eq 1 ] || return 0
    # node1: every other node set up, then a master connection to each (itself included).
    local waited=0 budget
    budget=$(cat "$OUT/peer-timeout" 2>/dev/null || echo 300)
    echo "$(uptime_s) waiting for node2..node$n ($OUT/nodeK/ready, up to $budget s)" >&3
    for k in $(seq 2 "$n"); do
        until [ -f "$OUT/node$k/ready" ]; do
            [ "$waited" -ge $((budget * 10)) ] && fail "node$k did not come up within $budget s (see $OUT/node$k/setup.log)"
            sleep 0.1
            waited=$((waited + 1))
        done
    done
    for k in $(seq "$n"); do
        echo "$(uptime_s) ssh master connection to node$k" >&3
        timeout 120 ssh -o ControlMaster=yes -o ControlPersist=yes -f -N "node$k" </dev/null >&3 2>&1 \
            || fail "ssh to node$k failed (see $OUT/setup.log, $OUT/node$k/dropbear.log)"
        [ "$(timeout 60 ssh "node$k" hostname 2>&3)" = "node$k" ] || fail "ssh node$k hostname did not answer node$k"
    done
    write_topology /run/ibtool-testbed.env
    log "mesh of $n nodes up after $(uptime_s) s of uptime"
}

case $ROLE in
    single) setup ;;
    mesh*) setup_mesh ;;
    *) setup_pair ;;
esac
if [ "$ROLE" = peer ] || { [ "${ROLE#mesh}" != "$ROLE" ] && [ "$ROLE" != mesh1 ]; }; then
    # Serve until the host ends this VM (after the runner's command), within the VM's bound.
    sleep "$(cat "$OUT/command-timeout" 2>/dev/null || echo 600)"
    exit 0
fi
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
