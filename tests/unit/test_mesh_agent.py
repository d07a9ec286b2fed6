"""`ibtool mesh --agent` on what real adapters show (fixture trees in the kernel's formats): the
endpoints it announces, and how it reads its coordinator (bounded, ends on EOF or silence,
builds nothing before a plan). Its pings between real kernels: tests/integration/test_mesh.py."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from ibtool.host import Host
from ibtool.mesh import protocol
from ibtool.mesh.agent import Agent, Lines, local_endpoints, quantile
from tests.fixtures import sysfs_trees


def _host(name: str, tmp_path, warnings: list | None = None) -> Host:
    root = sysfs_trees.build(name, tmp_path)
    return Host(str(root), warn=(warnings if warnings is not None else []).append)


def test_roce_endpoint_is_its_gid_address(tmp_path):
    host = _host("mlx5_roce", tmp_path)
    (ep,) = local_endpoints(host, lambda: [])
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
        "driver": "mlx5_core",
        "kernel": host.kernel_release(),
        "prefix": None,  # the host's addresses (here none) say it
    }
    with_prefix = local_endpoints(
        _host("mlx5_roce", tmp_path / "2"), lambda: [("enp3s0f0", "192.168.10.1", 24)]
    )
    assert with_prefix[0]["prefix"] == 24
    # what the coordinator accepts of it
    hello = {"t": "hello", "v": protocol.VERSION, "id": "0" * 16, "node": "n1", "endpoints": [ep]}
    assert protocol.parse_agent(json.dumps(hello))["endpoints"][0]["address"] == "192.168.10.1"


def test_infiniband_endpoints_take_their_ipoib_address(tmp_path):
    up, down = local_endpoints(_host("mlx5_ib_hca", tmp_path), lambda: [("ib0", "10.9.0.7", 16)])
    assert (up["link_layer"], up["address"], up["gid_index"]) == ("InfiniBand", "10.9.0.7", None)
    assert up["prefix"] == 16
    assert (down["port"], down["state"], down["problem"]) == (2, "DOWN", None)


def test_an_infiniband_endpoint_says_its_lid_and_node_guid_for_the_cable_analysis(tmp_path):
    up, down = local_endpoints(_host("mlx5_ib_hca", tmp_path), lambda: [("ib0", "10.9.0.7", 16)])
    assert (up["lid"], up["guid"]) == (28, "9803:9b03:009f:cfd6")  # sysfs lid, node_guid
    assert "lid" not in down and "guid" not in down  # down: LID 0, no place in the subnet
    hello = {"t": "hello", "v": protocol.VERSION, "id": "0" * 16, "node": "n1",
             "endpoints": [up, down]}  # fmt: skip
    first, second = protocol.parse_agent(json.dumps(hello))["endpoints"]
    assert (first["lid"], first["guid"]) == (28, 0x98039B03009FCFD6)
    assert (second["lid"], second["guid"]) == (None, None)
    (roce,) = local_endpoints(_host("mlx5_roce", tmp_path / "roce"), lambda: [])
    assert "lid" not in roce and "guid" not in roce


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

    started, stopped = threading.Event(), []

    def probe(ladder, hw, source, target, plan, stop, port=None):
        started.set()
        stop.wait(60)  # a long pair: 100,000 pings at 20 a second
        stopped.append(stop.is_set())
        return [1, 3, 3, 1.0, 1.0, 1.0, False, "stopped: the mesh ended"]

    def setup(self, plan, mine):
        self.plan, self.mine = plan, mine
        self.addresses, self.skip = {0: "10.0.0.1", 1: "10.0.0.2"}, set()
        self.up, self.ports = {0: True, 1: True}, {0: 18521, 1: 18521}
        self.dests = {0: [1]}
        self.own = {0: 0}
        self.ladders = {0: object()}

    monkeypatch.setattr(agent_mod, "probe", probe)
    monkeypatch.setattr(agent_mod.Agent, "_setup", setup)
    monkeypatch.setattr(agent_mod.Agent, "close", lambda self: self.stop.set())
    r, w = os.pipe()
    said: list[dict] = []
    agent = Agent(_host("mlx5_roce", tmp_path), said.append, lambda line: None)
    plan = {"t": "plan", "v": 2, "n": 1, "endpoints": [[0, "a" * 16, 0, "10.0.0.1", True]],
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
    plan = {"t": "plan", "v": 2, "n": 1, "endpoints": [[0, "a" * 16, 0, "10.0.0.1", True]],
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
    hello = {"t": "hello", "v": protocol.VERSION, "id": "0" * 16, "node": "n1", "endpoints": [ep]}
    (got,) = protocol.parse_agent(json.dumps(hello))["endpoints"]
    assert got["rate"].startswith("\\x1b[31m100 Gb/sec") and len(got["rate"]) <= 67
    old = {k: v for k, v in ep.items() if k not in ("rate", "fw")}  # an older agent's hello
    (got,) = protocol.parse_agent(json.dumps({**hello, "endpoints": [old]}))["endpoints"]
    assert (got["rate"], got["fw"]) == (None, None)
    ready = {"t": "ready", "problems": {}, "mtu": {"0": 4096}}
    assert protocol.parse_agent(json.dumps(ready))["mtu"] == {0: 4096}
    with pytest.raises(protocol.AgentError, match="MTU"):
        protocol.parse_agent(json.dumps({**ready, "mtu": {"0": 9000}}))


class _Clients:
    """ping.client.Client's stand-in for agent.probe: each connection a QP of its own, its
    pings lost as `lose(qp, size, seq)` says, 50 us a round trip."""

    def __init__(self, lose=lambda qp, size, seq: False):
        self.lose, self.made, self.closed = lose, [], 0
        clients = self

        class Client:
            def __init__(self, ladder, host, port, size, mode, timeout, path, hw=None,
                         source=None, connect_timeout=None):  # fmt: skip
                self.qp, self.size, self.mode, self.path = len(clients.made), size, mode, path
                self.session, self.hw_us = None, None
                clients.made.append(self)

            def connect(self):
                self.session = SimpleNamespace(close=lambda: None)

            def ping(self, seq):
                from ibtool.rdma.completions import CompletionTimeout

                if clients.lose(self.qp, self.size, seq):
                    raise CompletionTimeout(f"ping {seq}: no reply before the timeout")
                return 50.0

            def close(self):
                clients.closed += 1

        self.Client = Client


def _probe(monkeypatch, clients, **plan):
    import threading

    from ibtool.mesh.agent import probe
    from ibtool.rdma.ping import client as client_mod

    monkeypatch.setattr(client_mod, "Client", clients.Client)
    ladder = SimpleNamespace(port_attr=SimpleNamespace(active_mtu=5))  # IBV_MTU_4096
    base = {"mode": "send", "timeout": 0.01, "tcp_port": 18521, "count": 20, "size": 64,
            "rate": 1e5, "abandon": 3, "qp_timeout": 14, "full": 3, "qps": 1, "bw": False,
            "path": {"sl": 0, "tclass": 0, "pkey_index": 0}}  # fmt: skip
    return probe(ladder, None, "10.0.0.1", "10.0.0.2", {**base, **plan}, threading.Event())


def test_a_pair_s_pings_are_spread_over_its_qps_and_a_silent_one_is_named(monkeypatch):
    clients = _Clients(lose=lambda qp, size, seq: qp == 1)  # one ECMP path drops
    row = _probe(monkeypatch, clients, qps=4)
    assert [(c.size, c.path.traffic_class) for c in clients.made] == [(64, 0)] * 4
    assert row[:3] == [1, 18, 15] and row[8] == {"qps": [4, 1]}  # QP 1 given up after 3
    assert row[7] == (
        "1 of 4 QPs lost every ping while the others were answered: some of "
        "the pair's ECMP paths drop (a QP's UDP source port picks its path)"
    )
    assert clients.closed == 4


def test_a_black_hole_costs_two_qps_not_all_of_them(monkeypatch):
    clients = _Clients(lose=lambda qp, size, seq: True)
    row = _probe(monkeypatch, clients, qps=8)
    assert len(clients.made) == 2 and row[1:3] == [6, 0]
    assert row[7].startswith("abandoned after 3 losses in a row: ping 3: no reply")


def test_full_payload_pings_follow_a_whole_series_on_the_job_s_path(monkeypatch):
    clients = _Clients(lose=lambda qp, size, seq: size == 4096)  # a switch port at 1500
    path = {"sl": 3, "tclass": 104, "pkey_index": 2}
    row = _probe(monkeypatch, clients, path=path, qp_timeout=18)
    assert [(c.size, c.mode.name) for c in clients.made] == [(64, "SEND"), (4096, "SEND")]
    p = clients.made[1].path
    assert (p.sl, p.traffic_class, p.pkey_index, p.ack_timeout) == (3, 104, 2, 18)
    assert row[:3] == [1, 20, 20] and row[8] == {"full": [4096, 3, 0]}
    assert row[7].startswith("0/3 pings of 4096 bytes (the full payload of an MTU of 4096) "
                             "answered: abandoned after 3 losses")  # fmt: skip
    healthy = _Clients()
    assert _probe(monkeypatch, healthy, full=0)[8] is None and len(healthy.made) == 1
    lossy = _Clients(lose=lambda qp, size, seq: size == 64 and seq == 5)
    row = _probe(monkeypatch, lossy)
    assert row[2] == 19 and len(lossy.made) == 1  # no full-payload pings: already bad


def test_bw_is_a_burst_of_megabyte_writes_its_first_not_counted(monkeypatch):
    from ibtool.mesh import protocol

    clients = _Clients()
    row = _probe(monkeypatch, clients, bw=True)
    burst = clients.made[2]
    assert (burst.size, burst.mode.name) == (protocol.BW_SIZE, "WRITE_IMM")
    assert row[8] == {"full": [4096, 3, 3], "bw": round(2 * (1 << 20) * 8 / 50 / 1e3, 3)}
    assert protocol.parse_agent(json.dumps(
        {"t": "result", "r": 0, "pairs": [[0, 1, *row]]}))["pairs"][0][10] == row[8]  # fmt: skip


@pytest.mark.parametrize("extra", [{"full": [4000, 3, 0]}, {"full": [4096, 3, 4]},
                                   {"qps": [4, 5]}, {"bw": float("nan")}, {"bw": -1},
                                   {"what": 1}, [1, 2], {"qps": [4, True]}])  # fmt: skip
def test_a_pair_s_extras_are_checked(extra):
    pair = [0, 1, 1, 20, 20, 1.0, 1.0, 1.0, False, None, extra]
    with pytest.raises(protocol.AgentError):
        protocol.parse_agent(json.dumps({"t": "result", "r": 0, "pairs": [pair]}))


def test_an_infiniband_port_without_ipoib_talks_over_the_management_address(tmp_path):
    """As ibv_rc_pingpong: the TCP exchange over any address that reaches the node, the RDMA
    by LID. Each such port of a node gets a TCP port of its own on that one address."""
    from ibtool.mesh.agent import side_address

    up, down = local_endpoints(_host("mlx5_ib_hca", tmp_path), lambda: [],
                               side=lambda: "10.78.0.3")  # fmt: skip
    assert (up["address"], up["side"], up["problem"], up["prefix"]) == ("10.78.0.3", 1, None, None)
    hello = {
        "t": "hello",
        "v": protocol.VERSION,
        "id": "0" * 16,
        "node": "n1",
        "endpoints": [up, down],
    }
    assert protocol.parse_agent(json.dumps(hello))["endpoints"][0]["side"] == 1
    # with an IPoIB address, that one, as before
    ipoib = [("ib0", "10.9.0.7", 16)]
    (up, _) = local_endpoints(_host("mlx5_ib_hca", tmp_path / "2"), lambda: ipoib,
                              side=lambda: "10.78.0.3")  # fmt: skip
    assert (up["address"], "side" in up) == ("10.9.0.7", False)
    # no side address known: the port's problem says why
    (up, _) = local_endpoints(_host("mlx5_ib_hca", tmp_path / "3"), lambda: [], side=lambda: None)
    assert up["address"] is None and up["problem"].startswith("no IP address on ib0")
    assert side_address({"SSH_CONNECTION": "10.78.0.1 40000 10.78.0.3 22"}) == "10.78.0.3"
    assert side_address({"SSH_CONNECTION": "::1 40000 ::1 22"}) is None  # loopback: no use
    assert side_address({"SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1"}) is None


def test_a_burst_slower_than_the_timeout_is_a_bound_not_nothing(monkeypatch):
    """A shaped port (the testbed's tbf at 4 Mb/s) takes longer than --timeout for a megabyte:
    the pair's bandwidth is below 2 MiB over the timeout, so the port is named by it."""
    clients = _Clients(lose=lambda qp, size, seq: size == 1 << 20 and seq > 1)
    row = _probe(monkeypatch, clients, bw=True, timeout=5.0)
    assert row[8]["bw"] == round(2 * (1 << 20) * 8 / 5e6 / 1e3, 6)
    assert row[7].startswith("bandwidth burst: ") and row[7].endswith("(below 0.00336 Gb/s)")


@pytest.mark.parametrize("bad", [
    {"quiet": {"0": [1]}}, {"quiet": {"0": [-1, 2000]}}, {"quiet": {"x": [1, 2]}},
    {"quiet": {str(k): [0, 1] for k in range(65)}}, {"quiet": [[0, 1]]},
    {"retrans": {"0": True}},
])  # fmt: skip
def test_a_result_s_quiet_window_and_counters_are_checked(bad):
    with pytest.raises(protocol.AgentError):
        protocol.parse_agent(json.dumps({"t": "result", "r": 0, "pairs": [], **bad}))


@pytest.mark.parametrize("field", [{"prefix": 129}, {"prefix": "24"}, {"side": 0},
                                   {"side": 65}, {"kernel": 7}, {"lid": 0}, {"lid": 0xC000},
                                   {"lid": "28"}, {"guid": 5}, {"guid": "9803:9b03:009f"},
                                   {"guid": "9803:9B03:009f:cfd6"}])  # fmt: skip
def test_a_hello_s_new_facts_are_checked(field):
    ep = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand",
          "address": "10.0.0.1", "gid_index": None, "hw": False, "problem": None,
          **field}  # fmt: skip
    with pytest.raises(protocol.AgentError):
        protocol.parse_agent(json.dumps({"t": "hello", "v": protocol.VERSION, "id": "0" * 16,
                                         "node": "n", "endpoints": [ep]}))  # fmt: skip


