"""The subnet asked with MADs through this host's InfiniBand port, beyond the scan itself
(ibtool.sources.mad discovers it): every port's PMA counters, the subnet managers, a route hop by
hop. Each is given the scanned fabric (ibtool.model.fabric) and answers in its records.

The Host calls these (its fabric methods), answering from a snapshot's saved fabric instead
where it replays one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ibtool.errors import NotFoundError
from ibtool.model.fabric import (
    Bounds,
    Cable,
    CountersRead,
    Fabric,
    FabricNode,
    FabricPort,
    Hop,
    NodeType,
    PortCounters,
    Route,
    SmScan,
    SmState,
    SubnetManager,
    resolve,
)
from ibtool.model.records import PortState
from ibtool.sources import mad


def counters(
    fabric: Fabric,
    wanted: list,
    bounds: Bounds,
    warn: Callable[[str], None],
    clean: Callable | None = None,
    data: bool = True,
    pace: Callable[[], None] | None = None,
) -> CountersRead:
    """The PMA counters of `wanted` ((node, port, LID) each), asked through the port the scan
    went out from (mad.port_counters: `clean`, `data` and `pace` as it takes them); what did not
    answer, named; the switches left to their sum."""
    start = mad.choose_port(mad.local_ports(warn), fabric.ca, fabric.ca_port)
    return _counters(start, wanted, bounds, warn, clean, data, pace)


def _counters(start, wanted: list, bounds: Bounds, warn, clean=None, data=True, pace=None):
    got, dead, summed = mad.port_counters(
        start,
        [(lid, port) for _, port, lid in wanted],
        bounds,
        warn,
        clean,
        data,
        pace,
    )
    by_lid = {lid: node for node, _, lid in wanted}
    found, silent = [], {}
    for node, port, lid in wanted:
        q = got.get((lid, port))
        if q is not None:
            found.append(PortCounters(node.guid, port, lid, q.values, q.bits))
        elif lid in dead:
            silent.setdefault(lid, [node, 0])[1] += 1
    unanswered = [
        f"{node.description} (LID {lid}): its performance agent did not answer; "
        f"{count} port{'s' if count != 1 else ''} not read"
        for lid, (node, count) in silent.items()
    ]
    return CountersRead(found, unanswered, [(by_lid[lid], n) for lid, n in summed.items()])


def subnet_managers(
    fabric: Fabric, bounds: Bounds, warn: Callable[[str], None], wait: float
) -> SmScan:
    """Each port whose PortInfo says an SM runs behind it (and the one this port's SM LID
    names) asked for its SMInfo, as sminfo asks; then the master's asked again until its
    activity count moves, for up to `wait` seconds (0: not asked again)."""
    start = mad.choose_port(mad.local_ports(warn), fabric.ca, fabric.ca_port)
    where = []
    for guid in sorted(fabric.nodes):
        node = fabric.nodes[guid]
        for number, port in sorted(node.ports.items()):
            if node.type == NodeType.SWITCH and number:
                continue  # a switch's SM is behind its port 0, whose PortInfo says so
            lid = node.lid if node.type == NodeType.SWITCH else port.lid
            if port.is_sm and lid:
                where.append((node, number, lid))
    if start.sm_lid and all(lid != start.sm_lid for _, _, lid in where):
        for node, number, lid in fabric.counter_ports():
            if lid == start.sm_lid:
                where.append((node, 0 if node.type == NodeType.SWITCH else number, lid))
                break
    sms, silent = [], []
    moved, waited = None, 0.0
    with mad.smp_port(start, bounds, warn) as handle:
        for node, number, lid in where:
            info = mad.sm_info(handle, lid, bounds, warn)
            if info is None:
                silent.append((node, number, lid))
                continue
            try:
                state = SmState(info.state)
            except ValueError:
                state = None
            sms.append(SubnetManager(
                node, number, lid, info.guid, info.priority, state, info.activity
            ))  # fmt: skip
        masters = [s for s in sms if s.state == SmState.MASTER]
        if len(masters) == 1 and wait > 0:
            master, began = masters[0], time.monotonic()
            step = 0.05
            while True:
                time.sleep(step)
                waited = time.monotonic() - began
                again = mad.sm_info(handle, master.lid, bounds, warn)
                if again is not None and again.activity != master.activity:
                    moved = (again.activity - master.activity) % (1 << 32)
                    break
                if waited >= wait:
                    moved = 0
                    break
                step = min(step * 2, 1.0, max(wait - waited, 0.01))
    return SmScan(sms, silent, start.sm_lid, moved, waited)


def route(
    fabric: Fabric, source: str, dest: str, bounds: Bounds, warn: Callable[[str], None]
) -> Route:
    """The route from `source` to `dest` hop by hop, as ibtracert walks it (see
    Host.fabric_route)."""
    try:
        src, dst = resolve(fabric, source), resolve(fabric, dest)
    except ValueError as e:
        raise NotFoundError(str(e), "give a LID, a GUID (0x...) or a node description") from None
    if src[0].guid == dst[0].guid:
        return Route(src, dst, ())
    start = mad.choose_port(mad.local_ports(warn), fabric.ca, fabric.ca_port)
    with mad.smp_port(start, bounds, warn) as handle:
        return _walk(fabric, src, dst, _tables(handle, bounds, warn))


def routes(
    fabric: Fabric, pairs: list[tuple[int, int]], bounds: Bounds, warn: Callable[[str], None]
) -> dict[tuple[int, int], Route]:
    """The route of each (source LID, destination LID) of `pairs` whose ends are ports of
    the fabric, walked as `route` walks one, through one SMP port, each switch's forwarding
    table block asked once for them all: a walk of a route whose blocks were asked for
    another costs no MAD."""
    ends: dict[int, tuple[FabricNode, int, int]] = {}
    for node in fabric.nodes.values():
        if node.type == NodeType.SWITCH:
            if node.lid:
                ends.setdefault(node.lid, (node, 0, node.lid))
            continue
        for number, port in sorted(node.ports.items()):
            for lid in range(port.lid, port.lid + (1 << port.lmc) if port.lid else 0):
                ends.setdefault(lid, (node, number, lid))
    found: dict[tuple[int, int], Route] = {}
    wanted = [(s, d) for s, d in dict.fromkeys(pairs) if s in ends and d in ends]
    if not wanted:
        return found
    start = mad.choose_port(mad.local_ports(warn), fabric.ca, fabric.ca_port)
    with mad.smp_port(start, bounds, warn) as handle:
        tables = _tables(handle, bounds, warn)
        for s, d in wanted:
            src, dst = ends[s], ends[d]
            found[s, d] = (
                Route(src, dst, ()) if src[0].guid == dst[0].guid
                else _walk(fabric, src, dst, tables)
            )  # fmt: skip
    return found


TARGETS_TRIED = 3  # endpoints asked for their NodeInfo through each local port, at most


def port_reaching(
    targets: list[tuple[int, int]], bounds: Bounds, warn: Callable[[str], None]
) -> mad.LocalPort | None:
    """The first active InfiniBand port here through which one of `targets` ((LID, node
    GUID) each, TARGETS_TRIED of them at most) answers as that node: a port of their subnet
    (a LID names a port in one subnet only; the GUID says which). None where libibumad sees
    no active InfiniBand port, or none reaches them."""
    ports = [
        p
        for p in mad.local_ports(warn)
        if p.link_layer in ("InfiniBand", "IB") and p.state == PortState.ACTIVE
    ]
    for p in ports:
        with mad.smp_port(p, bounds, warn) as handle:
            for lid, guid in targets[:TARGETS_TRIED]:
                info = mad.node_info(handle, lid, bounds, warn)
                if info is not None and info[0] == guid:
                    return p
    return None


def _tables(handle, bounds: Bounds, warn: Callable[[str], None]) -> Callable:
    """The out port a switch's linear forwarding table gives for a LID, each block asked
    once (None: the switch did not answer for it)."""
    blocks: dict[tuple[int, int], bytes | None] = {}

    def out_port(switch: FabricNode, lid: int) -> int | None:
        key = (switch.guid, lid // mad.LFT_BLOCK)
        if key not in blocks:
            blocks[key] = mad.lft_block(handle, switch.lid, key[1], bounds, warn)
        block = blocks[key]
        return None if block is None else block[lid % mad.LFT_BLOCK]

    return out_port


def _walk(fabric: Fabric, src: tuple, dst: tuple, out_port: Callable) -> Route:
    """The hops from `src` to `dst` ((node, port, LID) each, on two nodes), out of the
    source's port, then at each switch the port `out_port` (its forwarding table) gives."""
    dnode, dport, dlid = dst
    hops: list[Hop] = []

    def done(broken: str | None = None) -> Route:
        return Route(src, dst, tuple(hops), broken)

    node, out = src[0], src[1]
    seen = set()
    while True:
        if node.type == NodeType.SWITCH:
            if node.guid in seen:
                return done(f"a loop: the route comes back to {node.description}")
            seen.add(node.guid)
            out = out_port(node, dlid)
            if out is None:
                return done(f"{node.description} (LID {node.lid}) did not answer for "
                            "its forwarding table")  # fmt: skip
            if out == 0 and node.guid == dnode.guid:
                return done()
            if out == 0 or out > node.port_count:
                return done(f"{node.description} has no route to LID {dlid} (its "
                            f"forwarding table says {out})")  # fmt: skip
        port = node.ports.get(out)
        far = fabric.far_end(node.guid, out)
        if port is None or far is None:
            return done(f"{node.description}/{out} has no cable up: the route ends there")
        hops.append(Hop(node, port, far[0], far[1]))
        if len(hops) > mad.SUBNET_PATH_HOPS_MAX:
            return done(f"more than {mad.SUBNET_PATH_HOPS_MAX} hops")
        node = far[0]
        if node.guid == dnode.guid and (node.type == NodeType.SWITCH or far[1].number == dport):
            if node.type != NodeType.SWITCH:
                return done()
            continue  # a switch: its own table sends the LID to port 0
        if node.type != NodeType.SWITCH:
            return done(f"the route reaches {node.description}/{far[1].number}, not "
                        f"LID {dlid}")  # fmt: skip


