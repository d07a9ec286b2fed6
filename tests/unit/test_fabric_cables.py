"""The health check's judgement of a cable's far end and of the SM (ibtool.model.fabric.cables),
on records: what the simulated fabric cannot hold still (a saturated counter, a cable moved to
another switch port, an idle master, a standby named as this port's SM)."""

from __future__ import annotations

import dataclasses

from ibtool.health.config import HealthConfig
from ibtool.model.fabric import (
    Cable,
    FabricNode,
    FabricPort,
    NodeType,
    PortCounters,
    PortSpeed,
)
from ibtool.model.fabric.cables import judge_cable, judge_sm
from ibtool.model.fabric.sm import SmState, SubnetManager
from ibtool.model.health import Status
from ibtool.model.records import PhysState, PortState

SDR = PortSpeed(active=1, enabled=1, supported=1)
ERRORS = {
    "SymbolErrorCounter": 16, "LinkErrorRecoveryCounter": 8, "LinkDownedCounter": 8,
    "PortRcvErrors": 16, "PortXmitDiscards": 16, "VL15Dropped": 16, "PortXmitWait": 32,
}  # fmt: skip


def port(number: int, width: int = 2, enabled: int = 3) -> FabricPort:
    return FabricPort(number, 0x10 + number, 7, 0, PortState.ACTIVE, PhysState.LINK_UP,
                      width_active=width, width_enabled=enabled, width_supported=3,
                      speed=SDR)  # fmt: skip


def cable(values: dict | None = None, far_port: int = 17, width: int = 2, far_enabled=3):
    near = FabricNode(0xA, NodeType.CA, "mlx5_0", 1, {1: port(1, width)})
    far = FabricNode(0xB, NodeType.SWITCH, "leaf03", 36,
                     {far_port: port(far_port, width, far_enabled)})  # fmt: skip
    counters = None
    if values is not None:
        full = dict.fromkeys(ERRORS, 0) | values
        counters = PortCounters(0xB, far_port, 7, full, dict(ERRORS))
    return Cable("mlx5_0", near, far, far_port, counters=counters)


def judged(c, previous, config=None):
    config = config or HealthConfig()
    return judge_cable(c, previous, lambda n: config.threshold(n, "pma"), "first run")


def said(results):
    return [(r.status, r.summary, r.kind) for r in results]


def test_a_first_run_is_a_baseline_and_the_next_names_what_grew():
    results, kept = judged(cable({"SymbolErrorCounter": 3}), None)
    assert said(results) == [(Status.OK, "cable to leaf03/17: 4X SDR, first run", "")]
    assert kept["far"] == [0xB, 17] and kept["counters"]["SymbolErrorCounter"] == 3
    results, kept = judged(cable({"SymbolErrorCounter": 40, "LinkDownedCounter": 2}), kept)
    assert said(results) == [
        (Status.WARNING, "cable to leaf03/17: SymbolErrorCounter +37 since the last run "
                         "(warning 10)", "counter_errors"),
        (Status.WARNING, "cable to leaf03/17: link went down 2 times since the last run "
                         "(flap)", "link_flapped"),
    ]  # fmt: skip
    results, _ = judged(cable({"SymbolErrorCounter": 42, "LinkDownedCounter": 2}), kept)
    assert said(results) == [(Status.OK, "cable to leaf03/17: 4X SDR, SymbolErrorCounter +2 "
                                         "since the last run", "")]  # fmt: skip


def test_the_local_thresholds_apply_critical_included(tmp_path):
    from ibtool.health.config import load

    path = tmp_path / "health.toml"
    path.write_text('[thresholds]\nsymbol_error = { warning = "5", critical = "50" }\n')
    config = load(str(path), required=True)
    _, kept = judged(cable({}), None, config)
    results, _ = judged(cable({"SymbolErrorCounter": 60}), kept, config)
    assert said(results)[0][:2] == (
        Status.CRITICAL, "cable to leaf03/17: SymbolErrorCounter +60 since the last run "
        "(critical 50)",
    )  # fmt: skip


