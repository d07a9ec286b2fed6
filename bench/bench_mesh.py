#!/usr/bin/env python3
"""What `ibtool mesh` costs as the cluster grows.

    .venv/bin/python bench/bench_mesh.py simulate [NODES...]
        The coordinator, the schedule and the analysis over a simulated cluster of NODES x 8
        rails (tests/unit/mesh_fake.py: agents that speak the real protocol, their pings
        computed from injected faults), every shift: N - 1 rounds, every ordered pair once.
        Prints, per size: pairs, rounds, wall time, pairs a second, peak memory, and whether
        the verdicts named exactly the injected faults. Default sizes 64 128 256 512 1024.

    .venv/bin/python bench/bench_mesh.py blackhole [NODES]
        The mesh's own time (virtual: the simulated pings' timeouts and intervals, not this
        machine's speed) of NODES x 8 rails (default 1024), every round, healthy and with one
        black-holed endpoint (ACTIVE, every packet to it dropped), and their ratio: what the
        abandoned pairs and the quarantine hold it to. Also the CPU the coordinator spent.

    .venv/bin/python bench/bench_mesh.py fanout [AGENTS...]
        What the fan-out costs this process. First the plans: the bytes each agent is sent,
        and all of them, at NODES x 8 rails every round and --rounds 64 (the simulated
        cluster), against the one plan every agent got before they joined over TCP. Then
        AGENTS (default 50 100 200) real processes through ClusterShell's exec worker
        (tests/unit/mesh_agent_double.py: the protocol and the join, no RDMA), the
        coordinator under `prlimit --nofile=256`: the window it took, the most descriptors
        it held at once, and the wall time to a whole mesh of 2 rounds.

    tests/testbed/testbed mesh -- .venv/bin/python bench/bench_mesh.py testbed [REPEAT]
        In the mesh testbed's first node: `ibtool mesh` through ClusterShell over 2, 3, ... N
        nodes (the whole mesh, Python start-up on every node included), against the pile it
        replaces: every ordered pair pinged by hand with ibv_rc_pingpong (a server over ssh,
        a client here or there), one after another. Prints the time of each, their ratio, and
        the probes a second each endpoint sent during the mesh's rounds.

Under QEMU TCG absolute times are meaningless (a Python start-up is seconds there): the ratios
of one run, and how the time grows with N, are what to compare.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ibtool.mesh.run import Options, mesh  # noqa: E402
from ibtool.model.mesh import PairState  # noqa: E402

RAILS = 8


def simulate(sizes: list[int]) -> None:
    from tests.unit.mesh_fake import FakeCluster

    print(f"{'nodes':>6} {'endpoints':>9} {'rounds':>6} {'pairs':>9} {'seconds':>8} "
          f"{'pairs/s':>9} {'rss MiB':>8}  verdicts")  # fmt: skip
    for n in sizes:
        faults = {
            "down": {f"node{3:04d}/rxe2/1"},
            "slow": {f"node{n // 2:04d}/rxe5/1"},
            "lossy": {f"node{n - 5:04d}/rxe0/1"},
            "blocked": [(f"node{1:04d}/rxe1/1", f"node{n // 3:04d}/rxe1/1")],
            "silent": {f"node{n - 1:04d}"},
        }
        expect = {
            ("endpoint", f"node{3:04d}/rxe2/1"),
            ("endpoint", f"node{n // 2:04d}/rxe5/1"),
            ("endpoint", f"node{n - 5:04d}/rxe0/1"),
            ("path", f"node{1:04d}/rxe1/1 <-> node{n // 3:04d}/rxe1/1"),
            ("node", f"node{n - 1:04d}"),
        }
        cluster = FakeCluster(n, RAILS, **faults)
        t0 = time.perf_counter()
        result = mesh(cluster, Options(), ["ibtool", "mesh", "--agent"], lambda line: None,
                      clock=cluster.clock)  # fmt: skip
        took = time.perf_counter() - t0
        pairs = len(result.pairs)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        got = {(v.culprit.value, v.subject) for v in result.verdicts}
        verdict = "exactly the 5 injected" if got == expect else f"WRONG: {sorted(got ^ expect)}"
        print(f"{n:>6} {len(result.endpoints):>9} {result.rounds:>6} {pairs:>9} {took:>8.2f} "
              f"{pairs / took:>9.0f} {rss:>8.0f}  {verdict}", flush=True)  # fmt: skip


def blackhole(n: int) -> None:
    from tests.unit.mesh_fake import FakeCluster

    black = f"node{n // 2:04d}/rxe3/1"
    print(f"{'mesh':>10} {'rounds':>6} {'mesh s':>9} {'ratio':>6} {'cpu s':>7}  verdicts")
    healthy_s = None
    for label, faults in (("healthy", {}), ("black hole", {"black": {black}})):
        cluster = FakeCluster(n, RAILS, **faults)
        t0 = time.process_time()
        result = mesh(cluster, Options(), ["ibtool", "mesh", "--agent"], lambda line: None,
                      clock=cluster.clock)  # fmt: skip
        cpu = time.process_time() - t0
        healthy_s = healthy_s or result.elapsed
        said = "; ".join(f"{v.level.name} {v.subject}: {v.why[:60]}" for v in result.verdicts)
        ratio = result.elapsed / healthy_s
        print(f"{label:>10} {result.rounds:>6} {result.elapsed:>9.1f} {ratio:>6.3f} "
              f"{cpu:>7.1f}  {said or 'none'}", flush=True)  # fmt: skip


def plans(sizes: list[int]) -> None:
    from ibtool.mesh import protocol
    from ibtool.mesh.schedule import plan as schedule_of
    from tests.unit.mesh_fake import FakeCluster

    print(f"{'nodes':>6} {'rounds':>7} {'one plan':>10} {'agent max':>10} {'all agents':>11} "
          f"{'ratio':>6}")  # fmt: skip
    for n in sizes:
        for rounds in (None, 64):
            cluster = FakeCluster(n, RAILS)
            result = mesh(cluster, Options(rounds=rounds), ["ibtool"], lambda line: None,
                          clock=cluster.clock)  # fmt: skip
            seen: dict[str, int] = {}
            ids = []
            for e in result.endpoints:  # (agent id, the endpoint's index in its node's hello)
                ids.append((cluster.ids[e.node], seen.get(e.node, 0)))
                seen[e.node] = seen.get(e.node, 0) + 1
            whole = protocol.plan_message(
                result.endpoints, ids, schedule_of(result.endpoints, False, rounds),
                result.settings,
            )  # fmt: skip
            before = len(whole) * n  # every agent the whole plan
            print(f"{n:>6} {rounds or 'all':>7} {len(whole):>10} {cluster.plan_max:>10} "
                  f"{cluster.plan_bytes:>11} {before / cluster.plan_bytes:>6.1f}",
                  flush=True)  # fmt: skip


FANOUT = """
import os, resource, sys, threading, time
sys.path.insert(0, {root!r})
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from ibtool.mesh.engines import ClusterShellEngine
from ibtool.mesh.run import Options, mesh
most = [0]
def count():
    while True:
        most[0] = max(most[0], len(os.listdir("/proc/self/fd")))
        time.sleep(0.01)
