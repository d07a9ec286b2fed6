"""The mesh testbed itself (`testbed mesh-suite`): N guests with their own names and rxe0, ssh
from any node to any, `ibtool` over non-interactive ssh, ClusterShell and Slurm across them,
and each fault helper breaking what it says, then repaired by its undo."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.faults import ipv4_gid, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.mesh]


def ping(node, address: str) -> bool:
    """One ICMP echo from `node` to `address`, answered within 2 s (busybox's ping: the guests
    share this host's files, which have no iputils)."""
    return node.run(["busybox", "ping", "-c1", "-W2", address], timeout=60).returncode == 0


def reachable(mesh, pairs) -> dict[tuple[str, str], bool]:
    return {(a.name, b.name): ping(a, b.address) for a, b in pairs}


def test_every_node_has_its_own_name_and_an_active_rxe0(mesh):
    assert len(mesh.nodes) >= 3
    state = f"/sys/class/infiniband/{mesh.runner.device}/ports/1/state"
    seen = mesh.run_all(["sh", "-c", f"hostname; cat /etc/hostname {state}"])
    for node in mesh.nodes:
        proc = seen[node.name]
        assert proc.returncode == 0, (node, proc.stderr)
        assert proc.stdout.split() == [node.name, node.name, "4:", "ACTIVE"], (node, proc.stdout)
    assert (
        len({n.name for n in mesh.nodes}) == len({n.address for n in mesh.nodes}) == len(mesh.nodes)
    )


def test_ssh_from_every_node_to_every_node(mesh):
    names = " ".join(mesh.names())
    line = f'for n in {names}; do ssh "$n" hostname || echo "failed $n"; done'
    for node, proc in mesh.run_all(["sh", "-c", line]).items():
        assert proc.stdout.split() == mesh.names(), (node, proc.stdout, proc.stderr)


def test_ibtool_runs_over_non_interactive_ssh_on_every_node(mesh):
    def gids(node):
        return subprocess.run(
            ["ssh", node.name, "ibtool gids -j"], capture_output=True, text=True, timeout=180
        )

    for name, proc in mesh.on_all(gids).items():
        node = mesh[name]
        assert proc.returncode == 0, (name, proc.stderr)
        table = {(g["ifname"], g["index"]): g for g in json.loads(proc.stdout)}
        gid = table[(node.device, node.gid_index)]
        assert (gid["gid"], gid["ip"], gid["netdev"]) == (
            ipv4_gid(node.address),
            node.address,
            node.netdev,
        )


def test_clustershell_runs_a_command_on_every_node(mesh):
    from ClusterShell.NodeSet import NodeSet
    from ClusterShell.Task import task_self

    task = task_self()
    task.run("hostname", nodes=str(NodeSet.fromlist(mesh.names())), timeout=120)
    answers = {}
    for buf, nodes in task.iter_buffers():
        for name in nodes:
            answers[name] = bytes(buf).decode()
    assert answers == {name: name for name in mesh.names()}
    assert all(rc == 0 for rc, _ in task.iter_retcodes())


def test_slurm_runs_a_step_on_every_node(mesh, mesh_slurm):
    n = len(mesh.nodes)
    proc = mesh_slurm.srun([f"-N{n}", "--ntasks-per-node=1", "hostname"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == sorted(mesh.names())
    other = mesh.nodes[1].name
    proc = mesh_slurm.srun(["--overlap", "-N1", "-w", other, "hostname"])
    assert (proc.returncode, proc.stdout.strip()) == (0, other), proc.stderr
    assert set(mesh_slurm.states().values()) == {"idle"}


def test_block_pair_cuts_those_two_only(mesh):
    a, b, c = mesh.nodes[0], mesh.nodes[2], mesh.nodes[1]
    undo = mesh.block_pair(a, b)
    assert reachable(mesh, [(a, b), (b, a), (a, c), (c, b), (b, c)]) == {
        (a.name, b.name): False,
        (b.name, a.name): False,
        (a.name, c.name): True,
        (c.name, b.name): True,
        (b.name, c.name): True,
    }
    assert b.check(["hostname"]).strip() == b.name  # ssh: the management network
    undo()
    assert reachable(mesh, [(a, b), (b, a)]) == {(a.name, b.name): True, (b.name, a.name): True}
    assert "ibtool_block" not in a.check(["nft", "list", "tables"]) + b.check(
        ["nft", "list", "tables"]
    )


def test_port_down_takes_rxe0_down_and_its_undo_brings_it_back(mesh):
    node, other = mesh.nodes[1], mesh.nodes[2]
    undo = mesh.port_down(node)
    assert node.port_state() == "DOWN"
    assert not ping(other, node.address)
    assert mesh.runner.port_state() == other.port_state() == "ACTIVE"
    undo()
    assert node.port_state() == "ACTIVE" and node.port_ready()
    assert ping(other, node.address)


def test_lossy_loses_what_the_node_sends_and_its_undo_repairs_it(mesh):
    node, c, d = mesh.nodes[1], mesh.nodes[2], mesh.nodes[3 % len(mesh.nodes)]
    undo = mesh.lossy(node, 100)
    assert "loss 100%" in node.check(["tc", "qdisc", "show", "dev", node.netdev])
    assert not ping(node, c.address)
    assert not ping(c, node.address)  # the echo is answered, the answer lost
    assert ping(c, d.address)
    assert node.check(["hostname"]).strip() == node.name  # ssh: the management network
    undo()
    assert "netem" not in node.check(["tc", "qdisc", "show", "dev", node.netdev])
    assert ping(node, c.address)


def test_undo_all_undoes_every_fault_left_in_place(mesh):
    node, other = mesh.nodes[1], mesh.nodes[2]
    mesh.lossy(node, 50)
    mesh.block_pair(node, other)
    mesh.port_down(other)
    mesh.undo_all()  # what the fixture's teardown does
    assert other.port_ready()
    assert "netem" not in node.check(["tc", "qdisc", "show", "dev", node.netdev])
    assert "ibtool_block" not in node.check(["nft", "list", "tables"])
    assert ping(node, other.address)


def test_wait_nothing_left_waits_for_processes_and_rdma_ids(mesh):
    node = mesh.nodes[2]
    before = mesh.resources()
    monitor = node.start(["ibtool", "monitor"])
    rping = node.start(["rping", "-s", "-a", node.address, "-C", "1"])
    wait_for(lambda: node.leftovers()[1] - before[node.name], "rping's listening cm_id", 60)
    procs, _ = node.leftovers()
    assert any("-m ibtool monitor" in p for p in procs), procs
    with pytest.raises(AssertionError, match="left behind"):
        mesh.wait_nothing_left(timeout=1)
    monitor.stop()
    rping.stop()
    mesh.wait_nothing_left(timeout=60)
