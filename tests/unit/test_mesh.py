"""`ibtool mesh`: the schedule, the agents' protocol as an attacker would speak it, the
coordinator over a simulated cluster (faults injected, up to 1,024 nodes x 8 rails), the
analysis's verdicts, and the ClusterShell engine through its exec worker. The testbed
(tests/integration/test_mesh.py) runs the real agents between real kernels."""

from __future__ import annotations

import json
import sys
from itertools import product
from pathlib import Path
from types import SimpleNamespace

import pytest

from ibtool.mesh import protocol
from ibtool.mesh.run import Options, mesh
from ibtool.mesh.schedule import Partners, plan, spread
from ibtool.model.mesh import Culprit, Endpoint, Level, PairState
from tests.unit.mesh_fake import FakeCluster

DOUBLE = Path(__file__).with_name("mesh_agent_double.py")


def _eps(nodes: int, rails: int) -> list[Endpoint]:
    return [
        Endpoint(f"n{i}", f"mlx5_{k}", 1, k, f"10.{k}.0.{i + 1}", "ACTIVE")
        for i, k in product(range(nodes), range(rails))
    ]


def _run(cluster: FakeCluster, **options) -> tuple:
    said: list[str] = []
    result = mesh(cluster, Options(**options), ["ibtool", "mesh", "--agent"], said.append,
                  clock=cluster.clock)  # fmt: skip
    return result, said


def _named(result) -> set[tuple[str, str, str]]:
    return {(v.culprit.value, v.level.name, v.subject) for v in result.verdicts}


# -- the schedule --------------------------------------------------------------------------


@pytest.mark.parametrize("nodes,rails,all_rails", [(2, 1, False), (5, 1, False), (7, 3, False),
                                                   (4, 2, True), (16, 8, False)])  # fmt: skip
def test_every_ordered_pair_once_one_partner_a_round(nodes, rails, all_rails):
    eps = _eps(nodes, rails)
    s = plan(eps, all_rails, None)
    seen = set()
    for r in range(s.rounds):
        pairs = s.pairs(r)
        assert len({a for a, _ in pairs}) == len(pairs)  # each endpoint the client once
        assert len({b for _, b in pairs}) == len(pairs)  # and the server once
        for a, b in pairs:
            assert a != b and (a, b) not in seen
            assert all_rails or eps[a].rail == eps[b].rail
            seen.add((a, b))
    group = len(eps) if all_rails else nodes
    assert len(seen) == len(eps) * (group - 1)
    p = Partners(s, len(eps))
    for r in range(s.rounds):
        for a, b in s.pairs(r):
            assert p.of(r, a) == b and p.by(r, b) == a and s.partner(r, a) == b


def test_fewer_rounds_are_spread_over_the_shifts():
    assert spread(1024, 4) == [1, 256, 512, 768]
    assert spread(5, None) == [1, 2, 3, 4]
    assert spread(5, 10) == [1, 2, 3, 4]
    assert spread(1, None) == []
    s = plan(_eps(1024, 2), False, 16)
    assert s.rounds == 16 and set(s.shifts) == {"rail 0", "rail 1"}


# -- the protocol, spoken by a hostile node --------------------------------------------------


def _hello(**changes) -> str:
    ep = {"device": "rxe0", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
          "address": "10.0.0.1", "gid_index": 1, "hw": False, "problem": None}  # fmt: skip
    ep.update(changes.pop("endpoint", {}))
    msg = {"t": "hello", "v": protocol.VERSION, "id": "ab" * 8, "node": "n1", "endpoints": [ep]}
    msg.update(changes)
    return json.dumps(msg)


