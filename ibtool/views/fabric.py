"""The fabric's text and JSON: its nodes (as ibnetdiscover lists them) and its links with both
ends (as `ibnetdiscover -p` and iblinkinfo show them)."""

from __future__ import annotations

from typing import Any

from ibtool.model.fabric import (
    CONGESTION,
    ERROR_COUNTERS,
    ERROR_FIXES,
    WIDTHS,
    CounterFinding,
    CountersRead,
    Fabric,
    FabricNode,
    Link,
    LinkEnd,
    LinkFinding,
    NodeType,
    Norm,
    PortCounters,
    Route,
    SmFinding,
    SmScan,
    SmState,
    end_name,
    judge_links,
    names_of,
    tier,
    up,
)
from ibtool.model.health import Status
from ibtool.model.names import escaped
from ibtool.model.records import PortState
from ibtool.views import render


def _trained(lk: Link) -> dict[str, Any]:
    """What a link trained at, as every JSON answer gives it."""
    p = lk.a.port
    return {
        "width": p.width,
        "speed": p.speed.active_name(),
        "state": p.state.label if p.state else None,
    }


def guid(value: int) -> str:
    """A GUID as infiniband-diags print one: 0x and 16 hex digits."""
    return f"{value:#018x}"


NODE_FIELDS = [
    render.Field("type", lambda n: n.type.label, header="TYPE"),
    render.Field("lid", lambda n: n.lid, header="LID"),
    render.Field("guid", lambda n: guid(n.guid), header="NODE GUID"),
    render.Field("ports", lambda n: n.port_count, header="PORTS"),
    render.Field("description", lambda n: n.description, header="DESCRIPTION"),
]


def end_json(e: LinkEnd) -> dict[str, Any]:
    """A cable's end as every fabric JSON gives it."""
    return {
        "node": e.node.description,
        "node_guid": guid(e.node.guid),
        "type": e.node.type.label,
        "port": e.port.number,
        "port_guid": guid(e.port.guid),
        "lid": e.lid,
    }


LINK_FIELDS = [
    render.Field("a", lambda lk: end_name(lk.a), header="END A", text=str),
    render.Field("a_lid", lambda lk: lk.a.lid, header="LID"),
    render.Field("b", lambda lk: end_name(lk.b), header="END B"),
    render.Field("b_lid", lambda lk: lk.b.lid, header="LID"),
    render.Field("width", lambda lk: lk.a.port.width, header="WIDTH"),
    render.Field("speed", lambda lk: lk.a.port.speed.active_name(), header="SPEED"),
    render.Field(
        "state", lambda lk: lk.a.port.state.label if lk.a.port.state else None, header="STATE"
    ),  # fmt: skip
]

ORDER = {NodeType.SWITCH: 0, NodeType.ROUTER: 1, NodeType.CA: 2}


def nodes_in_order(fabric: Fabric) -> list[FabricNode]:
    """Switches, then routers, then CAs; each kind by description, then GUID."""
    return sorted(fabric.nodes.values(), key=lambda n: (ORDER[n.type], n.description, n.guid))


def links_in_order(fabric: Fabric) -> list[Link]:
    """Links by their ends' names: a switch end first where the cable has one."""
    ordered = []
    for lk in fabric.links():
        a, b = lk.a, lk.b
        if (ORDER[b.node.type], b.node.description, b.port.number) < (
            ORDER[a.node.type],
            a.node.description,
            a.port.number,
        ):
            a, b = b, a
        ordered.append(Link(a, b))
    return sorted(
        ordered, key=lambda lk: (ORDER[lk.a.node.type], lk.a.node.description, lk.a.port.number)
    )


def head(fabric: Fabric) -> str:
    local = fabric.nodes.get(fabric.local[0])
    where = f" ({local.description})" if local else ""
    counts = {k: len(fabric.by_type(k)) for k in NodeType}
    return (
        f"subnet through {fabric.ca}/{fabric.ca_port}{where}: "
        f"{counts[NodeType.SWITCH]} switches, {counts[NodeType.CA]} channel adapters, "
        f"{counts[NodeType.ROUTER]} routers, {len(fabric.links())} links, "
        f"{fabric.max_hops} hops deep, {fabric.mads} SMPs"
    )


def text(fabric: Fabric) -> list[str]:
    lines = [head(fabric), ""]
    lines += render.table(nodes_in_order(fabric), NODE_FIELDS, False)
    lines.append("")
    lines += render.table(links_in_order(fabric), LINK_FIELDS, False)
    return lines