def test_a_cleared_counter_and_a_moved_cable_are_new_baselines():
    _, kept = judged(cable({"PortRcvErrors": 500}), None)
    results, kept = judged(cable({"PortRcvErrors": 0}), kept)
    assert said(results) == [(Status.OK, "cable to leaf03/17: 4X SDR, PortRcvErrors reset since "
                                         "the last run: new baseline", "")]  # fmt: skip
    results, kept = judged(cable({"PortRcvErrors": 900}, far_port=18), kept)
    assert said(results) == [(Status.OK, "cable to leaf03/18: 4X SDR, a new far end since the "
                                         "last run: new baseline", "")]  # fmt: skip
    assert kept["far"] == [0xB, 18]


def test_a_saturated_counter_congestion_and_a_silent_agent():
    results, _ = judged(cable({"SymbolErrorCounter": 0xFFFF}), None)
    assert said(results) == [(
        Status.WARNING, "cable to leaf03/17: SymbolErrorCounter saturated at 65535: clear it to "
        "count", "counter_saturated",
    )]  # fmt: skip
    _, kept = judged(cable({}), None)
    results, _ = judged(cable({"PortXmitWait": 10**6}), kept)  # counted, not alarmed
    assert said(results)[0][0] == Status.OK and "PortXmitWait +1000000" in said(results)[0][1]
    silent = dataclasses.replace(cable(None), silent="leaf03 (LID 7): its performance agent "
                                 "did not answer")  # fmt: skip
    results, kept_now = judged(silent, kept)
    assert said(results) == [(Status.WARNING, "cable to leaf03/17: leaf03 (LID 7): its "
                              "performance agent did not answer", "counters_silent")]  # fmt: skip
    assert kept_now is kept  # the baseline stays for the run it answers again


def test_a_link_trained_narrow_and_a_far_end_that_did_not_answer():
    results, _ = judged(cable({}, width=1, far_enabled=3), None)
    assert said(results)[0][0] == Status.CRITICAL and said(results)[0][2] == "width_degraded"
    near = FabricNode(0xA, NodeType.CA, "mlx5_0", 1, {1: port(1)})
    gone = Cable("mlx5_0", near, None, why="mlx5_0/1 is up, and its far end did not answer")
    results, _ = judged(gone, None)
    assert said(results)[0][0] == Status.WARNING and said(results)[0][2] == "far_end_silent"
    down = Cable("mlx5_0", near, None, why="mlx5_0/1 is DOWN")
    assert judged(down, None) == ([], None)  # the port check says it


def sm(state=SmState.MASTER, activity=100, guid=0x42):
    node = FabricNode(guid, NodeType.SWITCH, "spine01", 36, {})
    return SubnetManager(node, 0, 1, guid, 0, state, activity)


def test_the_sm_answering_moving_and_idle():
    results, kept = judge_sm("mlx5_0/1", 1, sm(), None, now=1000.0)
    assert said(results) == [(Status.OK, "subnet manager spine01 (LID 1): master", "")]
    results, kept2 = judge_sm("mlx5_0/1", 1, sm(activity=104), kept, now=1060.0)
    assert said(results) == [(Status.OK, "subnet manager spine01 (LID 1): master, activity +4 "
                                         "since the last run", "")]  # fmt: skip
    # too soon to tell: the older baseline stays, so close runs still catch an idle master
    results, kept3 = judge_sm("mlx5_0/1", 1, sm(activity=104), kept2, now=1070.0)
    assert said(results)[0][0] == Status.OK and kept3 is kept2
    results, _ = judge_sm("mlx5_0/1", 1, sm(activity=104), kept3, now=1100.0)
    assert said(results) == [(Status.CRITICAL, "subnet manager spine01 (LID 1): master, its "
                              "activity has not moved in 40 s: it stopped sweeping (hung); "
                              "restart it, or let a standby take over", "sm_idle")]  # fmt: skip
    # its count wraps at 32 bits
    results, _ = judge_sm("mlx5_0/1", 1, sm(activity=1), {**kept, "activity": 2**32 - 1},
                          now=1060.0)  # fmt: skip
    assert "activity +2 " in said(results)[0][1]
    # another master since: a new baseline
    results, _ = judge_sm("mlx5_0/1", 1, sm(guid=0x43), kept, now=1200.0)
    assert said(results)[0][:2] == (Status.OK, "subnet manager spine01 (LID 1): master (a new "
                                               "one since the last run)")  # fmt: skip