@pytest.mark.parametrize(
    "line,said",
    [
        ("x" * (protocol.MAX_LINE + 1), "over the"),
        ("[" * 100000 + "]" * 100000, "over the"),
        ("[" * 5000 + "]" * 5000, "not a JSON message|without its type"),
        ("not json", "not a JSON message"),
        ('{"t": "reboot"}', "unknown message"),
        (_hello(v=1), "protocol version"),
        (_hello(id="../../etc"), "no agent id"),
        (_hello(node="n1; rm -rf /"), "not a name"),
        (_hello(endpoint={"device": "$(reboot)"}), "not a name"),
        (_hello(endpoint={"port": True}), "port"),
        (_hello(endpoint={"state": "ACTIVE\x1b[2J"}), "port state"),
        (_hello(endpoint={"address": "10.0.0.1; curl evil"}), "not an IP address"),
        (_hello(endpoints=[{}] * 65), "at most 64"),
        ('{"t":"result","r":0,"pairs":[[0,1,1,5,6,1,1,1,false,null]]}', "out of range"),
        ('{"t":"result","r":0,"pairs":[[0,1,1,5,5,NaN,1,1,false,null]]}', "round trip"),
        ('{"t":"result","r":0,"pairs":[[0,1,1,5,5,Infinity,1,1,false,null]]}', "round trip"),
        ('{"t":"result","r":0,"pairs":[[0,1,3,5,5,1,1,1,false,null]]}', "out of range"),
        ('{"t":"result","r":0,"pairs":[[0,1,1,true,1,1,1,1,false,null]]}', "out of range"),
        ('{"t":"result","r":0,"pairs":[[-1,1,1,5,5,1,1,1,false,null]]}', "out of range"),
        ('{"t":"result","r":0,"pairs":[[0,1,1,5,5,1,1,1,false,["x"]]]}', "not text"),
        ('{"t":"result","r":-1,"pairs":[]}', "round"),
        ('{"t":"ready","problems":{"999":"x"}}', "endpoint"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else None,
)
def test_a_node_that_breaks_the_protocol_is_refused_with_the_reason(line, said):
    """(ids: the parametrize ids are cut, the lines are long)"""
    with pytest.raises(protocol.AgentError, match=said):
        protocol.parse_agent(line)


def test_an_agents_text_is_escaped_and_bounded():
    pair = [0, 1, 1, 5, 0, None, None, None, False, "\x1b[31mred\n" * 100]
    line = json.dumps({"t": "result", "r": 0, "pairs": [pair]})
    (pair,) = protocol.parse_agent(line)["pairs"]
    assert "\x1b" not in pair[9] and "\n" not in pair[9] and len(pair[9]) <= protocol.MAX_ERROR + 3


def test_the_plan_an_agent_reads_is_checked_too():
    for bad in ('{"t":"plan","v":1,"endpoints":[["a",99,"","x"]]}',
                '{"t":"round","r":"0"}', '{"t":"shutdown"}'):  # fmt: skip
        with pytest.raises(protocol.AgentError):
            protocol.parse_coordinator(bad)


# -- the coordinator and the analysis over a simulated cluster ----------------------------


def test_a_healthy_mesh_says_so():
    result, said = _run(FakeCluster(6, 2))
    assert result.verdicts == [] and result.exit_code() == 0
    assert len(result.pairs) == 6 * 2 * 5 and result.rounds == 5
    assert all(p.state == PairState.PROBED and p.received == 20 for p in result.pairs)
    assert said[0] == "mesh: 12 endpoints on 6 of 6 nodes"


def test_a_mesh_that_probed_no_pair_is_unknown_not_healthy():
    # one node, two rails, rail k meeting rail k of the others: there are no others
    from ibtool.views import mesh as view

    result, _ = _run(FakeCluster(1, 2))
    assert result.verdicts == [] and result.probed() == 0
    assert result.exit_code() == 3
    assert view.summary(result) == (
        "mesh UNKNOWN: no pair probed over 2 endpoints: rail k pings rail k of the other "
        "nodes and there is one node (--all-rails pings between its ports)"
    )
    assert "ibtool_mesh_status 3" in view.textfile(result)
    assert _run(FakeCluster(1, 2), all_rails=True)[0].exit_code() == 0


def test_the_three_faults_of_the_testbed_and_no_other():
    """One lossy endpoint (slow under RC), one port down, one pair blocked: four endpoints,
    where every endpoint has a bad pair, and only the three causes are named."""
    cluster = FakeCluster(4, 1, slow={"node0001/rxe0/1"}, down={"node0002/rxe0/1"},
                          blocked=[("node0003/rxe0/1", "node0004/rxe0/1")])  # fmt: skip
    result, _ = _run(cluster)
    assert _named(result) == {
        ("endpoint", "WARN", "node0001/rxe0/1"),
        ("endpoint", "FAIL", "node0002/rxe0/1"),
        ("path", "FAIL", "node0003/rxe0/1 <-> node0004/rxe0/1"),
    }
    assert result.exit_code() == 2
    by = {v.subject: v for v in result.verdicts}
    assert "port DOWN" in by["node0002/rxe0/1"].why
    assert "2 of its partners bad both ways" in by["node0001/rxe0/1"].why
    path = by["node0003/rxe0/1 <-> node0004/rxe0/1"]
    assert path.next[-1] == "on node0003: ibtool doctor --dev rxe0/1 10.0.0.4"
    # the doctor runs next are against partners no verdict names
    assert "10.0.0.1" not in " ".join(by["node0002/rxe0/1"].next)


def test_an_endpoint_s_verdict_carries_what_its_pairs_said():
    # cut off from all but node0003, which it meets in rounds 2 and 3: never two whole
    # rounds lost in a row, so it is named by its pairs, not quarantined
    bad = "node0001/rxe0/1"
    cluster = FakeCluster(5, 1, blocked=[(bad, f"node{i:04d}/rxe0/1") for i in (2, 4, 5)])
    result, _ = _run(cluster)
    (verdict,) = result.verdicts
    assert (verdict.subject, verdict.level.name) == (bad, "FAIL")
    assert verdict.why.endswith(
        "0/0 pings answered in those pairs: cannot reach: timed out (6 pairs)"
    ), verdict.why


def _timed(cluster: FakeCluster, **options):
    said: list[str] = []
    result = mesh(cluster, Options(**options), ["ibtool", "mesh", "--agent"], said.append,
                  clock=cluster.clock)  # fmt: skip
    return result, said


def test_a_black_hole_is_quarantined_and_costs_two_rounds():
    black = "node0005/rxe1/1"
    healthy, _ = _timed(FakeCluster(12, 2))
    result, said = _timed(FakeCluster(12, 2, black={black}))
    assert healthy.verdicts == [] and healthy.elapsed > 0
    (verdict,) = result.verdicts
    assert (verdict.subject, verdict.level.name) == (black, "FAIL")
    assert verdict.why.startswith("quarantined after rounds 1-2: every pair with it lost while")
    assert "abandoned after 3 losses in a row" in verdict.why
    assert any(line.startswith(f"{black}: quarantined after rounds 1-2") for line in said)
    # its pairs after the quarantine are not probed, and say why
    t = result.pairs
    later = [p for p in result.pairs if p.round >= 2 and black in (
        result.endpoints[p.src].name, result.endpoints[p.dst].name)]  # fmt: skip
    assert later and all(p.state == PairState.SKIPPED for p in later)
    assert later[0].error == f"not probed: {black} is quarantined"
    assert len(t.errors) < 100
    # two rounds of abandoned pairs (3 x 2 s), then the healthy rounds' time
    assert result.elapsed <= healthy.elapsed + 2 * (3 * 2.0 + 0.1)


def test_a_thousand_nodes_with_a_black_hole_finish_within_twice_the_healthy_time():
    """1,024 x 8, 64 of the 1,023 rounds (a unit test's time; bench/bench_mesh.py runs them
    all): the black hole's two rounds of abandoned pairs are the whole difference."""
    nodes, rails = 1024, 8
    black = "node0512/rxe3/1"
    healthy, _ = _timed(FakeCluster(nodes, rails), rounds=64)
    result, _ = _timed(FakeCluster(nodes, rails, black={black}), rounds=64)
    assert [v.subject for v in result.verdicts] == [black]
    assert result.elapsed <= 2 * healthy.elapsed, (result.elapsed, healthy.elapsed)


def test_a_deadline_ends_the_mesh_with_what_it_has():
    from ibtool.views import mesh as view

    cluster = FakeCluster(12, 1)  # rounds of 0.25 s: the fourth ends past the deadline
    result, said = _timed(cluster, deadline=1.0)
    assert result.stopped == "--deadline 1 s reached in round 4 of 11"
    assert f"mesh: {result.stopped}" in said
    # the pairs of the rounds it cut are not pairs of this mesh: no one is blamed for them
    assert {p.round for p in result.pairs} == {0, 1, 2}
    assert all(p.state == PairState.PROBED for p in result.pairs)
    assert result.verdicts == [] and result.exit_code() == 0
    assert result.stopped in "\n".join(view.render_text(result))


def test_a_node_with_a_port_fewer_or_more_than_the_others_is_named():
    result, _ = _run(FakeCluster(6, 4, ports={"node0002": 3, "node0005": 5}))
    by = {v.subject: v for v in result.verdicts}
    assert set(by) == {"node0002", "node0005"}
    assert by["node0002"].level.name == "WARN" and by["node0002"].why.startswith(
        "3 RDMA ports where 4 of 6 nodes have 4: a missing HCA or port moves its later ports"
    )
    assert "a port more (a storage NIC, another fabric?) is a rail of its own" in by["node0005"].why
    assert result.exit_code() == 1
    # no majority, no odd one out
    assert _run(FakeCluster(4, 2, ports={"node0001": 3, "node0002": 3}))[0].verdicts == []


def test_drift_across_a_rail_names_the_odd_one_with_what_the_others_have():
    cluster = FakeCluster(6, 2, drift={
        "node0003/rxe1/1": {"gid_index": 3},  # an extra IPv4 address moved its --best GID
        "node0004": {"fw": "16.35.1012"},  # every port of the node: one verdict, the node
        "node0005/rxe0/1": {"mtu": 1024, "rate": "50 Gb/sec (2X EDR)"},
    })  # fmt: skip
    result, _ = _run(cluster)
    by = {v.subject: v for v in result.verdicts}
    assert set(by) == {"node0003/rxe1/1", "node0004", "node0005/rxe0/1"}
    assert all(v.level.name == "WARN" for v in result.verdicts)
    assert by["node0003/rxe1/1"].why == "GID index 3 where 5 of 6 on rail 1 have 1"
    assert by["node0004"].why == (
        "firmware 16.35.1012 on all its 2 ports, where the others have 16.35.2000"
    )
    assert by["node0005/rxe0/1"].why == (
        "active MTU 1024 where 5 of 6 on rail 0 have 4096; "
        "rate 50 Gb/sec (2X EDR) where 5 of 6 on rail 0 have 100 Gb/sec (4X EDR)"
    )
    assert result.exit_code() == 1
    assert _run(FakeCluster(6, 2))[0].verdicts == []
    # the kernel, the driver, and on RoCE PFC and DCB trust where the netdev says them
    cluster = FakeCluster(5, 1, drift={
        **{f"node{i:04d}": {"kernel": "6.1.0-28-amd64", "pfc": "3", "trust": "dscp",
                            "driver": "mlx5_core"} for i in range(1, 6)},
        "node0002/rxe0/1": {"kernel": "6.1.0-21-amd64", "pfc": "none"},
    })  # fmt: skip
    (v,) = _run(cluster)[0].verdicts
    assert (v.subject, v.why) == ("node0002/rxe0/1", (
        "kernel 6.1.0-21-amd64 where 4 of 5 on rail 0 have 6.1.0-28-amd64; "
        "PFC priorities none where 4 of 5 on rail 0 have 3"))  # fmt: skip


def test_a_lossy_link_under_rc_is_named_by_its_retransmissions():
    """As the testbed shows it: netem's losses resent by RC, every ping answered, the RTTs
    unremarkable (the only answered pairs all involve the lossy endpoint), but its port's
    retransmission counters move in every round and its partners' only when they meet it."""
    blocked = [("node0001/rxe0/1", "node0004/rxe0/1")]
    cluster = FakeCluster(4, 1, resends={"node0002/rxe0/1"}, down={"node0003/rxe0/1"},
                          blocked=blocked, jitter=True)  # fmt: skip
    result, _ = _run(cluster)
    assert _named(result) == {
        ("endpoint", "WARN", "node0002/rxe0/1"),
        ("endpoint", "FAIL", "node0003/rxe0/1"),
        ("path", "FAIL", "node0001/rxe0/1 <-> node0004/rxe0/1"),
    }
    why = next(v.why for v in result.verdicts if v.subject == "node0002/rxe0/1")
    assert why.startswith("its port retransmitted in 3 of its 3 rounds (24 RC retransmissions")
    healthy, _ = _run(FakeCluster(8, 2, jitter=True))
    assert healthy.verdicts == []


def test_lossy_endpoint_and_a_rail_switch():
    rail3 = {f"node{i:04d}/rxe3/1" for i in range(1, 9)}
    result, _ = _run(FakeCluster(10, 4, lossy={"node0005/rxe1/1"} | rail3))
    assert _named(result) == {("endpoint", "FAIL", "node0005/rxe1/1"), ("rail", "FAIL", "rail 3")}
    rail = next(v for v in result.verdicts if v.culprit == Culprit.RAIL)
    assert rail.why.startswith("8 of its 10 endpoints bad at once")


def test_nodes_that_never_answer_speak_garbage_or_die_are_theirs_alone():
    cluster = FakeCluster(8, 2, silent={"node0002"}, garbage={"node0003"}, dies={"node0004": 2})
    result, said = _run(cluster)
    got = {v.subject: v for v in result.verdicts}
    assert set(got) == {"node0002", "node0003", "node0004"}
    assert (
        got["node0002"].why
        == "no agent: ssh failed (exit 255): ssh: connect to host: No route to host"
    )
    assert "spoke garbage" in got["node0003"].why
    assert "its agent left the mesh: its agent exited 1" in got["node0004"].why
    assert all(v.culprit == Culprit.NODE and v.level == Level.FAIL for v in result.verdicts)
    # the others' pairs were all probed and fine
    good = [p for p in result.pairs if "node0004" not in result.endpoints[p.src].name
            and "node0004" not in result.endpoints[p.dst].name]  # fmt: skip
    assert good and all(p.received == 20 for p in good)
    assert cluster.closed


def test_a_node_reporting_pairs_not_its_own_is_dropped():
    class Liar(FakeCluster):
        def _pair(self, i, d):
            row, took = super()._pair(i, d)
            if self.node_of[i] == "node0002":
                row[0] = 0  # claims to be node0001's endpoint
            return row, took

    result, said = _run(Liar(4, 1))
    assert any("reported a pair 0 -> " in s for s in said)
    assert "node0002/rxe0/1" in {v.subject for v in result.verdicts}
    assert all(result.endpoints[p.src].node != "node0002" or p.state != PairState.PROBED
               for p in result.pairs)  # fmt: skip


def test_a_thousand_nodes_of_eight_rails():
    """The scheduler and the analysis at 1,024 x 8 (64 of the 1,023 shifts: a unit test's
    time; bench/bench_mesh.py runs them all and prints how long it takes)."""
    cluster = FakeCluster(
        1024, 8,
        down={"node0100/rxe2/1"},
        slow={"node0500/rxe5/1"},
        lossy={"node0777/rxe0/1"},
        silent={"node1000"},
        dies={"node0042": 10},
    )  # fmt: skip
    result, _ = _run(cluster, rounds=64)
    assert result.rounds == 64 and len(result.endpoints) == 1023 * 8
    assert _named(result) == {
        ("endpoint", "FAIL", "node0100/rxe2/1"),
        ("endpoint", "WARN", "node0500/rxe5/1"),
        ("endpoint", "FAIL", "node0777/rxe0/1"),
        ("node", "FAIL", "node1000"),
        ("node", "FAIL", "node0042"),
    }


# -- the ClusterShell engine, through its exec worker ---------------------------------------


def test_clustershell_carries_the_mesh(tmp_path):
    pytest.importorskip("ClusterShell")
    from ibtool.mesh.engines import ClusterShellEngine

    engine = ClusterShellEngine("n[1-4]", remote=False)
    argv = [sys.executable, str(DOUBLE), "%h"]
    said: list[str] = []
    result = mesh(engine, Options(count=5), argv, said.append, listen=("127.0.0.1", 0))
    assert result.verdicts == [] and len(result.pairs) == 12
    assert [e.node for e in result.endpoints] == ["n1", "n2", "n3", "n4"]
    assert all(p.hw and p.median_us == 2.5 for p in result.pairs)


# "exit": the agent left its ssh once joined, so its exit code and stderr are nobody's; its
# connection's end is all there is
@pytest.mark.parametrize("mode,why", [("exit", "its agent ended"),
                                      ("garbage", "spoke garbage")])  # fmt: skip
def test_clustershell_node_faults(mode, why, tmp_path):
    pytest.importorskip("ClusterShell")
    from ibtool.mesh.engines import ClusterShellEngine

    script = tmp_path / "agent.sh"
    script.write_text(
        f'#!/bin/sh\nn="$1"; shift\n'
        f'if [ "$n" = n2 ]; then exec {sys.executable} {DOUBLE} "$n" {mode} "$@"; fi\n'
        f'exec {sys.executable} {DOUBLE} "$n" banner "$@"\n'
    )
    script.chmod(0o755)
    result = mesh(ClusterShellEngine("n[1-3]", remote=False), Options(count=5),
                  [str(script), "%h"], lambda line: None, listen=("127.0.0.1", 0))  # fmt: skip
    assert len(result.verdicts) == 1, (result.verdicts, result.unreachable)
    (verdict,) = result.verdicts
    assert verdict.subject in ("n2", "n2/mlx5_0/1") and why in verdict.why


# -- the srun engine, against a stand-in for srun --------------------------------------------

FAKE_SRUN = """#!{python}
# srun as the mesh uses it: --nodelist's tasks, stdin to every one, each line labelled.
import subprocess, sys, threading
args = sys.argv[1:]
nodes = args[args.index("--nodelist") + 1].split(",")
argv = args[args.index("--") + 1:]
assert "--label" in args and "--input=all" in args
procs = [subprocess.Popen(argv + [n] + (["{mode}"] if n == "{odd}" else []),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env={{"SLURMD_NODENAME": n, "SLURM_PROCID": str(i),
                               "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1"}})
         for i, n in enumerate(nodes)]
def out(i, p):
    for line in p.stdout:
        sys.stdout.write(f"{{i:>2}}: {{line.decode()}}"); sys.stdout.flush()
    rc = p.wait()
    if rc:  # as srun says it (src/srun/srun_job.c)
        sys.stderr.write(f"srun: error: {{nodes[i]}}: task {{i}}: Exited with exit code {{rc}}\\n")
        sys.stderr.flush()
threads = [threading.Thread(target=out, args=(i, p)) for i, p in enumerate(procs)]
for t in threads: t.start()
for line in sys.stdin:
    for p in procs:
        try:
            p.stdin.write(line.encode()); p.stdin.flush()
        except BrokenPipeError:
            pass
for p in procs:
    p.stdin.close()
for t in threads: t.join()
sys.exit(max(p.wait() for p in procs))
"""
# srun --label labels a task's stderr too ("2: ibtool: error: ..."); the stand-in above hands
# the tasks' stderr through unlabelled, so this one says it as srun does
FAKE_SRUN_STDERR = (
    FAKE_SRUN.replace(
        "stdin=subprocess.PIPE, stdout=subprocess.PIPE,",
        "stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,",
    )
    .replace(
        "def out(i, p):",
        "def err(i, p):\n    for line in p.stderr:\n        "
        'sys.stderr.write(f"{{i:>2}}: {{line.decode()}}"); sys.stderr.flush()\n'
        "def out(i, p):\n    e = threading.Thread(target=err, args=(i, p)); e.start()",
    )
    .replace("    rc = p.wait()\n", "    rc = p.wait(); e.join()\n")
)


@pytest.mark.parametrize("mode", ["ok", "exit"])
def test_srun_carries_the_mesh_and_maps_tasks_by_their_node(mode, tmp_path):
    from ibtool.mesh.engines import SrunEngine

    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable, mode=mode, odd="c3"))
    srun.chmod(0o755)
    engine = SrunEngine("c[1-4]", overlap=True, srun=str(srun))
    assert engine.command(["x"])[-3:] == ["--overlap", "--", "x"]
    result = mesh(engine, Options(count=5), [sys.executable, str(DOUBLE)], lambda line: None)
    nodes = [e.node for e in result.endpoints]
    if mode == "ok":
        assert nodes == ["c1", "c2", "c3", "c4"]
        assert result.verdicts == [] and len(result.pairs) == 12
    else:
        # its hello may be read before srun says it ended (then its endpoint is named), or not
        assert [n for n in nodes if n != "c3"] == ["c1", "c2", "c4"]
        (verdict,) = result.verdicts
        assert verdict.subject in ("c3", "c3/mlx5_0/1") and "its agent exited 3" in verdict.why


