"""Each link against what its two ends enable and support, and against its tier's norm (what
most links of its kind run at): `ibtool fabric links`."""

from __future__ import annotations

from ibtool.model.deferred import dataclass
from ibtool.model.fabric.records import (
    LANE_GBPS,
    SPEED_ORDER,
    WIDTH_LANES,
    WIDTHS,
    FabricPort,
    Link,
    NodeType,
    end_name,
)
from ibtool.model.health import Status
from ibtool.model.records import PortState


def widest(bits: int) -> str | None:
    """The width of most lanes among the bits of a LinkWidth mask (enabled or supported)."""
    named = [WIDTHS[b] for b in WIDTHS if bits & b]
    return max(named, key=_lanes, default=None)


_LANES = {name: WIDTH_LANES[bit] for bit, name in WIDTHS.items()}  # "4X" -> 4


def _lanes(width: str) -> int:
    return _LANES[width]


def fastest(names) -> str | None:
    """The fastest of speed names (enabled or supported ones)."""
    return max(names, key=SPEED_ORDER.index, default=None)


def gbps(width: str | None, speed: str | None) -> float:
    """A link's signalling rate in Gb/s (lanes times a lane's rate), 0 where it has none."""
    if width is None or speed is None:
        return 0.0
    return _lanes(width) * LANE_GBPS[speed]


def _enabled_width(p: FabricPort) -> int:
    # A port reports its enabled widths; where it says what it supports too, only those count
    # (IBTA 14.2.5.6: LinkWidthEnabled may be set to values the port cannot do), unless that
    # leaves none (a port that reports its supported widths wrong).
    return (p.width_enabled & p.width_supported) or p.width_enabled


def _enabled_speeds(p: FabricPort) -> set[str]:
    enabled = set(p.speed.enabled_names())
    return (enabled & set(p.speed.supported_names())) or enabled


TIERS = {
    frozenset({NodeType.SWITCH}): "switch-to-switch",
    frozenset({NodeType.SWITCH, NodeType.CA}): "switch-to-CA",
    frozenset({NodeType.CA}): "CA-to-CA",
    frozenset({NodeType.SWITCH, NodeType.ROUTER}): "switch-to-router",
    frozenset({NodeType.ROUTER, NodeType.CA}): "router-to-CA",
    frozenset({NodeType.ROUTER}): "router-to-router",
}


def tier(link: Link) -> str:
    """Which kind of cable: switch-to-switch (an uplink), switch-to-CA (a node's), ..."""
    return TIERS[frozenset({link.a.node.type, link.b.node.type})]


def up(link: Link) -> bool:
    """Both ends have trained (state INIT, ARMED or ACTIVE)."""
    return all(
        e.port.state is not None and e.port.state >= PortState.INIT for e in (link.a, link.b)
    )


@dataclass(frozen=True)
class Norm:
    """What most up links of a tier run at, and how many do of how many."""

    width: str
    speed: str
    count: int
    of: int

    @property
    def gbps(self) -> float:
        return gbps(self.width, self.speed)


# A tier of fewer links has no norm to speak of: two links that differ say nothing of which
# one is right.
NORM_MIN_LINKS = 3


def norms(links: list[Link]) -> dict[str, Norm]:
    """Each tier's norm: the width and speed most of its up links run at (a tie goes to the
    faster), where the tier has NORM_MIN_LINKS up links or more."""
    seen: dict[str, dict[tuple[str, str], int]] = {}
    for lk in links:
        width, speed = lk.a.port.width, lk.a.port.speed.active_name()
        if not up(lk) or width is None or speed is None:
            continue
        counts = seen.setdefault(tier(lk), {})
        counts[width, speed] = counts.get((width, speed), 0) + 1
    found = {}
    for name, counts in seen.items():
        total = sum(counts.values())
        if total < NORM_MIN_LINKS:
            continue
        (width, speed), n = max(counts.items(), key=lambda kv: (kv[1], gbps(*kv[0])))
        found[name] = Norm(width, speed, n, total)
    return found


@dataclass(frozen=True)
class LinkFinding:
    """Something wrong with one link: `kind` for programs (width_degraded, speed_degraded,
    width_enabled_below, speed_enabled_below, below_norm), `what` and `fix` for a person;
    `end` is the end at fault where one is (0: a, 1: b), else None."""

    link: Link
    status: Status
    kind: str
    what: str
    fix: str
    end: int | None = None


