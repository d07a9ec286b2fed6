"""Doctor on InfiniBand: what lies beyond this host's port, asked with MADs through it, and the
checks that judge it.

    sm          the SM LID this port's PortInfo names, and what the SM there answers for its
                SMInfo (a master, answering)
    cable       this end's cable: both ends' PortInfo (width, speed, state judged as `ibtool
                fabric links` judges a link) and the far port's PMA error counters against
                infiniband-diags' error_thresholds
    peer_cable  the peer's cable, the last hop of the route: the same, its counters read at
                its switch end
    lid_route   the route from this port's LID to the peer's hop by hop, walked as ibtracert
                walks it (Host.lid_route), each link judged

Nothing is asked where the port is not InfiniBand (RoCE, iWARP) or not on the running host (a
capture): there, doctor's checklist is what it was. The route needs the peer's LID, which its
facts carry (Facts.lid); without a peer, or one that told none, the route and the peer's cable
are a SKIP saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.model.doctor import Facts, Finding, Verdict, is_infiniband
from ibtool.model.fabric import (
    ERROR_FIXES,
    Cable,
    Link,
    LinkEnd,
    NodeType,
    PortCounters,
    Route,
    SmState,
    SubnetManager,
    end_name,
    judge,
    over,
)
from ibtool.model.health import Status
from ibtool.model.names import escaped
from ibtool.model.records import PortState
from ibtool.views.fabric import end_json, guid, route_json

PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP
_VERDICT = {Status.CRITICAL: FAIL, Status.WARNING: WARN}


@dataclass(frozen=True)
class IbPath:
    """What doctor asked of the subnet through this end's port `via` (DEV/PORT); each part
    None where it was not asked or could not be, with why (`*_why`)."""

    via: str
    thresholds: dict[str, int] = field(default_factory=dict)
    sm_lid: int = 0
    sm: SubnetManager | None = None
    sm_why: str | None = None
    cable: Cable | None = None
    cable_why: str | None = None
    route: Route | None = None
    route_why: str | None = None
    peer_counters: PortCounters | None = None  # at the switch end of the peer's cable
    peer_silent: str | None = None  # why they were not read

    def to_json(self) -> dict[str, Any]:
        return {
            "via": self.via,
            "sm_lid": self.sm_lid,
            "sm": _sm_json(self.sm),
            "cable": _cable_json(self.local_link(), self.local_counters(), self.thresholds),
            "peer_cable": _cable_json(self.peer_link(), self.peer_counters, self.thresholds),
            "route": (
                route_json(self.route, self._counters(), self.thresholds)
                if self.route is not None
                else None
            ),
        }

    def local_link(self) -> Link | None:
        return self.cable.link if self.cable is not None else None

    def local_counters(self) -> PortCounters | None:
        return self.cable.counters if self.cable is not None else None

    def peer_link(self) -> Link | None:
        """The peer's cable, the route's last hop, the peer's end first; None where the route
        did not reach the peer or the peer is this port."""
        route = self.route
        if route is None or route.broken or not route.hops:
            return None
        last = route.hops[-1]
        if last.far.type == NodeType.SWITCH:
            return None  # a LID of a switch: no cable of a peer's
        return Link(LinkEnd(last.far, last.far_port), LinkEnd(last.node, last.port))

    def _counters(self) -> dict[tuple[int, int], PortCounters]:
        found = [c for c in (self.local_counters(), self.peer_counters) if c is not None]
        return {(c.node, c.port): c for c in found}


def gather_local(host, local: Facts, thresholds: Callable[[], dict[str, int]] | None,
                 warn) -> IbPath | None:  # fmt: skip
    """This end's side: its cable (with its far port's counters) and its SM; None where the
    port is not InfiniBand, or not on the running host."""
    ib = is_infiniband(local)
    if ib is False or not host.live or local.device is None or local.port is None:
        return None
    via = f"{local.device}/{local.port}"
    try:
        mine = host.cables(via)
    except IbtoolError as e:
        if ib is None:
            return None  # sysfs did not say, nor could libibumad: not doctor's to guess
        return IbPath(via, sm_why=_why(e), cable_why=_why(e), route_why=_why(e))
    if not mine:
        return None  # libibumad does not see it as InfiniBand
    path = IbPath(via, thresholds() if thresholds is not None else {}, cable=mine[0])
    try:
        sm_lid, sm = host.subnet_manager(via)
    except IbtoolError as e:
        return _replace(path, sm_why=_why(e))
    return _replace(path, sm_lid=sm_lid, sm=sm)


def gather_route(host, path: IbPath, peer: Facts | None, why_no_peer: str | None) -> IbPath:
    """The route from this end's port to the peer's LID, and the error counters at the switch
    end of the peer's cable; `why_no_peer` says why there are no peer facts, when not."""
    if peer is None:
        return _replace(path, route_why=why_no_peer or "no peer given")
    if peer.link_layer is not None and peer.link_layer != "InfiniBand":
        return _replace(path, route_why=f"the peer's port is {peer.link_layer}: no LID route")
    if not peer.lid:
        return _replace(path, route_why="the peer told no LID (its port has none, or its "
                        "ibtool does not tell it)")  # fmt: skip
    if path.route_why is not None:
        return path
    try:
        route = host.lid_route(peer.lid, path.via)
    except IbtoolError as e:
        return _replace(path, route_why=_why(e))
    path = _replace(path, route=route)
    link = path.peer_link()
    if link is None:
        return path
    switch_end = link.b
    lid = switch_end.node.lid if switch_end.node.type == NodeType.SWITCH else switch_end.port.lid
    try:
        read = host.port_counters([(switch_end.node, switch_end.port.number, lid)], path.via)
    except IbtoolError as e:
        return _replace(path, peer_silent=_why(e))
    if read.counters:
        return _replace(path, peer_counters=read.counters[0])
    silent = "; ".join(read.unanswered) or "its performance agent did not answer"
    return _replace(path, peer_silent=silent)