def test_srun_names_the_node_whose_agent_died_before_its_hello(tmp_path):
    # one verdict, on the node srun's own line names, with the reason its task gave
    from ibtool.mesh.engines import SrunEngine

    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN_STDERR.format(python=sys.executable, mode="early", odd="c3"))
    srun.chmod(0o755)
    engine = SrunEngine("c[1-4]", overlap=True, srun=str(srun))
    result = mesh(engine, Options(count=5), [sys.executable, str(DOUBLE)], lambda line: None)
    assert [e.node for e in result.endpoints] == ["c1", "c2", "c4"]
    assert list(result.unreachable) == ["c3"], result.unreachable
    assert "its agent exited 3: 2: ibtool: error: no RDMA devices" not in result.unreachable["c3"]
    assert result.unreachable["c3"].startswith("its agent exited 3: ibtool: error: no RDMA ")
    (verdict,) = result.verdicts
    assert verdict.subject == "c3", verdict


def test_srun_outside_an_allocation_says_how(monkeypatch):
    from ibtool.errors import UsageError
    from ibtool.mesh.engines import SrunEngine

    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(UsageError, match="not one"):
        SrunEngine(None, overlap=False)


def test_local_on_a_host_without_rdma_devices_is_one_error_line(tmp_path, monkeypatch):
    # as doctor and loopback say it: no agent started, no FAIL verdict, no last mesh saved
    from ibtool.errors import ExitCode
    from tests.unit.conftest import run_cli
    from tests.unit.fake_host import sysfs_from

    monkeypatch.setattr("ibtool.api.mesh.last_path", lambda env=None: str(tmp_path / "m.json"))
    empty = tmp_path / "sys" / "class" / "infiniband"
    empty.mkdir(parents=True)
    r = run_cli(["mesh", "--local"], host_factory=sysfs_from(tmp_path))
    assert r.code == ExitCode.NO_DEVICES, r
    assert r.out == "" and r.err.startswith("ibtool: error: no RDMA devices ("), r
    assert len(r.err.splitlines()) == 1
    assert not (tmp_path / "m.json").exists()