def test_no_sm_a_silent_one_and_a_standby():
    assert said(judge_sm("mlx5_0/1", 0, None, None, now=0.0)[0])[0][2] == "sm_unreachable"
    assert said(judge_sm("mlx5_0/1", 1, None, None, now=0.0)[0])[0][2] == "sm_unreachable"
    results, kept = judge_sm("mlx5_0/1", 1, sm(SmState.STANDBY), {"x": 1}, now=0.0)
    assert said(results) == [(
        Status.CRITICAL, "the subnet manager this port names, spine01 (LID 1), is STANDBY, not "
        "the master; check the SM (systemctl status opensm on its node; ibtool fabric sm)",
        "sm_not_master",
    )]  # fmt: skip
    assert kept == {"x": 1}


class NoMadLibraries:
    """A running host whose MAD libraries are not installed, its ports of `layer`."""

    live = True

    def __init__(self, layer):
        self.layer = layer

    def cables(self, bounds=None):
        from ibtool.errors import UnsupportedError

        raise UnsupportedError("ibtool fabric needs rdma-core's libibmad.so.5, which is not "
                               "installed", "apt install libibmad5")  # fmt: skip

    def ports(self, fields=()):
        from types import SimpleNamespace

        return [SimpleNamespace(device="mlx5_0", port=1, link_layer=self.layer)]


def test_without_the_mad_libraries_an_infiniband_host_is_unknown_and_a_roce_one_silent():
    from ibtool.model.records import LinkLayer
    from ibtool.plugin.context import CheckContext
    from plugins.fabric import check_fabric

    ib = list(check_fabric(CheckContext(NoMadLibraries(LinkLayer.INFINIBAND), HealthConfig())))
    assert said(ib) == [(
        Status.UNKNOWN, "far ends not checked: ibtool fabric needs rdma-core's libibmad.so.5, "
        "which is not installed (apt install libibmad5)", "",
    )]  # fmt: skip
    roce = CheckContext(NoMadLibraries(LinkLayer.ETHERNET), HealthConfig())
    assert list(check_fabric(roce)) == []


def test_a_host_without_an_infiniband_cable_keeps_nothing_in_the_state():
    from types import SimpleNamespace

    from ibtool.plugin.context import CheckContext
    from plugins.fabric import check_fabric

    host = SimpleNamespace(live=True, cables=lambda bounds=None: [])
    ctx = CheckContext(host, HealthConfig(), stateful=True)
    assert list(check_fabric(ctx)) == []
    assert ctx.kept is None  # the state file holds no "fabric" entry for a RoCE host


def test_a_state_file_not_ours_is_a_new_baseline_never_a_crash():
    wrong = {"SymbolErrorCounter": "500", "PortRcvErrors": True}
    for previous in ([1], "x", {"far": "leaf", "counters": [1]}, {"far": [0xB, 17],
                     "counters": wrong}):  # fmt: skip
        results, kept = judged(cable({"SymbolErrorCounter": 9}), previous)
        assert [r.status for r in results] == [Status.OK], previous
        assert kept["counters"]["SymbolErrorCounter"] == 9
    for previous in ([1], {"guid": 0x42, "activity": "1", "since": 0}, {"guid": 0x42,
                     "activity": 1, "since": "yesterday"}):  # fmt: skip
        results, kept = judge_sm("mlx5_0/1", 1, sm(), previous, now=1000.0)
        assert [r.status for r in results] == [Status.OK] and kept["activity"] == 100