def judge(link: Link, norm: Norm | None) -> list[LinkFinding]:
    """What is wrong with one up link, worst first:

    - CRITICAL, degraded: it trained at a narrower width or a slower speed than both of its
      ends enable: a lane that did not train, a cable or transceiver failing or not rated for
      the speed (what iblinkinfo's "Could be" shows, against what is enabled, not only
      supported);
    - WARNING, enabled below: one end enables less than it supports and the other end
      enables, so the link runs at that end's setting;
    - WARNING, below its tier's norm: slower than what most links of its kind run at, with
      neither of the above to explain it (older hardware, or both ends set low alike)."""
    if not up(link):
        return []
    ends = (link.a, link.b)
    width, speed = link.a.port.width, link.a.port.speed.active_name()
    found: list[LinkFinding] = []
    both_width = widest(_enabled_width(link.a.port) & _enabled_width(link.b.port))
    if width and both_width and _lanes(width) < _lanes(both_width):
        found.append(LinkFinding(
            link, Status.CRITICAL, "width_degraded",
            f"trained at {width} though both ends enable {both_width}",
            "a lane did not train: reseat the cable at both ends, then replace it (or its "
            "transceivers) if it trains narrow again",
        ))  # fmt: skip
    both_speed = fastest(_enabled_speeds(link.a.port) & _enabled_speeds(link.b.port))
    if speed and both_speed and _faster(both_speed, speed):
        found.append(LinkFinding(
            link, Status.CRITICAL, "speed_degraded",
            f"runs at {speed} though both ends enable {both_speed}",
            f"the cable or a transceiver is failing or not rated for {both_speed}: reseat it, "
            "then replace it",
        ))  # fmt: skip
    for i, (this, other) in enumerate((ends, ends[::-1])):  # one finding an axis at most
        mine = widest(_enabled_width(this.port))
        could = widest(this.port.width_supported & _enabled_width(other.port))
        if mine and could and _lanes(mine) < _lanes(could) and not _said(found, "width"):
            found.append(_enabled_below(link, "width", this, other, mine, could, i))
        mine = fastest(_enabled_speeds(this.port))
        could = fastest(set(this.port.speed.supported_names()) & _enabled_speeds(other.port))
        if mine and could and _faster(could, mine) and not _said(found, "speed"):
            found.append(_enabled_below(link, "speed", this, other, mine, could, i))
    if not found and norm is not None and gbps(width, speed) < norm.gbps:
        limits = []
        for e in ends:
            w, s = widest(_enabled_width(e.port)), fastest(_enabled_speeds(e.port))
            limits.append(f"{end_name(e)} enables at most {w or '?'} {s or '?'}")
        can_width = widest(link.a.port.width_supported & link.b.port.width_supported)
        can_speed = fastest(
            set(link.a.port.speed.supported_names()) & set(link.b.port.speed.supported_names())
        )
        if gbps(can_width, can_speed) >= norm.gbps:
            fix = (
                f"both ends support {norm.width} {norm.speed}: enable it on both (ibportstate's "
                "width and speed, or the SM's or firmware's setting for those ports) and "
                "retrain the link"
            )
        else:
            fix = (
                f"together the two ends support at most {can_width or '?'} {can_speed or '?'}: "
                "the hardware at one end is older than the rest of its tier"
            )
        found.append(LinkFinding(
            link, Status.WARNING, "below_norm",
            f"{width} {speed}, below the {norm.width} {norm.speed} of {norm.count} of "
            f"{norm.of} {tier(link)} links ({'; '.join(limits)})",
            fix,
        ))  # fmt: skip
    return found


def _said(found: list[LinkFinding], axis: str) -> bool:
    return any(f.kind.startswith(axis) for f in found)


def _faster(a: str, b: str) -> bool:
    return SPEED_ORDER.index(a) > SPEED_ORDER.index(b)


def _enabled_below(link, axis: str, this, other, mine: str, could: str, end: int) -> LinkFinding:
    """One end set below what it supports and its peer enables (`axis`: width or speed)."""
    return LinkFinding(
        link, Status.WARNING, f"{axis}_enabled_below",
        f"{end_name(this)} enables at most {mine}; it supports {could} and "
        f"{end_name(other)} enables it",
        f"enable {could} on {end_name(this)} (ibportstate's {axis}, or the SM's or "
        "firmware's setting for that port), then retrain it",
        end,
    )  # fmt: skip


def judge_links(links: list[Link]) -> tuple[dict[str, Norm], list[LinkFinding]]:
    """Every link judged (judge) against its tier's norm: the norms, and the findings."""
    found_norms = norms(links)
    findings = []
    for lk in links:
        findings += judge(lk, found_norms.get(tier(lk)))
    return found_norms, findings