@pytest.mark.parametrize("bad", [{"t": "retried", "pairs": "x"},
                                 {"t": "retried", "pairs": [[0, 1]]},
                                 {"t": "retried", "pairs": [[0] * 10] * 1025}])  # fmt: skip
def test_a_retried_message_is_checked(bad):
    with pytest.raises(protocol.AgentError):
        protocol.parse_agent(json.dumps(bad))


@pytest.mark.parametrize("bad", [{"path": {"sl": 16}}, {"path": {"tclass": 256}},
                                 {"path": []}, {"qps": 17}, {"bw": 1}, {"full": -1},
                                 {"endpoints": [[0, "a" * 16, 0, "10.0.0.1", True, 70000]]},
                                 {"endpoints": [[1, "a" * 16, 0, "10.0.0.1", True]]},
                                 {"endpoints": [[0, "a" * 16, 0, "10.0.0.1", True]] * 2},
                                 {"n": 1 << 21},
                                 ])  # fmt: skip
def test_a_plan_s_path_and_probes_are_checked(bad):
    plan = {"t": "plan", "v": 2, "n": 1, "endpoints": [[0, "a" * 16, 0, "10.0.0.1", True]],
            "schedule": {"groups": {"0": [0]}, "shifts": {"0": []}}, "count": 20, "size": 64,
            "tcp_port": 18521, "mode": "send", "rate": 100, "timeout": 2}  # fmt: skip
    protocol.parse_coordinator(json.dumps(plan))
    with pytest.raises(protocol.AgentError):
        protocol.parse_coordinator(json.dumps({**plan, **bad}))