def test_dev_and_exclude_reach_every_node_s_agent(monkeypatch):
    import argparse
    from types import SimpleNamespace

    from ibtool.plugin.manager import builtin_package

    builtin_package()
    from ibtool_plugins import mesh as plugin

    monkeypatch.setenv("SLURM_JOB_NODELIST", "c[1-2]")
    dev, exclude = plugin.device_ports("mlx5_[0-7]"), plugin.device_ports("mlx5_3/1")
    args = SimpleNamespace(local=False, nodeset=None, srun=True, ibtool="ibtool",
                           dev=dev, exclude=exclude, gid_index=None)  # fmt: skip
    monkeypatch.setattr("ibtool.api.mesh.slurm_overlap", lambda srun="srun": False)
    monkeypatch.setattr("ibtool.mesh.engines.expand_hostlist", lambda text, srun="srun": ["c1"])
    _, argv = plugin.engine_for(SimpleNamespace(args=args))
    assert argv == ["ibtool", "mesh", "--agent", "--dev", "mlx5_[0-7]", "--exclude", "mlx5_3/1"]
    args.gid_index = 3  # the GID the job uses: the agents choose their addresses by it
    _, argv = plugin.engine_for(SimpleNamespace(args=args))
    assert argv[-2:] == ["--gid-index", "3"]
    with pytest.raises(argparse.ArgumentTypeError, match="not DEV"):
        plugin.device_ports("a/b/c")