def _replace(path: IbPath, **changes) -> IbPath:
    import dataclasses

    return dataclasses.replace(path, **changes)


def _why(e: IbtoolError) -> str:
    return e.message + (f" ({e.hint})" if e.hint else "")


# -- the checks ------------------------------------------------------------------------------


def _name(e: LinkEnd) -> str:
    return escaped(end_name(e))


_START_SM = (
    "start a subnet manager on a node of the subnet (systemctl start opensm, or the switch's "
    "or UFM's SM)"
)


def check_sm(local: Facts, peer: Facts | None, ctx) -> Finding:
    f: IbPath = ctx.fabric
    near = f.cable.near.ports.get(f.cable.port) if f.cable is not None else None
    if f.sm_why is not None and near is not None and near.state == PortState.INIT:
        # a port whose link is up waits in INIT until the SM sets it ARMED, then ACTIVE (IBTA
        # vol. 1, chapter 7, the port states): no SM has swept it
        return Finding(
            "sm",
            FAIL,
            f"{f.via} is INIT: its link is up and no subnet manager has brought it further",
            f"{_START_SM}; if one runs, it does not reach this port: look at its log",
        )
    if f.sm_why is not None:
        return Finding("sm", SKIP, f"not asked: {f.sm_why}")
    if not f.sm_lid:
        return Finding(
            "sm",
            FAIL,
            f"{f.via} has no SM LID: no subnet manager has swept the subnet through it",
            f"{_START_SM}: until one sweeps, no port leaves INIT",
        )
    if f.sm is None:
        return Finding(
            "sm",
            FAIL,
            f"{f.via}'s SM LID is {f.sm_lid}, and nothing there answers for its SMInfo: the "
            "subnet manager has stopped or hangs",
            f"start or restart the SM behind LID {f.sm_lid} (smpquery nodedesc {f.sm_lid} "
            "names its node); a standby takes over only once it sees the master gone",
        )
    sm = f.sm
    state = sm.state.name if sm.state is not None else "in an unknown state"
    said = (f"SM LID {f.sm_lid}: {escaped(sm.node.description)}, {state}, priority "
            f"{sm.priority}, GUID {guid(sm.guid)}")  # fmt: skip
    if sm.state != SmState.MASTER:
        return Finding(
            "sm",
            FAIL,
            f"{said}: the SM this port names is not the master",
            "find the master (ibtool fabric sm, sminfo): its next sweep sets this port's SM "
            "LID; with none, start one (systemctl start opensm)",
        )
    return Finding("sm", PASS, said)