def cables(
    ca: str | None, port: int | None, bounds: Bounds, warn: Callable[[str], None],
    counters: bool = True,
) -> list[Cable]:  # fmt: skip
    """The cable of every InfiniBand port libibumad sees here (or of `ca`/`port`), each
    asked through its own port (mad.cable), with its far port's PMA counters (its 64-bit
    error counters where it has them, not its data counters) unless not `counters`."""
    mine = [
        p
        for p in mad.local_ports(warn)
        if (ca is None or p.ca == ca)
        and (port is None or p.port == port)
        and p.link_layer in ("InfiniBand", "IB")  # the kernel's name, and umad2sim's
    ]
    if mine:
        mad.check_access(warn)  # a RoCE port's umad device is no reason to need root
    found = []
    for p in mine:
        with mad.smp_port(p, bounds, warn) as handle:
            c = mad.cable(handle, p.ca, p.port, bounds, warn)
        if counters and c.far is not None:
            lid = c.far.lid if c.far.type == NodeType.SWITCH else c.far.ports[c.far_port].lid
            if not lid:
                c = dataclasses.replace(c, silent="its far end has no LID: its counters unread")
            else:
                got, dead, _ = mad.port_counters(p, [(lid, c.far_port)], bounds, warn, data=False)
                q = got.get((lid, c.far_port))
                if q is None:
                    c = dataclasses.replace(
                        c, silent=f"{c.far.description} (LID {lid}): its performance agent "
                        "did not answer",
                    )  # fmt: skip
                else:
                    pc = PortCounters(c.far.guid, c.far_port, lid, q.values, q.bits)
                    c = dataclasses.replace(c, counters=pc)
        found.append(c)
    return found