def test_clustershell_raises_the_open_files_limit_as_clush_does():
    import resource

    from ibtool.errors import UsageError
    from ibtool.mesh.engines import open_files_for, window

    def limits(soft, hard):
        state = {"limit": (soft, hard)}

        def get(what):
            assert what == resource.RLIMIT_NOFILE
            return state["limit"]

        def set_(what, value):
            state["limit"] = value

        return (get, set_), state

    fns, state = limits(1024, 524288)  # systemd's default hard limit
    assert open_files_for(1024, 64, fns) == 8192 and state["limit"] == (8192, 524288)
    fns, state = limits(1024, 524288)
    # one a joined agent, 3 an ssh of the window, 24 spare: over clush's 8192
    assert open_files_for(8000, 64, fns) == 8216
    fns, state = limits(1024, 4096)
    assert open_files_for(4000, 64, fns) == 4096  # all the hard limit allows, as clush
    assert window(4000, 64, 4096) == 24  # and the window what is left
    fns, state = limits(256, 256)
    assert open_files_for(200, 64, fns) == 256 and window(200, 64, 256) == 10
    fns, _ = limits(256, 256)
    with pytest.raises(UsageError, match="300 nodes need about 327 open files"):
        open_files_for(300, 64, fns)


# -- the path probed: what the job uses ------------------------------------------------------


