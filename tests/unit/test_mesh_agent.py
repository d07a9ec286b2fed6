"""`ibtool mesh --agent` on what real adapters show (fixture trees in the kernel's formats): the
endpoints it announces, and how it reads its coordinator (bounded, ends on EOF or silence,
builds nothing before a plan). Its pings between real kernels: tests/integration/test_mesh.py."""

from __future__ import annotations

import json
import os

import pytest

from ibtool.host import Host
from ibtool.mesh import protocol
from ibtool.mesh.agent import Agent, Lines, local_endpoints, quantile
from tests.fixtures import sysfs_trees


def _host(name: str, tmp_path, warnings: list | None = None) -> Host:
    root = sysfs_trees.build(name, tmp_path)
    return Host(str(root), warn=(warnings if warnings is not None else []).append)


def test_roce_endpoint_is_its_gid_address(tmp_path):
    (ep,) = local_endpoints(_host("mlx5_roce", tmp_path), lambda: [])
    assert ep == {
        "device": "mlx5_0",
        "port": 1,
        "state": "ACTIVE",
        "link_layer": "Ethernet",
        "address": "192.168.10.1",
        "gid_index": 3,
        "hw": False,
        "problem": None,
        "rate": "100 Gb/sec (4X EDR)",
        "fw": "22.36.1010",
    }
    # what the coordinator accepts of it
    hello = {"t": "hello", "v": 1, "id": "0" * 16, "node": "n1", "endpoints": [ep]}
    assert protocol.parse_agent(json.dumps(hello))["endpoints"][0]["address"] == "192.168.10.1"


def test_infiniband_endpoints_take_their_ipoib_address(tmp_path):
    up, down = local_endpoints(_host("mlx5_ib_hca", tmp_path), lambda: [("ib0", "10.9.0.7", 16)])
    assert (up["link_layer"], up["address"], up["gid_index"]) == ("InfiniBand", "10.9.0.7", None)
    assert (down["port"], down["state"], down["problem"]) == (2, "DOWN", None)


def test_a_broken_device_is_an_endpoint_with_its_problem_and_the_others_are_fine(tmp_path):
    warnings: list[str] = []
    broken, good = local_endpoints(_host("broken_device", tmp_path, warnings), lambda: [])
    assert broken["state"] == "UNKNOWN" and broken["address"] is None
    assert good["state"] == "ACTIVE" and good["address"] == "192.168.10.1"
    assert any("malformed value 'garbage'" in w for w in warnings)


def test_rails_follow_the_kernel_s_numbering_not_the_alphabet(tmp_path):
    # mlx5_2 is rail 2, not rail 13 behind mlx5_10 .. mlx5_19
    endpoints = local_endpoints(_host("sriov_vfs", tmp_path), lambda: [])
    devices = [ep["device"] for ep in endpoints]
    assert devices[:12] == [f"mlx5_{i}" for i in range(12)]
    assert len(devices) == 501 and devices[-1] == "mlx5_500"


def test_a_port_with_no_routable_address_says_why(tmp_path):
    active, _ = local_endpoints(_host("cxgb4_iwarp", tmp_path), lambda: [])
    assert active["address"] is None and "no RoCE v2 GID" in active["problem"]


def _pipe(data: bytes, close: bool = True) -> int:
    r, w = os.pipe()
    os.write(w, data)
    if close:
        os.close(w)
    return r


def test_lines_are_bounded_and_end_on_eof_or_silence():
    fd = _pipe(b'{"t":"end"}\npartial')
    lines = Lines(fd, idle=5)
    assert lines.next() == b'{"t":"end"}' and lines.next() is None  # EOF: the half line dropped
    silent = Lines(_pipe(b"", close=False), idle=0.05)
    assert silent.next() is None
    with pytest.raises(protocol.AgentError, match="over the bound"):
        Lines(_pipe(b"x" * 5000), limit=1000).next()


def test_an_agent_whose_coordinator_leaves_before_the_plan_builds_nothing(tmp_path):
    said: list[dict] = []
    agent = Agent(_host("mlx5_roce", tmp_path), said.append, lambda line: None)
    assert agent.run(Lines(_pipe(b""))) == 0
    assert [m["t"] for m in said] == ["hello"] and agent.ladders == {} and agent.servers == []


def test_an_agent_refuses_a_plan_that_is_not_one(tmp_path):
    agent = Agent(_host("mlx5_roce", tmp_path), lambda m: None, lambda line: None)
    with pytest.raises(protocol.AgentError):
        agent.run(Lines(_pipe(b'{"t":"plan","v":1,"endpoints":"all"}\n')))
    assert agent.ladders == {}


def test_quantiles_are_nearest_rank():
    values = sorted(float(v) for v in range(1, 21))
    assert (quantile(values, 0.5), quantile(values, 0.9), quantile(values, 0.99)) == (10, 18, 20)
    assert quantile([], 0.5) is None and quantile([7.0], 0.99) == 7.0