def subnet_manager(
    ca: str | None, port: int | None, bounds: Bounds, warn: Callable[[str], None]
) -> tuple[int, SubnetManager | None]:
    """The SM LID this port's PortInfo names, and the SMInfo of the SM there (None: it did
    not answer, or no SM LID is set); through `ca`/`port` or the first active InfiniBand
    port."""
    start = mad.choose_port(mad.local_ports(warn), ca, port)
    if not start.sm_lid:
        return 0, None
    with mad.smp_port(start, bounds, warn) as handle:
        info = mad.sm_info(handle, start.sm_lid, bounds, warn)
        node = mad.node_at(handle, start.sm_lid, bounds, warn) if info is not None else None
    if info is None:
        return start.sm_lid, None
    try:
        state = SmState(info.state)
    except ValueError:
        state = None
    if node is None:  # it answered for its SMInfo, not for its NodeInfo: named by its LID
        node = FabricNode(0, NodeType.CA, f"LID {start.sm_lid}", 0, {})
    return start.sm_lid, SubnetManager(
        node, 0, start.sm_lid, info.guid, info.priority, state, info.activity
    )


# The longest directed route: IB_SUBNET_PATH_HOPS_MAX (libibmad/mad.h, 64) entries in the
# path, the first of which is the start (ib_dr_path_t.p[0]), so 63 hops.
TRACE_HOPS_MAX = mad.SUBNET_PATH_HOPS_MAX - 1
_UP = (PortState.INIT, PortState.ARMED, PortState.ACTIVE)