def test_a_smaller_mtu_on_an_endpoint_s_link_fails_its_full_payload_pings():
    """Its 64-byte pings all pass; its pings of the path MTU's full payload do not."""
    bad = "node0003/rxe0/1"
    result, _ = _run(FakeCluster(6, 2, small_mtu={bad}))
    assert _named(result) == {("endpoint", "FAIL", bad)}
    (v,) = result.verdicts
    assert "5 of its partners bad both ways" in v.why
    assert (
        "0/30 pings of the path MTU's full payload (4096 bytes) answered in those pairs, "
        "all their 64-byte pings answered: an MTU below 4096 on its link" in v.why
    )
    assert result.exit_code() == 2
    pairs = [p for p in result.pairs if bad in (result.endpoints[p.src].name,
                                                result.endpoints[p.dst].name)]  # fmt: skip
    assert pairs and all(p.received == p.sent and p.full.name == "LOST" for p in pairs)
    assert all(p.health.name == "FAILED" for p in pairs)
    # the pings alone (--full-payload 0) pass: what the 64-byte mesh said before
    assert _run(FakeCluster(6, 2, small_mtu={bad}), full_payload=0)[0].verdicts == []


def test_a_rail_whose_switch_has_a_smaller_mtu_is_the_rail():
    rail = {f"node{i:04d}/rxe1/1" for i in range(1, 7)}
    result, _ = _run(FakeCluster(6, 2, small_mtu=rail))
    (v,) = result.verdicts
    assert (v.culprit.value, v.subject) == ("rail", "rail 1")
    assert "6 of its 6 endpoints bad at once: the rail's switch" in v.why


def test_tclass_reaches_the_agents_and_names_the_endpoint_that_drops_its_class():
    """A DSCP rule dropping one class on one node: the default mesh (class 0) passes,
    --tclass 104 (DSCP 26, the class the job uses) names it."""
    from ibtool.views import mesh as view

    bad = "node0002/rxe0/1"
    assert _run(FakeCluster(6, 1, dscp={bad}))[0].verdicts == []
    cluster = FakeCluster(6, 1, dscp={bad})
    result, _ = _run(cluster, tclass=104, sl=3, pkey_index=1)
    assert _named(result) == {("endpoint", "FAIL", bad)}
    assert cluster.plan["path"] == {"sl": 3, "tclass": 104, "pkey_index": 1}
    assert "tclass 104 (DSCP 26), sl 3, P_Key index 1, " in view.head(result)
    assert view.settings_json(result)["tclass"] == 104


def test_qps_name_a_pair_one_of_whose_ecmp_paths_drops():
    a, b = "node0001/rxe0/1", "node0004/rxe0/1"
    result, _ = _run(FakeCluster(6, 1, ecmp=[(a, b)]), qps=4)
    (v,) = result.verdicts
    assert (v.culprit.value, v.subject) == ("path", f"{a} <-> {b}")
    assert "1 of 4 QPs lost every ping while the others were answered" in v.why
    ecmp = [p for p in result.pairs if p.error and "QPs" in p.error]
    assert len(ecmp) == 2 and all((p.sent, p.received) == (18, 15) for p in ecmp)
    assert all(result.pairs.silent_qps.values()) and len(result.pairs.silent_qps) == 2


def test_bw_names_the_endpoint_below_its_rail_s_median():
    from ibtool.views import mesh as view

    slow = "node0005/rxe1/1"
    result, _ = _run(FakeCluster(6, 2, shaped={slow: 20.0}), bw=True)
    (v,) = result.verdicts
    assert (v.culprit.value, v.level.name, v.subject) == ("endpoint", "WARN", slow)
    assert v.why == (
        "its pairs' RDMA WRITE bandwidth 20 Gb/s, 0.22 of rail 1's median 90 Gb/s over 6 "
        "endpoints: a link trained down, a shaped or congested port"
    )
    doc = json.loads("".join(view.json_chunks(result)))
    assert {p["bw_gbps"] for p in doc["pairs"]} == {20.0, 90.0}
    assert _run(FakeCluster(6, 2), bw=True)[0].verdicts == []
    # a round's bound covers the burst, the full-payload pings and the QPs' connections
    from ibtool.mesh.run import round_timeout

    plain = round_timeout(Options())
    assert round_timeout(Options(bw=True, qps=4)) > plain > round_timeout(Options(full_payload=0))


def test_two_ports_of_one_host_in_one_subnet_are_one_verdict_with_the_fix():
    """--local --all-rails on a host whose rails share a subnet without a routing table each:
    the kernel routes each port's address through lo, so the pairs between them never leave
    the host. One FAIL for the node naming the cause and the fix, no path blamed."""
    result, _ = _run(FakeCluster(1, 3, looped={"node0001"}), all_rails=True)
    (v,) = result.verdicts
    assert (v.culprit.value, v.level.name, v.subject) == ("node", "FAIL", "node0001")
    assert v.why.startswith(
        "its ports share a subnet and the kernel routes each one's address "
        "through lo (node0001/rxe0/1, node0001/rxe1/1, node0001/rxe2/1): "
        "RoCE between them never leaves the host, 6 pairs not probed"
    )
    assert "accept_local=1" in v.next[0] and v.next[1].startswith("on node0001: ibtool doctor")
    assert result.exit_code() == 2
    # in a cluster, the node's pairs with the others are probed and judged as usual
    result, _ = _run(FakeCluster(4, 2, looped={"node0002"}), all_rails=True)
    assert _named(result) == {("node", "FAIL", "node0002")}


