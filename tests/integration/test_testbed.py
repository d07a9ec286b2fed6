"""The testbed itself: the topology the other integration tests rely on is really there, the data
path works (on one device and across the veth pair), and every fault fixture restores it."""

from __future__ import annotations

import errno
import ipaddress
import json
import subprocess

import pytest

from tests.integration import faults

pytestmark = pytest.mark.integration


def counter(device: str, name: str) -> int:
    with open(f"{faults.SYS}/{device}/ports/1/hw_counters/{name}") as f:
        return int(f.read())


def listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def server_client(server: list[str], client: list[str], port: int, timeout: float = 120):
    """Run a perftest-style server, then its client against 127.0.0.1; both must succeed."""
    srv = subprocess.Popen(
        [*server, "-p", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        faults.wait_for(lambda: srv.poll() is not None or listening(port), f"{server[0]} listening")
        assert srv.poll() is None, srv.stdout.read()
        cli = subprocess.run(
            [*client, "-p", str(port), "127.0.0.1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        srv_out = srv.communicate(timeout=timeout)[0]
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0, f"client:\n{cli.stdout}\nserver:\n{srv_out}"
    assert srv.returncode == 0, f"server:\n{srv_out}"
    return cli.stdout, srv_out


def test_topology_is_described(testbed):
    for key in ("device", "netdev", "ipv4", "ipv4_gid_index", "ipv6", "vlan_netdev", "vlan_id"):
        assert testbed.get(key), key
    assert testbed["kernel"].startswith("6.")


def test_rxe_ports_active_per_rdma_link(testbed):
    links = {
        (link["ifname"], link["port"]): link
        for link in json.loads(faults.sh("rdma", "-j", "link", "show"))
    }
    for dev, netdev in faults.devices(testbed).items():
        link = links[(dev, 1)]
        assert (link["state"], link["physical_state"], link["netdev"]) == (
            "ACTIVE",
            "LINK_UP",
            netdev,
        )


def test_ibv_devinfo_sees_the_port_active(testbed):
    out = faults.sh("ibv_devinfo", "-d", testbed["device"])
    assert f"hca_id:\t{testbed['device']}" in out
    assert "PORT_ACTIVE" in out and "link_layer:\t\tEthernet" in out


def test_gid_table_holds_ipv4_ipv6_and_vlan_gids(testbed):
    table = faults.gid_table(testbed["device"])
    assert table[int(testbed["ipv4_gid_index"])] == (
        faults.ipv4_gid(testbed["ipv4"]),
        "RoCE v2",
        testbed["netdev"],
    )
    assert table[int(testbed["ipv6_gid_index"])] == (
        ipaddress.IPv6Address(testbed["ipv6"]).exploded,
        "RoCE v2",
        testbed["netdev"],
    )
    assert table[int(testbed["vlan_gid_index"])] == (
        faults.ipv4_gid(testbed["vlan_ipv4"]),
        "RoCE v2",
        testbed["vlan_netdev"],
    )
    assert {gid_type for _, gid_type, _ in table.values()} == {"RoCE v2"}  # rxe: v2 only
    if testbed.get("peer_device"):
        peer = faults.gid_table(testbed["peer_device"])
        assert peer[int(testbed["peer_ipv4_gid_index"])][0] == faults.ipv4_gid(testbed["peer_ipv4"])


def test_empty_gid_slot_attributes_fail_with_einval(testbed):
    """What real sysfs does, and what the captured fixture tree reproduces."""
    empty = max(faults.gid_table(testbed["device"])) + 1
    with pytest.raises(OSError) as e:
        open(f"{faults.SYS}/{testbed['device']}/ports/1/gid_attrs/types/{empty}").read()
    assert e.value.errno == errno.EINVAL


def test_ib_write_bw_between_two_processes_on_rxe0(testbed):
    idx = testbed["ipv4_gid_index"]
    cmd = ["ib_write_bw", "-d", testbed["device"], "-x", idx, "-n", "200"]
    client, _ = server_client(cmd, cmd, 18701)
    assert "BW average" in client


def test_ib_write_bw_across_the_veth_pair(testbed):
    if not testbed.get("peer_device"):
        pytest.skip("no second rxe device in this testbed")
    before = counter(testbed["peer_device"], "rcvd_pkts")
    server = ["ib_write_bw", "-d", testbed["peer_device"], "-x", testbed["peer_ipv4_gid_index"]]
    client = ["ib_write_bw", "-d", testbed["device"], "-x", testbed["ipv4_gid_index"]]
    out, _ = server_client([*server, "-n", "200"], [*client, "-n", "200"], 18702)
    assert "BW average" in out
    # 200 x 64 KiB at MTU 1024: the peer's driver received the packets, not a loopback shortcut.
    assert counter(testbed["peer_device"], "rcvd_pkts") - before >= 200 * 64


def test_ibv_rc_pingpong_across_the_veth_pair(testbed):
    if not testbed.get("peer_device"):
        pytest.skip("no second rxe device in this testbed")
    server = ["ibv_rc_pingpong", "-d", testbed["peer_device"], "-g", testbed["peer_ipv4_gid_index"]]
    client = ["ibv_rc_pingpong", "-d", testbed["device"], "-g", testbed["ipv4_gid_index"]]
    out, _ = server_client([*server, "-n", "20"], [*client, "-n", "20"], 18703)
    assert "20 iters in" in out


def tables(topo) -> dict:
    return {dev: faults.gid_table(dev) for dev in faults.devices(topo)}


def test_link_down_fault_restores_the_topology(testbed):
    before = tables(testbed)
    with faults.link_down(testbed):
        assert faults.port_state(testbed["device"]) == "DOWN"
        if testbed.get("peer_device"):  # the veth peer loses its carrier too
            faults.wait_for(
                lambda: faults.port_state(testbed["peer_device"]) == "DOWN", "the peer DOWN"
            )
    assert tables(testbed) == before
    if testbed.get("peer_ipv4"):  # the other end's address is reached across the pair again
        route = faults.sh("ip", "route", "get", testbed["peer_ipv4"])
        assert f" dev {testbed['netdev']} table 77 " in route, route


def test_netem_fault_is_removed_afterwards(testbed, netem):
    netem("delay 5ms")
    netem("loss 1%")
    assert "loss 1%" in faults.sh("tc", "qdisc", "show", "dev", testbed["netdev"], "root")


def test_netem_loss_hits_traffic_across_the_pair_and_rc_recovers(testbed):
    """netem drops packets between rxe0 and rxe1 and the RC transfer still completes. (Traffic of
    rxe0 to itself never reaches veth0's qdisc: measured 0 packets through it.)"""
    if not testbed.get("peer_device"):
        pytest.skip("no second rxe device in this testbed")
    server = ["ib_write_bw", "-d", testbed["peer_device"], "-x", testbed["peer_ipv4_gid_index"]]
    client = ["ib_write_bw", "-d", testbed["device"], "-x", testbed["ipv4_gid_index"]]
    with faults.netem(testbed, "loss 2%") as netdev:
        server_client([*server, "-n", "50"], [*client, "-n", "50"], 18704, timeout=180)
        stats = faults.sh("tc", "-s", "qdisc", "show", "dev", netdev, "root")
    dropped = int(stats.split("dropped ", 1)[1].split(",", 1)[0])
    assert dropped > 0, stats
    assert "netem" not in faults.sh("tc", "qdisc", "show", "dev", testbed["netdev"], "root")


def test_rxe_deleted_fault_restores_the_topology(testbed):
    before = tables(testbed)
    with faults.rxe_deleted(testbed) as device:
        names = {link["ifname"] for link in json.loads(faults.sh("rdma", "-j", "link", "show"))}
        assert device not in names
    assert tables(testbed) == before


def test_rxe_unloaded_fault_restores_the_topology(testbed):
    before = tables(testbed)
    with faults.rxe_unloaded(testbed):
        assert faults.port_state(testbed["device"]) == "ABSENT"
        assert json.loads(faults.sh("rdma", "-j", "link", "show") or "[]") == []
    assert tables(testbed) == before
    test_ib_write_bw_between_two_processes_on_rxe0(testbed)