def trace(
    ca: str | None, port: int | None, dlid: int, bounds: Bounds, warn: Callable[[str], None]
) -> Route:
    """The route from this host's port (`ca`/`port`, or the first active InfiniBand port) to
    LID `dlid` hop by hop, walked as ibtracert walks it (infiniband-diags ibtracert.c,
    find_route) and without a scan of the subnet: a directed route out of the port, and at
    each switch the LinearForwardingTable block that holds `dlid`, then the next node's
    NodeInfo, NodeDescription and the PortInfo of the port it is entered by, along the path
    extended by the out port the table gives. Each hop has both ends' PortInfo (the out
    port's asked of its node), so its width, speed and state can be judged.

    Bounded: at most TRACE_HOPS_MAX hops (bounds.max_hops where it is set lower), each switch
    once (a route that comes back to one is a loop), each SMP with the bounds' timeout and
    retries. The walk stops at the first thing that does not answer or does not lead on, and
    the Route says why (`broken`); its `dest` is the node reached, or, where none was, a
    node named by the LID alone."""
    start = mad.choose_port(mad.local_ports(warn), ca, port)
    limit = min(TRACE_HOPS_MAX, bounds.max_hops or TRACE_HOPS_MAX)
    unreached = (FabricNode(0, NodeType.CA, f"LID {dlid}", 0, {}), 0, dlid)
    with mad.smp_port(start, bounds, warn) as handle:
        got = mad.node_by_path(handle, (), bounds, warn)
        mine = None
        if got is not None:
            node, _, info = got
            node = dataclasses.replace(node, description=node.description or start.ca)
            mine = mad.port_by_path(handle, (), start.port, node, info, bounds, warn)
        if got is None or mine is None:
            node = FabricNode(0, NodeType.CA, start.ca, 0, {})
            source = (node, start.port, start.lid)
            return Route(source, unreached, (), f"{start.ca}/{start.port}: its own SMA did "
                         "not answer")  # fmt: skip
        node = dataclasses.replace(node, ports={start.port: mine})
        source = (node, start.port, mine.lid)
        if _holds(mine, dlid):
            return Route(source, source, ())
        hops: list[Hop] = []
        path: tuple[int, ...] = ()
        out, seen = start.port, set()

        def broken(why: str) -> Route:
            return Route(source, unreached, tuple(hops), why)

        while True:
            near = node.ports[out]
            if near.state not in _UP:
                state = near.state.name if near.state is not None else "unknown"
                return broken(f"{node.description}/{out} is {state}: the route ends there")
            if len(hops) >= limit:
                return broken(f"more than {limit} hops")
            path += (out,)
            got = mad.node_by_path(handle, path, bounds, warn)
            if got is None:
                return broken(f"what {node.description}/{out} is cabled to did not answer")
            far, entered, info = got
            caps = None
            if far.type == NodeType.SWITCH:
                p0 = mad.port_by_path(handle, path, 0, far, info, bounds, warn)
                if p0 is not None:
                    caps = p0.cap_mask
                    far = dataclasses.replace(far, ports={0: p0})
            into = mad.port_by_path(handle, path, entered, far, info, bounds, warn, caps)
            if into is None:
                return broken(f"{far.description}/{entered}, cabled to {node.description}/"
                              f"{out}, did not answer for its PortInfo")  # fmt: skip
            far = dataclasses.replace(far, ports={**far.ports, entered: into})
            hops.append(Hop(node, near, far, into))
            if far.type != NodeType.SWITCH:
                if _holds(into, dlid):
                    return Route(source, (far, entered, dlid), tuple(hops))
                return broken(f"the route reaches {far.description}/{entered} (LID "
                              f"{into.lid}), not LID {dlid}")  # fmt: skip
            if far.lid == dlid:
                return Route(source, (far, 0, dlid), tuple(hops))
            if far.guid in seen:
                return broken(f"a loop: the route comes back to {far.description}")
            seen.add(far.guid)
            block = mad.lft_block_by_path(handle, path, dlid // mad.LFT_BLOCK, bounds, warn)
            if block is None:
                return broken(f"{far.description} (LID {far.lid}) did not answer for its "
                              "forwarding table")  # fmt: skip
            out = block[dlid % mad.LFT_BLOCK]
            if out == 0 or out > far.port_count:
                return broken(f"{far.description} has no route to LID {dlid} (its forwarding "
                              f"table says {out})")  # fmt: skip
            leaving = mad.port_by_path(handle, path, out, far, info, bounds, warn, caps)
            if leaving is None:
                return broken(f"{far.description}/{out} did not answer for its PortInfo")
            node = dataclasses.replace(far, ports={**far.ports, out: leaving})


def _holds(p: FabricPort, lid: int) -> bool:
    """Whether a channel adapter's port answers to `lid` (its LID and the LMC's range)."""
    return bool(p.lid) and p.lid <= lid < p.lid + (1 << p.lmc)


def port_counters(
    ca: str | None,
    port: int | None,
    wanted: list,
    bounds: Bounds,
    warn: Callable[[str], None],
) -> CountersRead:
    """The PMA error counters of `wanted` ((node, port, LID) each), asked through this host's
    port (`ca`/`port`, or the first active InfiniBand port) with no scan of the subnet, and
    what did not answer, named (mad.port_counters, without the data counters)."""
    start = mad.choose_port(mad.local_ports(warn), ca, port)
    return _counters(start, wanted, bounds, warn, data=False)