def test_an_agent_does_not_probe_two_of_its_ports_the_kernel_loops_through_lo(tmp_path):
    from ibtool.mesh.agent import Agent
    from ibtool.model.system import Route

    asked = []

    def route(dst, src=None):
        asked.append((dst, src))
        kind = "local" if dst == "10.99.0.2" else "unicast"
        return Route(dst, "lo" if kind == "local" else "veth0", src, None, kind)

    agent = Agent(SimpleNamespace(route=route), lambda m: None, lambda line: None)
    agent.addresses = {0: "10.99.0.1", 1: "10.99.0.2", 2: "10.99.0.3"}
    agent.up, agent.skip = dict.fromkeys(range(3), True), set()
    agent.own, agent.ladders = {0: 0, 1: 1, 2: 2}, {0: 1, 1: 1, 2: 1}
    agent.mine = [{"link_layer": "Ethernet"}] * 3
    assert agent._unusable(0, 1) == (
        "not probed: the kernel routes 10.99.0.2, this host's own, through lo from 10.99.0.1"
    )
    assert agent._unusable(0, 2) is None
    agent._unusable(0, 1)
    assert asked == [("10.99.0.2", "10.99.0.1"), ("10.99.0.3", "10.99.0.1")]  # asked once


def test_a_job_s_retransmissions_are_busy_not_a_lossy_link():
    """A port a running job makes resend 50 times a second, before the rounds as in them:
    no verdict, the endpoint listed as busy; a lossy link on a busy port is still named by
    what the rounds add beyond the job's rate."""
    from ibtool.views import mesh as view

    job = "node0003/rxe0/1"
    result, _ = _run(FakeCluster(6, 1, busy={job: 50.0}))
    assert result.verdicts == [] and result.exit_code() == 0
    by = {e.name: e for e in result.endpoints}
    assert by[job].busy == 50.0 and by["node0001/rxe0/1"].busy == 0.0
    assert view.busy_line(result) == (
        "busy (RC retransmissions before the rounds, when no agent pinged: another job's "
        f"traffic; only what the rounds added is judged): {job} (50/s)"
    )
    assert view.busy_line(result) in view.render_text(result)
    doc = json.loads("".join(view.json_chunks(result)))
    assert {e["name"]: e["busy_retrans_per_s"] for e in doc["endpoints"]}[job] == 50.0
    # the same counts without the quiet window's word (an agent before it said none): the
    # job's retransmissions are taken for a lossy link, as every mesh did before
    result, _ = _run(FakeCluster(6, 1, busy={job: 50.0}, quiet=False))
    assert _named(result) == {("endpoint", "WARN", job)}
    lossy = FakeCluster(6, 1, busy={job: 50.0}, resends={"node0005/rxe0/1"}, jitter=True)
    result, _ = _run(lossy)
    assert _named(result) == {("endpoint", "WARN", "node0005/rxe0/1")}


def _rails_of(result) -> dict[str, int]:
    return {e.name: e.rail for e in result.endpoints}


def test_rails_by_subnet_keep_a_node_s_ports_on_their_planes_when_an_hca_is_out():
    """node0002 without rxe1: by rank its rxe2 and rxe3 would ping the others' rxe1 and rxe2
    (other subnets: every pair a FAIL on a real fabric); by subnet they stay on rails 2, 3."""
    result, _ = _run(FakeCluster(6, 4, missing={"node0002": [1]}, prefix=16))
    rails = _rails_of(result)
    assert (rails["node0002/rxe2/1"], rails["node0002/rxe3/1"]) == (2, 3)
    assert result.settings.rails == "subnet"
    from ibtool.views import mesh as view

    assert "rails 0-3 (by subnet)" in view.head(result)
    (v,) = result.verdicts
    assert v.subject == "node0002" and v.why == (
        "3 RDMA ports where 5 of 6 nodes have 4: a missing HCA or port "
        "(--dev or --exclude choose the ports meshed)"
    )
    # agents that say no prefix: rails by rank, as before
    result, _ = _run(FakeCluster(6, 4, missing={"node0002": [1]}))
    assert _rails_of(result)["node0002/rxe2/1"] == 1 and result.settings.rails == "rank"


def test_an_operator_s_rail_map_wins():
    from ibtool.mesh.rails import parse_map

    rail = parse_map("rxe0=0,rxe1=1,rxe2=2,rxe3=3")
    result, _ = _run(FakeCluster(4, 4, missing={"node0003": [0]}), rail_map=rail)
    rails = _rails_of(result)
    assert [rails[f"node0003/rxe{k}/1"] for k in (1, 2, 3)] == [1, 2, 3]
    assert result.settings.rails == "map"
    for bad in ("rxe0", "rxe0=x", "=1", ""):
        with pytest.raises(ValueError):
            parse_map(bad)


def test_subnets_that_are_not_rails_leave_the_rank():
    from ibtool.mesh.rails import assign

    def ep(node, dev, rail, address):
        return Endpoint(node, dev, 1, rail, address, "ACTIVE")

    # two ports of one node in one subnet: the subnet is not a rail
    eps = [ep("a", "m0", 0, "10.0.0.1"), ep("a", "m1", 1, "10.0.0.2"),
           ep("b", "m0", 0, "10.0.0.3"), ep("b", "m1", 1, "10.1.0.3")]  # fmt: skip
    assert assign(eps, [16, 16, 16, 16]) == "rank" and [e.rail for e in eps] == [0, 1, 0, 1]
    # one subnet for all: nothing to key by
    eps = [ep("a", "m0", 0, "10.0.0.1"), ep("b", "m0", 0, "10.0.0.2")]
    assert assign(eps, [16, 16]) == "rank"
    # a port with no address takes the rail most nodes' port of its rank is on
    eps = [ep("a", "m0", 0, "10.0.0.1"), ep("a", "m1", 1, "10.1.0.1"),
           ep("b", "m0", 0, "10.0.0.2"), ep("b", "m1", 1, "")]  # fmt: skip
    assert assign(eps, [16, 16, 16, None]) == "subnet" and eps[3].rail == 1