threading.Thread(target=count, daemon=True).start()
engine = ClusterShellEngine("n[1-{n}]", remote=False)
t0 = time.monotonic()
result = mesh(engine, Options(count=5, rounds=2, quiet=0.0), [sys.executable, {double!r}, "%h"],
              lambda line: None, listen=("127.0.0.1", 0))
print(engine.window, most[0], len(result.endpoints), len(result.verdicts),
      round(time.monotonic() - t0, 1))
"""


def fanout(sizes: list[int]) -> None:
    plans([64, 256, 1024])
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    double = os.path.join(root, "tests", "unit", "mesh_agent_double.py")
    print(f"\n{'agents':>6} {'nofile':>6} {'window':>6} {'most fds':>8} {'meshed':>6} "
          f"{'verdicts':>8} {'wall s':>6}")  # fmt: skip
    for n in sizes:
        proc = _run([sys.executable, "-c", FANOUT.format(root=root, double=double, n=n)])
        if proc.returncode:
            print(f"{n:>6} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        window, most, meshed, verdicts, wall = proc.stdout.split()
        print(f"{n:>6} {256:>6} {window:>6} {most:>8} {meshed:>6} {verdicts:>8} {wall:>6}",
              flush=True)  # fmt: skip


def _run(argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def testbed(repeat: int) -> None:
    info = json.load(open(os.environ.get("IBTOOL_TESTBED_INFO", "/run/ibtool-testbed.json")))
    nodes = info["nodes"].split() if isinstance(info["nodes"], str) else list(info["nodes"])
    ibtool = [sys.executable, "-m", "ibtool"]
    print(f"{'nodes':>5} {'mesh s':>7} {'pile s':>7} {'ratio':>6} {'pairs':>5} "
          f"{'round s':>8} {'probes/s/endpoint':>18}")  # fmt: skip
    for n in range(2, len(nodes) + 1):
        subset = ",".join(nodes[:n])
        for _ in range(repeat):
            t0 = time.monotonic()
            proc = _run(ibtool + ["-j", "mesh", subset, "--no-save", "-c", "20",
                                  "--qp-timeout", "18"])  # fmt: skip
            mesh_s = time.monotonic() - t0
            if proc.returncode not in (0, 1):
                raise SystemExit(f"mesh {subset}: exit {proc.returncode}\n{proc.stderr}")
            result = json.loads(proc.stdout)
            pairs = [p for p in result["pairs"] if p["state"] == PairState.PROBED.name]
            rounds = result.get("round_seconds") or []
            round_s = sum(rounds) / len(rounds) if rounds else float("nan")
            rate = 20 / round_s if rounds else float("nan")
            pile_s = _pile(nodes[:n], info)
            print(f"{n:>5} {mesh_s:>7.1f} {pile_s:>7.1f} {mesh_s / pile_s:>6.2f} "
                  f"{len(pairs):>5} {round_s:>8.2f} {rate:>18.1f}", flush=True)  # fmt: skip


def _pile(nodes: list[str], info: dict) -> float:
    """Every ordered pair by hand: ibv_rc_pingpong -n 20, its server started over ssh on the
    pinged node, its client over ssh on the pinging one, one pair after another."""
    addresses = {n: f"10.77.0.{i + 1}" for i, n in enumerate(info["nodes"].split())}
    dev = info.get("device", "rxe0")
    gid = str(info.get("gid_index", 1))
    t0 = time.monotonic()
    for a in nodes:
        for b in nodes:
            if a == b:
                continue
            server = subprocess.Popen(
                ["ssh", b, f"ibv_rc_pingpong -d {dev} -g {gid} -n 20 -p 18793"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                for _ in range(600):
                    if _run(["ssh", b, "ss -Hltn sport = :18793"]).stdout.strip():
                        break
                    time.sleep(0.1)
                client = _run(["ssh", a, f"ibv_rc_pingpong -d {dev} -g {gid} -n 20 -p 18793 "
                               f"{addresses[b]}"])  # fmt: skip
                if client.returncode != 0:
                    raise SystemExit(f"rc_pingpong {a} -> {b}: {client.stderr}")
            finally:
                server.wait(120)
    return time.monotonic() - t0


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "simulate"
    if what == "simulate":
        simulate([int(a) for a in sys.argv[2:]] or [64, 128, 256, 512, 1024])
    elif what == "blackhole":
        blackhole(int(sys.argv[2]) if len(sys.argv) > 2 else 1024)
    elif what == "testbed":
        testbed(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    elif what == "fanout":
        fanout([int(a) for a in sys.argv[2:]] or [50, 100, 200])
    else:
        raise SystemExit(
            "usage: bench_mesh.py simulate [NODES...] | blackhole [NODES] | fanout [AGENTS...] "
            "| testbed [REPEAT]"
        )