def as_json(fabric: Fabric) -> dict[str, Any]:
    return {
        "via": {"ca": fabric.ca, "port": fabric.ca_port},
        "local": {"node_guid": guid(fabric.local[0]), "port": fabric.local[1]},
        "smps": fabric.mads,
        "hops": fabric.max_hops,
        "nodes": [
            {
                **render.record_json(n, NODE_FIELDS, True),
                "system_guid": guid(n.system_guid),
                "vendor_id": n.vendor_id,
                "device_id": n.device_id,
            }
            for n in nodes_in_order(fabric)
        ],
        "links": [
            {"a": end_json(lk.a), "b": end_json(lk.b), **_trained(lk)}
            for lk in links_in_order(fabric)
        ],
        "unanswered": list(fabric.unanswered),
    }


# -- `ibtool fabric links`: each link against its ends and its tier's norm -----------------------


def _cable(lk: Link) -> str:
    return f"{end_name(lk.a)} <-> {end_name(lk.b)}"


def _enabled(p) -> str:
    """A port's enabled widths and speeds, as `4X SDR,DDR` (what it may train at)."""
    widths = "/".join(names_of(p.width_enabled, WIDTHS)) or "?"
    speeds = ",".join(p.speed.enabled_names()) or "?"
    return f"{widths} {speeds}"


def _key(lk: Link) -> tuple[int, int, int, int]:
    return (lk.a.node.guid, lk.a.port.number, lk.b.node.guid, lk.b.port.number)


def _by_link(findings: list[LinkFinding]) -> dict[tuple[int, int, int, int], list[LinkFinding]]:
    found: dict[tuple[int, int, int, int], list[LinkFinding]] = {}
    for f in findings:
        found.setdefault(_key(f.link), []).append(f)
    return found


def links_checked(fabric: Fabric) -> tuple[list[Link], dict[str, Norm], list[LinkFinding]]:
    """The links in order, their tiers' norms and their findings, worst first."""
    links = links_in_order(fabric)
    norms, findings = judge_links(links)
    findings.sort(key=lambda f: -int(f.status == Status.CRITICAL))
    return links, norms, findings


def links_status(findings: list[LinkFinding], gone: list[str] | None = None) -> Status:
    """The worst finding's status; CRITICAL where a link a saved fabric had up is `gone`."""
    return Status.CRITICAL if gone else Status.worst(f.status for f in findings)


Checked = "tuple[list[Link], dict[str, Norm], list[LinkFinding]]"


def links_text(
    fabric: Fabric, checked: Checked | None = None, gone: list[str] | None = None
) -> list[str]:
    """The links' table and findings; `gone`: the links a saved fabric had up that are down
    now (each CRITICAL)."""
    links, norms, findings = checked or links_checked(fabric)
    found = _by_link(findings)

    def check(lk: Link) -> str:
        first = found.get(_key(lk))
        if not first:
            return "ok" if up(lk) else "-"
        return f"{first[0].status.name} {first[0].kind}"

    fields = [
        *LINK_FIELDS,
        render.Field("enabled_a", lambda lk: _enabled(lk.a.port), header="ENABLED A"),
        render.Field("enabled_b", lambda lk: _enabled(lk.b.port), header="ENABLED B"),
        render.Field("check", check, header="CHECK"),
    ]
    said = ", ".join(f"{t} {n.width} {n.speed} ({n.count} of {n.of})" for t, n in norms.items())
    lines = [
        f"{len(links)} links through {fabric.ca}/{fabric.ca_port}; "
        + (f"the norm: {said}" if said else "no tier has enough links for a norm"),
        "",
    ]
    lines += render.table(links, fields, False)
    lines.append("")
    for what in gone or ():
        lines.append(escaped(f"CRITICAL {what} since the saved fabric"))
    if gone:
        lines.append("  fix: find why each is down: ibtool fabric errors, then the cable")
    for f in findings:
        lines.append(escaped(f"{f.status.name} {_cable(f.link)}: {f.what}"))
        lines.append(escaped(f"  fix: {f.fix}"))
    if gone and not findings:
        lines.append(f"{len(gone)} link{'s' if len(gone) != 1 else ''} down since the saved fabric")
    elif findings:
        cables = len({_cable(f.link) for f in findings})
        lines.append(f"{cables} of {len(links)} links need attention")
    else:
        lines.append("every link runs at what both its ends enable and its tier's norm")
    return lines