def test_a_pair_that_lost_pings_once_is_retried_and_a_stall_is_not_judged():
    """An end off its CPU longer than a ping's timeout loses a few pings once: retried after
    the last round, the pair answers every ping, and no verdict names anyone; without the
    retry it was a path."""
    from ibtool.views import mesh as view

    a, b = "node0002/rxe0/1", "node0005/rxe0/1"
    result, said = _run(FakeCluster(6, 1, flaky=[(a, b)]))
    assert result.verdicts == [] and result.exit_code() == 0
    assert (
        result.retried == (2, 2) and "mesh: retrying 2 pairs that lost pings or were slow" in said
    )
    flaky = [p for p in result.pairs if p.received < p.sent]
    assert len(flaky) == 2 and all(p.health.name == "OK" for p in flaky)
    assert all(p.error == "ping 3: no reply; retried after the last round: 20/20 answered, "
               "p90 3.6 us (a stall, not the network)" for p in flaky)  # fmt: skip
    assert (
        "retried: 2 pairs that lost pings or were slow, probed again after the last round: "
        "2 answered every ping in time (a stall of an end: not judged), 0 failed again"
    ) in view.render_text(result)
    doc = json.loads("".join(view.json_chunks(result)))
    assert doc["retried"] == {"pairs": 2, "answered": 2}
    result, _ = _run(FakeCluster(6, 1, flaky=[(a, b)]), retry=False)
    assert _named(result) == {("path", "FAIL", f"{a} <-> {b}")}


def test_a_lossy_endpoint_loses_its_retries_too_and_stays_named():
    bad = "node0003/rxe0/1"
    cluster = FakeCluster(6, 1, lossy={bad})
    result, _ = _run(cluster)
    assert _named(result) == {("endpoint", "FAIL", bad)}
    assert result.retried == (9, 0) and len(cluster.retried) == 9  # 4 of its own 5: RETRY_EACH
    pairs = [p for p in result.pairs if p.received < p.sent]
    assert sum("; retried after the last round: ping: no reply" in p.error for p in pairs) == 9


def test_no_retry_when_more_pairs_lost_than_a_stall_explains():
    from ibtool.mesh.run import RETRY_MAX

    rail = {f"node{i:04d}/rxe0/1" for i in range(1, 41)}  # a rail's switch: 1,560 pairs
    cluster = FakeCluster(40, 1, lossy=rail)
    result, said = _run(cluster, rounds=3)
    assert len([p for p in result.pairs if p.received < p.sent]) > RETRY_MAX
    assert cluster.retried == [] and result.retried == (0, 0)
    assert not any("retrying" in line for line in said)


def test_side_channel_endpoints_share_an_address_on_ports_of_their_own():
    """Two InfiniBand ports of each node without IPoIB: both on the node's management address,
    the mesh's TCP port + 1 and + 2, no duplicate-address problem; the plan carries the
    ports, and a verdict's next commands name them."""
    cluster = FakeCluster(4, 2, drift={f"node{i:04d}": {"side": None} for i in range(1, 5)})
    for i, node in enumerate(cluster.nodes):
        for k in range(2):
            cluster.drift[f"{node}/rxe{k}/1"] = {
                "address": f"10.78.0.{i + 1}",
                "side": k + 1,
                "link_layer": "InfiniBand",
                "prefix": None,
            }
    cluster.down = {"node0002/rxe1/1"}
    result, _ = _run(cluster, tcp_port=18521)
    ports = {e.name: (e.address, e.tcp_port, e.problem) for e in result.endpoints}
    assert ports["node0001/rxe0/1"] == ("10.78.0.1", 18522, None)
    assert ports["node0001/rxe1/1"] == ("10.78.0.1", 18523, None)
    assert [cluster._eps[i][5] for i in (0, 1)] == [18522, 18523]
    (v,) = result.verdicts
    assert v.subject == "node0002/rxe1/1"
    assert v.next == (
        "on node0001: ibtool ping --server --dev rxe1/1 --port 18523",
        "on node0002: ibtool doctor --dev rxe1/1 --port 18523 10.78.0.1",
    )


def test_a_black_hole_in_a_group_of_four_is_quarantined_across_the_middle_shift():
    """In a group of 4 the middle shift pairs a node's partners with it both ways: that round
    says nothing of it, and must not clear what rounds 1 and 3 said (the testbed's mesh)."""
    black = "node0004/rxe0/1"
    result, said = _run(FakeCluster(4, 1, black={black}))
    (v,) = result.verdicts
    assert v.subject == black and v.why.startswith("quarantined after rounds 1 and 3: every pair")
    assert result.retried == (0, 0)  # a quarantined endpoint's pairs are not retried


def test_with_bw_the_bursts_retransmissions_are_not_a_lossy_link():
    """The testbed's bursts made every port resend by the hundred: a healthy mesh with --bw
    names no one for it."""
    result, _ = _run(FakeCluster(6, 1, resends={"node0002/rxe0/1"}, jitter=True), bw=True)
    assert result.verdicts == []
    result, _ = _run(FakeCluster(6, 1, resends={"node0002/rxe0/1"}, jitter=True))
    assert _named(result) == {("endpoint", "WARN", "node0002/rxe0/1")}


def test_a_pair_slow_once_is_retried_and_a_late_reply_is_host_delay():
    """A stalled host's late replies: one pair's p90 at 40 ms, its retry at 3.6 us: no
    verdict (the testbed's black-hole mesh named such a pair a slow path)."""
    a, b = "node0002/rxe0/1", "node0001/rxe0/1"
    cluster = FakeCluster(6, 1, flaky=[(a, b)], stalled=True)
    result, _ = _run(cluster)
    assert result.verdicts == [] and result.retried == (2, 2)
    slow = [p for p in result.pairs if p.error]
    assert all(p.error == "20/20 answered, p90 40.0 ms; retried after the last round: 20/20 "
               "answered, p90 3.6 us (a stall, not the network)" for p in slow)  # fmt: skip
    result, _ = _run(FakeCluster(6, 1, flaky=[(a, b)], stalled=True), retry=False)
    assert _named(result) == {("path", "WARN", f"{b} <-> {a}")}