def check_cable(local: Facts, peer: Facts | None, ctx) -> Finding:
    f: IbPath = ctx.fabric
    if f.cable_why is not None:
        return Finding("cable", SKIP, f"not asked: {f.cable_why}")
    c = f.cable
    if c is None or c.far is None:
        why = c.why if c is not None else f"{f.via}: no cable read"
        near = c.near.ports.get(c.port) if c is not None else None
        if near is None or near.state not in (PortState.INIT, PortState.ARMED, PortState.ACTIVE):
            return Finding("cable", SKIP, f"{why}: no cable to judge (the port line says why)")
        return Finding(
            "cable",
            FAIL,
            escaped(why),
            "the node at the far end does not answer: a switch down or hung, or a cable "
            "half seated: reseat it, then look at the switch",
        )
    return _judge_cable("cable", c.link, c.counters, c.silent, f.thresholds)


def check_peer_cable(local: Facts, peer: Facts | None, ctx) -> Finding:
    f: IbPath = ctx.fabric
    if f.route is None:
        return Finding("peer_cable", SKIP, f.route_why or "no route walked")
    if f.route.broken:
        return Finding("peer_cable", SKIP, "the route did not reach the peer (lid_route says "
                       "where it stopped)")  # fmt: skip
    link = f.peer_link()
    if link is None:
        what = "this port's own" if not f.route.hops else "a switch's"
        return Finding("peer_cable", SKIP, f"the peer's LID is {what}: no cable of a peer's")
    return _judge_cable("peer_cable", link, f.peer_counters, f.peer_silent or "", f.thresholds)


def _judge_cable(check: str, link: Link, counters: PortCounters | None, silent: str,
                 thresholds: dict[str, int]) -> Finding:  # fmt: skip
    """One cable: its state, its width and speed against what both ends enable (links.judge),
    and the error counters of its far end (`link.b`) over their thresholds, each named with
    what it counts and what to do."""
    trained = _trained(link)
    said = f"{_name(link.a)} <-> {_name(link.b)}: {trained}"
    verdict, issues, fixes = PASS, [], []
    if link.a.port.state != PortState.ACTIVE:
        verdict = FAIL
        issues.append("not ACTIVE: the subnet manager has not brought it up")
        fixes.append("see the sm line: a link stays in INIT until an SM sweeps it")
    for lf in judge(link, None):
        verdict = Verdict.worst([verdict, _VERDICT.get(lf.status, WARN)])
        issues.append(escaped(lf.what))
        fixes.append(escaped(lf.fix))
    far = link.b
    if counters is None:
        issues.append(f"{_name(far)}'s error counters not read ({escaped(silent or 'not asked')})")
    else:
        over_names = []
        for name, value, limit, saturated in over(counters.values, counters.bits, thresholds):
            text = f"{_name(far)} {name} {value}"
            text += f" (threshold {limit})" if limit else ""
            text += " (saturated: it counts no more)" if saturated else ""
            issues.append(text)
            over_names.append(name)
            fixes.append(f"{name}: {ERROR_FIXES[name]}")
        if over_names:
            verdict = Verdict.worst([verdict, WARN])
            fixes.append(
                f"then clear {_name(far)}'s counters (perfquery -R {counters.lid} "
                f"{counters.port}) and run doctor again: counts that grow are the cable's now"
            )
        else:
            issues.append(f"no error counter of {_name(far)} over its threshold")
    evidence = f"{said}; " + "; ".join(issues)
    return Finding(check, verdict, evidence, "; ".join(fixes) if verdict in (WARN, FAIL) else None)