def links_json(
    fabric: Fabric, checked: Checked | None = None, gone: list[str] | None = None
) -> dict[str, Any]:
    links, norms, findings = checked or links_checked(fabric)
    found = _by_link(findings)

    def end(e: LinkEnd) -> dict[str, Any]:
        p = e.port
        return {
            **end_json(e),
            "width_enabled": list(names_of(p.width_enabled, WIDTHS)),
            "width_supported": list(names_of(p.width_supported, WIDTHS)),
            "speed_enabled": list(p.speed.enabled_names()),
            "speed_supported": list(p.speed.supported_names()),
        }

    return {
        "via": {"ca": fabric.ca, "port": fabric.ca_port},
        "status": links_status(findings, gone).name,
        **({"gone": list(gone)} if gone is not None else {}),
        "norms": {
            t: {"width": n.width, "speed": n.speed, "links": n.count, "of": n.of}
            for t, n in norms.items()
        },
        "links": [
            {
                "a": end(lk.a),
                "b": end(lk.b),
                "tier": tier(lk),
                **_trained(lk),
                "findings": [
                    {
                        "status": f.status.name,
                        "kind": f.kind,
                        "what": f.what,
                        "fix": f.fix,
                        "end": None if f.end is None else "ab"[f.end],
                    }
                    for f in found.get(_key(lk), [])
                ],
            }
            for lk in links
        ],
    }


# -- `ibtool fabric errors`: the ports' error counters over their thresholds ---------------------


def counter_cable(fabric: Fabric, pc: PortCounters) -> str:
    """`leaf05/7 <-> node055 mlx5_0/1`: the port and the far end of its cable, or the port
    alone (`leaf05/30 (no link)`)."""
    node = fabric.nodes[pc.node]
    near = f"{node.description}/{pc.port}"
    far = fabric.far_end(pc.node, pc.port)
    if far is None:
        return f"{near} (no link)"
    return f"{near} <-> {far[0].description}/{far[1].number}"


def errors_status(findings: list[CounterFinding], unanswered: list[str]) -> Status:
    return Status.worst([f.status for f in findings] + [Status.UNKNOWN] * bool(unanswered))


def _since(f: CounterFinding) -> str:
    if f.saturated:
        return " (saturated: it counts no more until cleared)"
    if f.delta is None:
        return ""
    if f.delta == 0:
        return " (no change since the last run)"
    return f" (+{f.delta} since the last run)"


def _order(f: CounterFinding):
    return (f.status != Status.WARNING, ERROR_COUNTERS.index(f.name), f.counters.node,
            f.counters.port)  # fmt: skip


def _summed(read: CountersRead) -> str:
    if not read.summed:
        return ""
    ports = sum(n for _, n in read.summed)
    switches = len(read.summed)
    return (
        f" ({ports} more on {switches} switch{'es' if switches != 1 else ''} whose ports' sum "
        "is under the thresholds)"
    )


def errors_text(
    fabric: Fabric,
    read: CountersRead,
    findings: list[CounterFinding],
    thresholds: str,
    baseline: str,
) -> list[str]:
    """A head line (ports read, the thresholds, the baseline), then each counter over its
    threshold with the cable it is on, worst first, what each kind of counter means and its
    fix, and a last line counting the ports."""
    ports = read.counters
    nodes = len({pc.node for pc in ports} | {n.guid for n, _ in read.summed})
    checked = len(ports) + sum(n for _, n in read.summed)
    lines = [
        f"{len(ports)} ports read{_summed(read)}, of {nodes} nodes, through "
        f"{fabric.ca}/{fabric.ca_port}; thresholds: {thresholds}; {baseline}",
        "",
    ]
    ordered = sorted(findings, key=_order)
    for f in ordered:
        lines.append(escaped(
            f"{f.status.name} {counter_cable(fabric, f.counters)}: {f.name} {f.value}{_since(f)}"
        ))  # fmt: skip
    names = sorted({f.name for f in ordered if f.status != Status.OK}, key=ERROR_COUNTERS.index)
    if names:
        lines.append("")
        lines += [f"{name}: {ERROR_FIXES[name]}" for name in names]
    bad = {(f.counters.node, f.counters.port) for f in findings}
    grown = {(f.counters.node, f.counters.port) for f in findings if f.status != Status.OK}
    lines.append("")
    if bad:
        lines.append(
            f"{len(bad)} of {checked} ports over their thresholds, {len(grown)} of them "
            "to look at now"
        )
    else:
        lines.append(f"no port of {checked} over its thresholds")
    return lines


def _far(far) -> dict[str, Any]:
    node, port = far
    return {"node": node.description, "node_guid": guid(node.guid), "port": port.number}


