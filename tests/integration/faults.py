"""Faults injected into the testbed guest, each a context manager that always restores.

`topo` is the testbed topology (the `testbed` fixture: device, netdev, peer_device, ...). Every
fault waits until it has taken effect before the body runs, and on the way out (body raised or
not) undoes itself and waits until the ports are ACTIVE again with their IPv4 GIDs back, so the
next test finds the topology as the guest set-up left it. The fixtures in conftest.py wrap them.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SYS = "/sys/class/infiniband"


def sh(*cmd: str, timeout: float = 60) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def port_state(device: str = "rxe0", port: int = 1) -> str:
    """ACTIVE, DOWN, ... as sysfs says; ABSENT when the device or port does not exist."""
    try:
        with open(f"{SYS}/{device}/ports/{port}/state") as f:
            return f.read().split(":", 1)[1].strip()
    except OSError:
        return "ABSENT"


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def gid_table(device: str, port: int = 1) -> dict[int, tuple[str, str | None, str | None]]:
    """{index: (gid, type, ndev)} of the non-zero GIDs; type/ndev None where sysfs refuses."""
    table = {}
    base = f"{SYS}/{device}/ports/{port}"
    for name in os.listdir(f"{base}/gids"):
        with open(f"{base}/gids/{name}") as f:
            gid = f.read().strip()
        if ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(0):
            continue
        attrs = []
        for attr in ("types", "ndevs"):
            try:
                with open(f"{base}/gid_attrs/{attr}/{name}") as f:
                    attrs.append(f.read().strip())
            except OSError:
                attrs.append(None)
        table[int(name)] = (gid, attrs[0], attrs[1])
    return table


def ipv4_gid(address: str) -> str:
    """The IPv4-mapped GID of an address, as sysfs writes it."""
    h = ipaddress.IPv6Address(f"::ffff:{address}").packed.hex()  # not .exploded: 3.13+ dots it
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def devices(topo: dict) -> dict[str, str]:
    """{rxe device: its netdev} of the testbed (rxe0 and, when set up, its peer rxe1)."""
    devs = {topo["device"]: topo["netdev"]}
    if topo.get("peer_device"):
        devs[topo["peer_device"]] = topo["peer_netdev"]
    return devs


def _has_gid(device: str, address: str) -> bool:
    try:
        return any(gid == ipv4_gid(address) for gid, _, _ in gid_table(device).values())
    except OSError:
        return False


def wait_topology(topo: dict, timeout: float = 60.0) -> None:
    """Every testbed rxe device exists, its port is ACTIVE and holds its IPv4 GID."""
    addresses = {topo["device"]: topo["ipv4"]}
    if topo.get("peer_device"):
        addresses[topo["peer_device"]] = topo["peer_ipv4"]
    for dev, address in addresses.items():
        wait_for(
            lambda dev=dev, address=address: port_state(dev) == "ACTIVE" and _has_gid(dev, address),
            f"{dev}/1 ACTIVE with the GID of {address}",
            timeout,
        )
    if topo.get("vlan_ipv4"):
        wait_for(
            lambda: _has_gid(topo["device"], topo["vlan_ipv4"]),
            f"the VLAN GID of {topo['vlan_ipv4']} on {topo['device']}",
            timeout,
        )


def restore_crossing_routes(topo: dict) -> None:
    """The guest's policy routes that send each end's packets for the other end's address out
    of its own veth (table 77, tests/testbed/guest.sh). Taking a netdev down deletes the
    routes through it, in every table, and bringing it up does not bring them back: without
    them, rdma_cm resolves the other end's address to the local device that has it (rxe1 to
    rxe1 through lo), and nothing crosses the pair."""
    ends = ((topo["peer_ipv4"], topo["netdev"], topo["ipv4"]),)
    if topo.get("peer_netdev"):
        ends += ((topo["ipv4"], topo["peer_netdev"], topo["peer_ipv4"]),)
    for address, netdev, source in ends:
        sh("ip", "route", "replace", address, "dev", netdev, "src", source, "table", "77")


def _recreate(topo: dict) -> None:
    if not os.path.isdir("/sys/module/rdma_rxe"):
        sh("modprobe", "rdma_rxe")
    for dev, netdev in devices(topo).items():
        if port_state(dev) == "ABSENT":
            sh("rdma", "link", "add", dev, "type", "rxe", "netdev", netdev)
    wait_topology(topo)


@contextmanager
def link_down(topo: dict, netdev: str | None = None) -> Iterator[str]:
    """NETDEV (default the rxe0 netdev) administratively down: rxe0/1 goes DOWN (and, across
    the veth pair, the peer's port too). Up again afterwards."""
    netdev = netdev or topo["netdev"]
    sh("ip", "link", "set", netdev, "down")
    try:
        wait_for(lambda: port_state(topo["device"]) == "DOWN", f"{topo['device']}/1 DOWN")
        yield netdev
    finally:
        sh("ip", "link", "set", netdev, "up")
        restore_crossing_routes(topo)
        wait_topology(topo)


@contextmanager
def netem(topo: dict, spec: str = "loss 10% delay 1ms", netdev: str | None = None) -> Iterator[str]:
    """A netem qdisc (e.g. "loss 10% delay 1ms") as the root qdisc of NETDEV (default the rxe0
    netdev); removed afterwards. It only touches traffic that crosses the veth pair (rxe0 <->
    rxe1): rxe loops a device's traffic to its own GIDs back inside the driver."""
    netdev = netdev or topo["netdev"]
    sh("tc", "qdisc", "replace", "dev", netdev, "root", "netem", *spec.split())
    try:
        yield netdev
    finally:
        if "netem" in sh("tc", "qdisc", "show", "dev", netdev, "root"):
            sh("tc", "qdisc", "del", "dev", netdev, "root")


@contextmanager
def rxe_deleted(topo: dict, device: str | None = None) -> Iterator[str]:
    """DEVICE (default rxe0) deleted with `rdma link delete`; recreated on its netdev afterwards."""
    device = device or topo["device"]
    sh("rdma", "link", "delete", device)
    try:
        wait_for(lambda: port_state(device) == "ABSENT", f"{device} gone")
        yield device
    finally:
        _recreate(topo)


@contextmanager
def rxe_unloaded(topo: dict) -> Iterator[None]:
    """Every rxe device deleted and the rdma_rxe module unloaded; module reloaded and the
    devices recreated afterwards."""
    try:
        for dev in devices(topo):
            if port_state(dev) != "ABSENT":
                sh("rdma", "link", "delete", dev)
        sh("modprobe", "-r", "rdma_rxe")
        wait_for(lambda: not os.path.isdir("/sys/module/rdma_rxe"), "rdma_rxe unloaded")
        yield
    finally:
        _recreate(topo)