def _trained(link: Link) -> str:
    p = link.a.port
    state = p.state.label if p.state is not None else "state unknown"
    return f"{p.width or '?'} {p.speed.active_name() or '?'} {state}"


def check_lid_route(local: Facts, peer: Facts | None, ctx) -> Finding:
    f: IbPath = ctx.fabric
    route = f.route
    if route is None:
        return Finding("lid_route", SKIP, f.route_why or "no route walked")
    src, dst = route.source, route.dest
    said = f"LID {src[2]} -> LID {dst[2]}"
    detail, verdict, issues, fixes = [], PASS, [], []
    for i, hop in enumerate(route.hops, 1):
        link = Link(LinkEnd(hop.node, hop.port), LinkEnd(hop.far, hop.far_port))
        lid = hop.far.lid if hop.far.type == NodeType.SWITCH else hop.far_port.lid
        line = f"{i}: {_name(link.a)} -> {_name(link.b)} (LID {lid}), {_trained(link)}"
        wrong = []
        if hop.port.state != PortState.ACTIVE or hop.far_port.state != PortState.ACTIVE:
            verdict = FAIL
            wrong.append("not ACTIVE")
            fixes.append(f"hop {i}: a link the SM has not brought up (see the sm line)")
        for lf in judge(link, None):
            verdict = Verdict.worst([verdict, _VERDICT.get(lf.status, WARN)])
            wrong.append(escaped(lf.what))
            fixes.append(f"hop {i}: {escaped(lf.fix)}")
        if wrong:
            line += ": " + "; ".join(wrong)
            issues.append(f"hop {i} {'; '.join(wrong)}")
        detail.append(line)
    switches = len({h.far.guid for h in route.hops if h.far.type == NodeType.SWITCH})
    said += (f": {len(route.hops)} link{'s' if len(route.hops) != 1 else ''} through "
             f"{switches} switch{'es' if switches != 1 else ''}")  # fmt: skip
    if route.broken:
        verdict = FAIL
        said += f", and it stops: {escaped(route.broken)}"
        fixes.append(
            "the subnet manager programs the switches' forwarding tables: check that a master "
            "runs and has swept since the fault (ibtool fabric sm), and the cable of the port "
            "where the route stops"
        )
    elif issues:
        said += ": " + "; ".join(issues)
    else:
        said += ", every link ACTIVE at what its ends enable"
    return Finding("lid_route", verdict, said, "; ".join(fixes) if fixes else None, tuple(detail))


CHECKS = (check_sm, check_cable, check_peer_cable, check_lid_route)
NAMES = ("sm", "cable", "peer_cable", "lid_route")


# -- JSON ------------------------------------------------------------------------------------


def _sm_json(sm: SubnetManager | None) -> dict[str, Any] | None:
    if sm is None:
        return None
    return {
        "lid": sm.lid,
        "node": sm.node.description,
        "guid": guid(sm.guid),
        "state": sm.state.name if sm.state is not None else None,
        "priority": sm.priority,
        "activity": sm.activity,
    }


def _cable_json(link: Link | None, counters: PortCounters | None,
                thresholds: dict[str, int]) -> dict[str, Any] | None:  # fmt: skip
    """A cable, this end (`a`) and its far end (`b`, whose counters they are)."""
    if link is None:
        return None
    p = link.a.port
    return {
        "near": end_json(link.a),
        "far": end_json(link.b),
        "width": p.width,
        "speed": p.speed.active_name(),
        "state": p.state.label if p.state is not None else None,
        "findings": [lf.kind for lf in judge(link, None)],
        "counters": dict(counters.values) if counters is not None else None,
        "errors": (
            [name for name, *_ in over(counters.values, counters.bits, thresholds)]
            if counters is not None
            else None
        ),
    }
