"""What changed between two snapshots of a host: devices and ports (the change engine's events,
and rate changes), GIDs, counters (deltas and rates over the interval, resets flagged) and the
RDMA objects that appeared or went, by the process holding them."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ibtool.errors import IbtoolError
from ibtool.model.deferred import dataclass
from ibtool.model.events import Event, Seen, diff
from ibtool.model.rates import counter_delta, paired
from ibtool.model.records import CounterSample, Gid

# The attribute that names an object of each kind (rdma res show's id column).
OBJECT_ID = {
    "qp": "lqpn",
    "cm_id": "cm_idn",
    "cq": "cqn",
    "mr": "mrn",
    "pd": "pdn",
    "ctx": "ctxn",
    "srq": "srqn",
}


@dataclass(frozen=True)
class CounterChange:
    sample: CounterSample  # the later one
    before: int | None  # in the counter's unit (bytes for data counters)
    delta: int | None
    rate: float | None
    note: str | None


@dataclass(frozen=True)
class ObjectsChange:
    kind: str
    device: str
    pid: int | None
    comm: str | None
    appeared: int
    gone: int


@dataclass(frozen=True)
class SnapshotDiff:
    seconds: float
    events: list[Event]
    gids_added: list[Gid]
    gids_removed: list[Gid]
    counters: list[CounterChange]
    objects: list[ObjectsChange]
    objects_known: bool  # both snapshots hold the resource dumps


def _seen(host) -> Seen:
    """Devices and ports as netlink answered at the time, else as sysfs showed them."""
    session = host.netlink_session
    if session is not None:
        try:
            devices, ports = session.poll_ports()
            return Seen.of(devices, ports)
        except IbtoolError:
            pass
    ports = _or_empty(host.ports)
    return Seen.of({p.device: None for p in ports}, ports)


def _or_empty(read, *args) -> list:
    try:
        return list(read(*args))
    except IbtoolError:
        return []


def _rate_events(old: Seen, new: Seen, a, b) -> list[Event]:
    """Link rate changes (sysfs `rate`): a port renegotiating to another width or speed."""
    rates_a = {(p.device, p.port): p.rate for p in _or_empty(a.ports)}
    events = []
    for p in _or_empty(b.ports):
        key = (p.device, p.port)
        if key in rates_a and key in old.ports and key in new.ports and rates_a[key] != p.rate:
            before, now = rates_a[key], p.rate
            changes = (("rate", before.text if before else None, now.text if now else None),)
            events.append(Event("rate", p.device, p.port, source="snapshot", changes=changes))
    return events


def _gid_key(g: Gid) -> tuple:
    return (g.device, g.port, g.index, g.gid, g.netdev)


def _objects(host) -> list[Any] | None:
    """(kind, object) of every RDMA object the snapshot holds; None without resource dumps."""
    session = host.netlink_session
    if session is None:
        return None
    try:
        devices = session.devices()
    except IbtoolError:
        return None
    return session.every_resource(devices, False)


def _object_key(kind: str, o) -> tuple:
    return (kind, o.device, getattr(o, OBJECT_ID[kind], None), o.owner.pid, o.owner.kern_name)


def _object_changes(a, b, objects_a, objects_b) -> list[ObjectsChange]:
    keys_a = {_object_key(k, o): o for k, o in objects_a}
    keys_b = {_object_key(k, o): o for k, o in objects_b}
    appeared = Counter((k[0], k[1], k[3], k[4]) for k in keys_b if k not in keys_a)
    gone = Counter((k[0], k[1], k[3], k[4]) for k in keys_a if k not in keys_b)
    rows = []
    for kind, device, pid, kern in sorted(
        set(appeared) | set(gone), key=lambda k: (k[1], list(OBJECT_ID).index(k[0]), k[2] or 0)
    ):
        host = b if (kind, device, pid, kern) in appeared else a
        comm = kern if pid is None else host.comm(pid)
        n_in, n_out = appeared[(kind, device, pid, kern)], gone[(kind, device, pid, kern)]
        rows.append(ObjectsChange(kind, device, pid, comm, n_in, n_out))
    return rows


def compare(a, b, seconds: float) -> SnapshotDiff:
    """`a` and `b` are the hosts of two snapshots, `seconds` apart."""
    old, new = _seen(a), _seen(b)
    events = diff(old, new, "snapshot") + _rate_events(old, new, a, b)
    gids_a = {_gid_key(g): g for g in _or_empty(a.gids)}
    gids_b = {_gid_key(g): g for g in _or_empty(b.gids)}
    counters = []
    for prev, s in paired(_or_empty(a.counters), _or_empty(b.counters)):
        if prev is None:
            continue
        delta, note = counter_delta(prev, s)
        if delta == 0 and note is None:
            continue
        rate = None if delta is None or seconds <= 0 else delta / seconds
        value = None if prev.value is None else prev.value * prev.scale
        counters.append(CounterChange(s, value, delta, rate, note))
    objects_a, objects_b = _objects(a), _objects(b)
    known = objects_a is not None and objects_b is not None
    return SnapshotDiff(
        seconds=seconds,
        events=events,
        gids_added=[g for k, g in gids_b.items() if k not in gids_a],
        gids_removed=[g for k, g in gids_a.items() if k not in gids_b],
        counters=counters,
        objects=_object_changes(a, b, objects_a or [], objects_b or []) if known else [],
        objects_known=known,
    )