def errors_json(
    fabric: Fabric,
    read: CountersRead,
    findings: list[CounterFinding],
    thresholds: dict[str, int],
    thresholds_file: str | None,
    baseline: str,
) -> dict[str, Any]:
    ports, unanswered = read.counters, read.unanswered
    found: dict[tuple[int, int], list[CounterFinding]] = {}
    for f in findings:
        found.setdefault((f.counters.node, f.counters.port), []).append(f)

    def port(pc: PortCounters) -> dict[str, Any]:
        node = fabric.nodes[pc.node]
        far = fabric.far_end(pc.node, pc.port)
        return {
            "node": node.description,
            "node_guid": guid(node.guid),
            "type": node.type.label,
            "port": pc.port,
            "lid": pc.lid,
            "remote": None if far is None else _far(far),
            "counters": dict(pc.values),
            "findings": [
                {
                    "status": f.status.name,
                    "counter": f.name,
                    "value": f.value,
                    "threshold": f.threshold,
                    "delta": f.delta,
                    "saturated": f.saturated,
                }
                for f in sorted(found.get((pc.node, pc.port), []), key=_order)
            ],
        }

    checked = [n for n in ERROR_COUNTERS if n != CONGESTION or n in thresholds]
    return {
        "via": {"ca": fabric.ca, "port": fabric.ca_port},
        "status": errors_status(findings, unanswered).name,
        "thresholds": {n: thresholds.get(n, 0) for n in checked},
        "thresholds_file": thresholds_file,
        "baseline": baseline,
        "ports": [port(pc) for pc in ports],
        "summed": [
            {"node": n.description, "node_guid": guid(n.guid), "ports": count}
            for n, count in read.summed
        ],
        "unanswered": list(unanswered),
    }


# -- `ibtool fabric sm`: the subnet managers -------------------------------------------------------

SM_FIELDS = [
    render.Field("state", lambda s: s.state.name if s.state is not None else None, header="STATE"),
    render.Field("priority", lambda s: s.priority, header="PRIORITY"),
    render.Field("lid", lambda s: s.lid, header="LID"),
    render.Field("guid", lambda s: guid(s.guid), header="SM GUID"),
    render.Field("activity", lambda s: s.activity, header="ACTIVITY"),
    render.Field("where", lambda s: f"{s.node.description}/{s.port}", header="ON"),
]
SM_ORDER = {SmState.MASTER: 0, SmState.STANDBY: 1, SmState.DISCOVERING: 2, SmState.NOT_ACTIVE: 3}


def sms_in_order(scan: SmScan) -> list:
    return sorted(scan.sms, key=lambda s: (SM_ORDER.get(s.state, 4), -s.priority, s.lid))


def sm_status(findings: list[SmFinding]) -> Status:
    return Status.worst(f.status for f in findings)


def _activity(scan: SmScan) -> str | None:
    if scan.moved is None:
        return None
    if scan.moved:
        return f"the master's activity count moved {scan.moved} in {scan.waited:.1f} s"
    return f"the master's activity count did not move in {scan.waited:.1f} s"


def sm_text(fabric: Fabric, scan: SmScan, findings: list[SmFinding]) -> list[str]:
    count = len(scan.sms) + len(scan.silent)
    lines = [
        f"{count} subnet manager{'s' if count != 1 else ''} through {fabric.ca}/{fabric.ca_port}"
        f"; this port's SM LID {scan.local_sm_lid}",
        "",
    ]
    if scan.sms:
        lines += render.table(sms_in_order(scan), SM_FIELDS, False)
    else:
        lines.append("no SM answered its SMInfo")
    said = _activity(scan)
    if said:
        lines += ["", said]
    lines.append("")
    for f in findings:
        lines.append(escaped(f"{f.status.name} {f.what}"))
        lines.append(escaped(f"  fix: {f.fix}"))
    if not findings:
        active = "and active" if scan.moved else "(its activity not watched)"
        lines.append(f"one master, answering {active}")
    return lines


def sm_json(fabric: Fabric, scan: SmScan, findings: list[SmFinding]) -> dict[str, Any]:
    return {
        "via": {"ca": fabric.ca, "port": fabric.ca_port},
        "status": sm_status(findings).name,
        "local_sm_lid": scan.local_sm_lid,
        "sms": [
            {
                "node": s.node.description,
                "node_guid": guid(s.node.guid),
                "port": s.port,
                "lid": s.lid,
                "guid": guid(s.guid),
                "priority": s.priority,
                "state": s.state.name if s.state is not None else None,
                "activity": s.activity,
            }
            for s in sms_in_order(scan)
        ],
        "silent": [
            {"node": n.description, "node_guid": guid(n.guid), "port": p, "lid": lid}
            for n, p, lid in scan.silent
        ],
        "activity": None if scan.moved is None else {"moved": scan.moved, "seconds": scan.waited},
        "findings": [
            {"status": f.status.name, "kind": f.kind, "what": f.what, "fix": f.fix}
            for f in findings
        ],
    }