def test_an_end_or_eof_mid_round_stops_the_pings_in_flight(tmp_path, monkeypatch):
    """A round's pings run while the coordinator's words are read: its end (or its ssh gone)
    stops them at once, and the agent closes everything, not at the round's end."""
    import threading
    import time

    from ibtool.mesh import agent as agent_mod
    from ibtool.mesh.schedule import Partners, Schedule

    started, stopped = threading.Event(), []

    def probe(ladder, hw, source, target, plan, stop):
        started.set()
        stop.wait(60)  # a long pair: 100,000 pings at 20 a second
        stopped.append(stop.is_set())
        return [1, 3, 3, 1.0, 1.0, 1.0, False, "stopped: the mesh ended"]

    def setup(self, plan, mine):
        self.plan, self.mine = plan, mine
        self.addresses, self.up, self.skip = ["10.0.0.1", "10.0.0.2"], [True, True], set()
        self.partners = Partners(Schedule({"rail 0": (0, 1)}, {"rail 0": (1,)}), 2)
        self.own = {0: 0}
        self.ladders = {0: object()}

    monkeypatch.setattr(agent_mod, "probe", probe)
    monkeypatch.setattr(agent_mod.Agent, "_setup", setup)
    monkeypatch.setattr(agent_mod.Agent, "close", lambda self: self.stop.set())
    r, w = os.pipe()
    said: list[dict] = []
    agent = Agent(_host("mlx5_roce", tmp_path), said.append, lambda line: None)
    plan = {"t": "plan", "v": 1, "endpoints": [["a" * 16, 0, "10.0.0.1", True]],
            "schedule": {"groups": {"rail 0": [0]}, "shifts": {"rail 0": []}}, "count": 1,
            "size": 64, "mode": "send", "rate": 20, "timeout": 2, "tcp_port": 18521}  # fmt: skip
    os.write(w, (json.dumps(plan) + "\n" + '{"t":"round","r":0}\n').encode())
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(agent.run(Lines(r, idle=60))))
    t.start()
    assert started.wait(30)
    t0 = time.monotonic()
    os.close(w)  # the coordinator's ssh is gone
    t.join(30)
    assert done == [0] and stopped == [True] and time.monotonic() - t0 < 10
    assert [m["t"] for m in said] == ["hello"]  # no result for a round the mesh abandoned


def test_a_pair_is_given_up_after_losses_in_a_row_not_after_scattered_ones():
    from ibtool.mesh.agent import GiveUp

    black = GiveUp(3)
    assert [black.loss() for _ in range(3)] == [False, False, True]
    lossy = GiveUp(3)  # half lost, never three in a row: measured whole
    verdicts = []
    for _ in range(10):
        verdicts.append(lossy.loss())
        lossy.reply()
    assert not any(verdicts)


def test_the_plan_carries_abandon_and_an_old_plan_means_three():
    plan = {"t": "plan", "v": 1, "endpoints": [["a" * 16, 0, "10.0.0.1", True]],
            "schedule": {"groups": {"0": [0]}, "shifts": {"0": []}}, "count": 20, "size": 64,
            "tcp_port": 18521, "mode": "send", "rate": 100, "timeout": 2}  # fmt: skip
    assert protocol.parse_coordinator(json.dumps(plan))["abandon"] == 3
    assert protocol.parse_coordinator(json.dumps({**plan, "abandon": 5}))["abandon"] == 5
    with pytest.raises(protocol.AgentError, match="abandon"):
        protocol.parse_coordinator(json.dumps({**plan, "abandon": 0}))


@pytest.mark.parametrize(
    ("only", "exclude", "expected"),
    [
        ((), (), ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_10/1"]),
        (("mlx5_[0-2]",), (), ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1"]),
        ((), ("mlx5_1", "mlx5_10/1"), ["mlx5_0/1", "mlx5_2/1"]),
        (("mlx5_*/1",), ("mlx5_2/1",), ["mlx5_0/1", "mlx5_1/1", "mlx5_10/1"]),
        (("mlx5_*/2",), (), []),
    ],
)
def test_dev_and_exclude_choose_the_ports_meshed(only, exclude, expected):
    from ibtool.mesh.agent import PortChoice

    choose = PortChoice(only, exclude)
    ports = [(f"mlx5_{i}", 1) for i in (0, 1, 2, 10)]
    assert [f"{d}/{p}" for d, p in ports if choose(d, p)] == expected


def test_the_agent_lists_only_the_chosen_ports(tmp_path):
    from ibtool.mesh.agent import PortChoice

    endpoints = local_endpoints(_host("sriov_vfs", tmp_path), lambda: [], PortChoice(["mlx5_1?"]))
    assert [ep["device"] for ep in endpoints] == [f"mlx5_{i}" for i in range(10, 20)]


def test_a_port_s_facts_from_an_agent_are_checked_and_bounded():
    ep = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
          "address": "10.0.0.1", "gid_index": 3, "hw": False, "problem": None,
          "rate": "\x1b[31m100 Gb/sec" + "x" * 200, "fw": "22.36.1010"}  # fmt: skip
    hello = {"t": "hello", "v": 1, "id": "0" * 16, "node": "n1", "endpoints": [ep]}
    (got,) = protocol.parse_agent(json.dumps(hello))["endpoints"]
    assert got["rate"].startswith("\\x1b[31m100 Gb/sec") and len(got["rate"]) <= 67
    old = {k: v for k, v in ep.items() if k not in ("rate", "fw")}  # an older agent's hello
    (got,) = protocol.parse_agent(json.dumps({**hello, "endpoints": [old]}))["endpoints"]
    assert (got["rate"], got["fw"]) == (None, None)
    ready = {"t": "ready", "problems": {}, "mtu": {"0": 4096}}
    assert protocol.parse_agent(json.dumps(ready))["mtu"] == {0: 4096}
    with pytest.raises(protocol.AgentError, match="MTU"):
        protocol.parse_agent(json.dumps({**ready, "mtu": {"0": 9000}}))
