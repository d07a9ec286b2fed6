"""`ibtool fabric links`' judgement of one link, on records: what ibsim cannot make (a link that
trained below what both ends enable: a lane or a cable failing) and the tier norms' edges. The
end-to-end answers, against iblinkinfo on a simulated fabric, are in tests/fabric."""

from __future__ import annotations

from ibtool.model.fabric import (
    FabricNode,
    FabricPort,
    Link,
    LinkEnd,
    NodeType,
    PortSpeed,
    judge,
    judge_links,
    norms,
)
from ibtool.model.health import Status
from ibtool.model.records import PhysState, PortState

X1, X4, X12 = 1, 2, 8
SDR, DDR, QDR = 1, 2, 4
EDR, HDR = 2, 4  # LinkSpeedExt bits


def end(name: str, kind: NodeType, guid: int, number: int, width=(X4, X4, X4 | X12),
        speed: PortSpeed | None = None, state=PortState.ACTIVE) -> LinkEnd:  # fmt: skip
    active, enabled, supported = width
    port = FabricPort(
        number, guid, 1, 0, state, PhysState.LINK_UP, active, enabled, supported,
        speed or PortSpeed(QDR, QDR, SDR | DDR | QDR),
    )  # fmt: skip
    return LinkEnd(FabricNode(guid, kind, name, 36, {number: port}), port)


def cable(a_width=(X4, X4, X4), b_width=(X4, X4, X4), a_speed=None, b_speed=None, n=0):
    return Link(
        end("leaf01", NodeType.SWITCH, 0x100, n + 1, a_width, a_speed),
        end(f"node{n:03d} mlx5_0", NodeType.CA, 0x200 + n, 1, b_width, b_speed),
    )


def test_a_healthy_link_has_nothing_to_say():
    assert judge(cable(), None) == []


def test_a_link_that_trained_narrower_than_both_ends_enable_is_critical_with_the_fix():
    (f,) = judge(cable((X1, X4, X4), (X1, X4 | X1, X4 | X1)), None)
    assert (f.status, f.kind, f.end) == (Status.CRITICAL, "width_degraded", None)
    assert f.what == "trained at 1X though both ends enable 4X"
    assert "reseat the cable" in f.fix


def test_a_link_slower_than_both_ends_enable_is_critical():
    both = PortSpeed(DDR, SDR | DDR | QDR, SDR | DDR | QDR)
    (f,) = judge(cable(a_speed=both, b_speed=both), None)
    assert (f.status, f.kind) == (Status.CRITICAL, "speed_degraded")
    assert f.what == "runs at DDR though both ends enable QDR"


def test_an_extended_speed_overrides_the_base_one():
    hdr = PortSpeed(QDR, QDR, QDR, ext_active=HDR, ext_enabled=EDR | HDR, ext_supported=EDR | HDR)
    edr = PortSpeed(QDR, QDR, QDR, ext_active=EDR, ext_enabled=EDR | HDR, ext_supported=EDR | HDR)
    assert judge(cable(a_speed=hdr, b_speed=hdr), None) == []
    (f,) = judge(cable(a_speed=edr, b_speed=edr), None)
    assert f.what == "runs at EDR though both ends enable HDR"


def test_an_end_set_below_what_it_and_its_peer_can_do_is_named():
    (f,) = judge(cable((X1, X1, X4 | X1), (X1, X4 | X1, X4 | X1)), None)
    assert (f.status, f.kind, f.end) == (Status.WARNING, "width_enabled_below", 0)
    assert f.what == ("leaf01/1 enables at most 1X; it supports 4X and node000 mlx5_0/1 enables it")
    assert f.fix.startswith("enable 4X on leaf01/1")


def test_an_end_that_cannot_do_more_is_not_set_below():
    """An EDR HCA in an HDR switch: the link runs at EDR and neither end is at fault."""
    hdr = PortSpeed(QDR, QDR, QDR, ext_active=EDR, ext_enabled=EDR | HDR, ext_supported=EDR | HDR)
    edr = PortSpeed(QDR, QDR, QDR, ext_active=EDR, ext_enabled=EDR, ext_supported=EDR)
    assert judge(cable(a_speed=hdr, b_speed=edr), None) == []


def test_below_its_tiers_norm_with_the_ends_limits_and_whether_they_could_do_more():
    links = [cable(n=i) for i in range(5)] + [cable((X1, X1, X4 | X1), (X1, X1, X4 | X1), n=5)]
    found_norms, findings = judge_links(links)
    norm = found_norms["switch-to-CA"]
    assert (norm.width, norm.speed, norm.count, norm.of) == ("4X", "QDR", 5, 6)
    (f,) = findings
    assert (f.kind, f.link) == ("below_norm", links[5])
    assert f.what == (
        "1X QDR, below the 4X QDR of 5 of 6 switch-to-CA links (leaf01/6 enables at most 1X "
        "QDR; node005 mlx5_0/1 enables at most 1X QDR)"
    )
    assert f.fix.startswith("both ends support 4X QDR: enable it on both")
    older = [cable(n=i) for i in range(5)] + [cable((X1, X1, X1), (X1, X1, X1), n=5)]
    (f,) = judge_links(older)[1]
    assert f.fix.startswith("together the two ends support at most 1X QDR: the hardware")


def test_a_tier_of_too_few_links_has_no_norm_and_a_tie_goes_to_the_faster():
    assert norms([cable(n=0), cable((X1, X1, X1), (X1, X1, X1), n=1)]) == {}
    tie = [cable(n=i) for i in range(2)] + [cable((X1, X1, X1), (X1, X1, X1), n=2 + i)
                                            for i in range(2)]  # fmt: skip
    assert norms(tie)["switch-to-CA"].width == "4X"


def test_a_link_not_up_is_not_judged():
    lk = cable((X1, X4, X4), (X1, X4, X4))
    down = Link(lk.a, end("node000 mlx5_0", NodeType.CA, 0x200, 1, (X1, X4, X4),
                          state=PortState.DOWN))  # fmt: skip
    assert judge(down, None) == []