# -- `ibtool fabric route`: a path hop by hop --------------------------------------------------


def _errors_at(counters: dict[tuple[int, int], PortCounters], thresholds: dict[str, int],
               node, port: int) -> list[str]:  # fmt: skip
    pc = counters.get((node.guid, port))
    if pc is None:
        return []
    return [
        f"{node.description}/{port} {name} {pc.values[name]}"
        for name in ERROR_COUNTERS
        if name in pc.values
        and (name != CONGESTION or name in thresholds)
        and pc.values[name] > thresholds.get(name, 0)
    ]


def route_findings(route: Route, counters, thresholds) -> tuple[Status, list[list[str]]]:
    """The route's status (CRITICAL when it breaks or crosses a link not ACTIVE, WARNING when
    a hop's port has error counters over their thresholds) and each hop's errors."""
    status = Status.CRITICAL if route.broken else Status.OK
    errors = []
    for hop in route.hops:
        said = _errors_at(counters, thresholds, hop.node, hop.port.number)
        said += _errors_at(counters, thresholds, hop.far, hop.far_port.number)
        errors.append(said)
        if hop.port.state != PortState.ACTIVE or hop.far_port.state != PortState.ACTIVE:
            status = Status.CRITICAL
        elif said and status == Status.OK:
            status = Status.WARNING
    return status, errors


def _end_name(end) -> str:
    node, port, lid = end
    return f"{node.description}/{port} (LID {lid})"


def route_text(route: Route, counters, thresholds) -> list[str]:
    status, errors = route_findings(route, counters, thresholds)
    switches = len({
        n.guid for h in route.hops for n in (h.node, h.far) if n.type == NodeType.SWITCH
    })  # fmt: skip
    lines = [
        f"route from {_end_name(route.source)} to {_end_name(route.dest)}: "
        f"{len(route.hops)} link{'s' if len(route.hops) != 1 else ''}, {switches} "
        f"switch{'es' if switches != 1 else ''}",
        "",
    ]
    fields = [
        render.Field("hop", lambda r: r[0], header="HOP"),
        render.Field(
            "out", lambda r: f"{r[1].node.description}/{r[1].port.number}", header="OUT OF"
        ),  # fmt: skip
        render.Field(
            "into", lambda r: f"{r[1].far.description}/{r[1].far_port.number}", header="INTO"
        ),  # fmt: skip
        render.Field(
            "lid",
            lambda r: r[1].far.lid if r[1].far.type == NodeType.SWITCH else r[1].far_port.lid,
            header="LID",
        ),  # fmt: skip
        render.Field("width", lambda r: r[1].port.width, header="WIDTH"),
        render.Field("speed", lambda r: r[1].port.speed.active_name(), header="SPEED"),
        render.Field(
            "state", lambda r: r[1].port.state.label if r[1].port.state else None, header="STATE"
        ),  # fmt: skip
        render.Field("errors", lambda r: "; ".join(r[2]) or "-", header="ERRORS"),
    ]
    rows = [(i + 1, hop, errors[i]) for i, hop in enumerate(route.hops)]
    lines += render.table(rows, fields, False)
    lines.append("")
    if route.broken:
        lines.append(escaped(f"CRITICAL {route.broken}"))
    elif status == Status.CRITICAL:
        lines.append("CRITICAL the route crosses a link that is not ACTIVE")
    elif status == Status.WARNING:
        lines.append("WARNING error counters over their thresholds on the route")
    else:
        lines.append("the route is whole, every link ACTIVE, no error counter over its threshold")
    return lines


def route_json(route: Route, counters, thresholds) -> dict[str, Any]:
    status, errors = route_findings(route, counters, thresholds)

    def end(e) -> dict[str, Any]:
        node, port, lid = e
        return {"node": node.description, "node_guid": guid(node.guid), "port": port, "lid": lid}

    def side(node, port) -> dict[str, Any]:
        pc = counters.get((node.guid, port.number))
        return {
            "node": node.description,
            "node_guid": guid(node.guid),
            "type": node.type.label,
            "port": port.number,
            "port_guid": guid(port.guid),
            "counters": dict(pc.values) if pc is not None else None,
        }

    return {
        "status": status.name,
        "source": end(route.source),
        "dest": end(route.dest),
        "broken": route.broken,
        "hops": [
            {
                "out": side(h.node, h.port),
                "into": side(h.far, h.far_port),
                "width": h.port.width,
                "speed": h.port.speed.active_name(),
                "state": h.port.state.label if h.port.state else None,
                "errors": errors[i],
            }
            for i, h in enumerate(route.hops)
        ],
    }
