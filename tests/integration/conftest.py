"""Fixtures of the integration suite: the testbed topology and the fault injectors.

Where integration tests run (the testbed VM, a host with RDMA devices; never skipped under
CI=true) is decided in tests/conftest.py. The topology and the faults exist only inside the
testbed VM: their fixtures skip elsewhere (and so fail under CI=true). Each fault fixture
restores the topology afterwards, whatever the test did (faults.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from tests.integration import faults
from tests.integration import mesh as mesh_hosts
from tests.integration import pair as pair_hosts
from tests.integration.running import Running

IN_TESTBED = os.environ.get("IBTOOL_TESTBED") == "1"

# Kept importable from here for the tests that use them directly.
port_state = faults.port_state
wait_for = faults.wait_for


def load_topology() -> dict[str, str]:
    """What tests/testbed/guest.sh wrote: the JSON at IBTOOL_TESTBED_INFO, else IBTOOL_TB_*."""
    path = os.environ.get("IBTOOL_TESTBED_INFO")
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {
        k[len("IBTOOL_TB_") :].lower(): v
        for k, v in os.environ.items()
        if k.startswith("IBTOOL_TB_")
    }


@pytest.fixture(scope="session")
def testbed() -> dict[str, str]:
    """The guest topology: device rxe0, netdev veth0, ipv4, ipv4_gid_index, ipv6, ipv6_gid_index,
    vlan_netdev, vlan_id, vlan_ipv4, vlan_gid_index, peer_device rxe1, peer_netdev veth1,
    peer_ipv4, peer_ipv4_gid_index, kernel, out (the rwdir). Values are strings."""
    if not IN_TESTBED:
        pytest.skip("the testbed topology and its faults exist only inside the testbed VM")
    topo = load_topology()
    assert topo.get("device") and topo.get("netdev"), f"incomplete testbed topology: {topo}"
    return topo


@pytest.fixture(name="wait_for")
def wait_for_fixture():
    return faults.wait_for


@pytest.fixture
def link_down(testbed):
    """The rxe0 netdev taken down (rxe0/1 DOWN), brought back up afterwards."""
    with faults.link_down(testbed) as netdev:
        yield netdev


@pytest.fixture
def netem(testbed):
    """Call it with a netem spec ("loss 10% delay 1ms") to put it on the rxe0 netdev; any number
    of times (each replaces the last). Removed afterwards."""
    with contextlib.ExitStack() as stack:

        def apply(spec: str = "loss 10% delay 1ms") -> None:
            stack.enter_context(faults.netem(testbed, spec))

        yield apply


@pytest.fixture
def rxe_deleted(testbed):
    """rxe0 deleted with `rdma link delete`, recreated afterwards."""
    with faults.rxe_deleted(testbed) as device:
        yield device


@pytest.fixture
def rxe_unloaded(testbed):
    """The rdma_rxe module unloaded (every rxe device gone), reloaded and the devices recreated."""
    with faults.rxe_unloaded(testbed):
        yield


@pytest.fixture
def running():
    """Start ibtool processes; whatever still runs at the end is stopped (SIGTERM, then
    SIGKILL after 30 s)."""
    started: list[Running] = []

    def start(*args: str) -> Running:
        started.append(Running(*args))
        return started[-1]

    yield start
    for r in started:
        r.finish(signal.SIGTERM if r.proc.poll() is None else None, timeout=30)


# -- `testbed pair`: two guests ---------------------------------------------------------------

PAIR_ONLY = "needs the two guests of `testbed pair` (tests/testbed/testbed pair-suite; make pair)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pair: needs two hosts, the runner and its peer (`testbed pair-suite`)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside `testbed pair`, tests marked `pair` skip, and outside `testbed mesh` those
    marked `mesh`; under CI=true, where tests/conftest.py fails any skipped integration test,
    they are deselected instead, so the single-guest suite (`make integration`) passes as
    before."""
    for marker, inside, reason in (
        ("pair", pair_hosts.in_pair(), PAIR_ONLY),
        ("mesh", mesh_hosts.in_mesh(), mesh_hosts.MESH_ONLY),
    ):
        if inside:
            continue
        marked = [item for item in items if item.get_closest_marker(marker)]
        if not marked:
            continue
        if os.environ.get("CI", "").lower() == "true":
            config.hook.pytest_deselected(items=marked)
            items[:] = [item for item in items if not item.get_closest_marker(marker)]
            continue
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def pair(testbed):
    """The runner (`pair.local`, this guest) and its peer (`pair.peer`, over ssh): `run(argv,
    timeout)`, `start(argv)` (stopped at teardown whatever happened), their facts (ipv4, ipv6,
    device, netdev, gid_index, kernel, release). Skips outside `testbed pair`."""
    if not pair_hosts.in_pair():
        pytest.skip(PAIR_ONLY)
    hosts = pair_hosts.Pair(testbed)
    try:
        yield hosts
    finally:
        hosts.stop_all()


# -- `testbed mesh`: N guests on one segment ---------------------------------------------------


@pytest.fixture(scope="session")
def mesh_nodes(testbed) -> mesh_hosts.Mesh:
    """The mesh's nodes, built once (their facts); use the `mesh` fixture in tests."""
    if not mesh_hosts.in_mesh():
        pytest.skip(mesh_hosts.MESH_ONLY)
    return mesh_hosts.Mesh(testbed)


@pytest.fixture
def mesh(mesh_nodes):
    """node1 (this guest) and node2..nodeN over ssh: `mesh.nodes` (Node: name, address,
    device, netdev, gid_index, run(argv, timeout), start(argv)), the faults `lossy(node,
    percent)`, `port_down(node)`, `block_pair(a, b)` (each returns its undo) and
    `wait_nothing_left()`. At teardown every process started is stopped and every fault
    undone, whatever happened. Skips outside `testbed mesh`."""
    try:
        yield mesh_nodes
    finally:
        try:
            mesh_nodes.stop_all()
        finally:
            mesh_nodes.undo_all()


@pytest.fixture(scope="session")
def mesh_slurm(mesh_nodes):
    """One Slurm cluster over every node (slurmctld on node1, slurmd everywhere), started the
    first time a test asks for it, stopped at the end of the session."""
    from tests.integration.mesh_slurm import slurm_mesh

    with slurm_mesh(mesh_nodes) as cluster:
        yield cluster
