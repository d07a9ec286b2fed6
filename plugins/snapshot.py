"""`ibtool snapshot`: save what every read-only command needs in one file, and compare two.

ibtool snapshot save FILE        capture this host (FILE.gz: gzip-compressed)
ibtool snapshot show FILE        what a file is: host, time, kernel, ibtool, counts (nothing built)
ibtool snapshot diff A B         what changed from A to B
ibtool --snapshot FILE OBJECT    any read-only command, as it was when FILE was saved
"""

from __future__ import annotations

import time
from typing import Any

from ibtool.api import Invocation, UsageError, __version__, hookimpl, render

USAGE = "ibtool snapshot save FILE [--fabric] | show FILE | diff A B"
SHOWN_DEVICES = 8  # device names on show's text line; -j lists them all


def _configure(parser) -> None:
    parser.add_argument("words", nargs="*", metavar="save FILE | show FILE | diff A B")
    parser.add_argument(
        "--fabric",
        action="store_true",
        help="save: keep a scan of the InfiniBand fabric too (its nodes, links, port counters "
        "and subnet managers: MADs to the whole subnet)",
    )
    parser.add_argument(
        "--via",
        metavar="DEV[/PORT]",
        help="save --fabric: the local InfiniBand port to scan through (default: the first "
        "active one)",
    )


def _plain(value: Any) -> str:
    """Text from another host, safe on a terminal: what is not printable is escaped."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _when(t: Any) -> str:
    from datetime import datetime

    try:
        return datetime.fromtimestamp(float(t)).astimezone().isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "unknown"


def _unit(sample) -> str | None:
    from ibtool.api import counters  # where a diff is shown, not at every start

    return counters.unit(sample.name, sample.source)


def _save(inv: Invocation, path: str) -> None:
    from ibtool.api import snapshot

    inv.host.require_live("snapshot save captures the running host")
    started = time.monotonic()
    data = snapshot.save(
        path, inv.warn, __version__, fabric=_fabric_scan(inv.args.via) if inv.args.fabric else None
    )
    summary = {
        "file": path,
        "host": data["host"],
        "time": _when(data["time"]),
        "kernel": data["kernel"],
        "sysfs_entries": len(data["sysfs"]),
        "netlink_answers": len(data["netlink"]),
        "seconds": round(time.monotonic() - started, 3),
    }
    fabric = data.get("fabric")
    if fabric is not None:
        summary["fabric_nodes"] = len(fabric["nodes"])
    if inv.json:
        inv.emit_json(summary)
        return
    inv.print(
        f"saved {path}: host {summary['host']}, kernel {summary['kernel']}, "
        f"{summary['sysfs_entries']} sysfs entries, {summary['netlink_answers']} netlink answers"
        + (f", a fabric of {summary['fabric_nodes']} nodes" if fabric is not None else "")
    )


def _fabric_scan(via: str | None):
    """What snapshot save --fabric keeps, from the host it saves: the scan, every port's
    counters and the subnet managers (their activity read once), bounded as ibtool fabric's
    scan is by default."""

    def scan(host) -> dict:
        from ibtool.api.fabric import Bounds, fabric_data

        bounds = Bounds()
        fabric = host.fabric(via, bounds)
        counters = host.fabric_counters(fabric, bounds).counters  # every port, one by one
        sms = host.fabric_sms(fabric, bounds, wait=0)
        return fabric_data(fabric, counters, sms)

    return scan


def _show(inv: Invocation, path: str) -> None:
    from ibtool.api import snapshot

    data = snapshot.load(path, **inv.snapshot_kwargs())
    info = snapshot.summary(data)
    if inv.json:
        info = {"file": path, **info, "time": _when(info["time"]) if info["time"] else None}
        inv.emit_json(info)
        return
    devices = info["devices"]
    names = ", ".join(_plain(d) for d in devices[:SHOWN_DEVICES])
    if len(devices) > SHOWN_DEVICES:
        names += f" and {len(devices) - SHOWN_DEVICES} more"
    size = f"{info['bytes']:,} bytes"
    if info["bytes_expanded"] != info["bytes"]:
        size += f", {info['bytes_expanded']:,} expanded"
    for line in (
        f"{path}: ibtool snapshot format {info['version']}, saved by ibtool "
        f"{_plain(info['ibtool'] or 'unknown')}",
        f"host: {_plain(info['host'] or 'unknown')}",
        f"time: {_when(info['time'])}",
        f"kernel: {_plain(info['kernel'] or 'unknown')}",
        f"devices: {len(devices)}" + (f" ({names})" if devices else ""),
        f"sysfs entries: {info['sysfs_entries']}",
        f"netlink answers: {info['netlink_answers']}",
        f"verbs answers: {info['verbs_answers']}",
        f"processes: {info['processes']}",
        f"size: {size}",
    ):
        inv.print(line)


# -- diff ---------------------------------------------------------------------------------------

COUNTER_FIELDS = [
    render.Field("ifname", lambda c: c.sample.device, header="DEV"),
    render.Field("port", lambda c: c.sample.port or None, header="PORT", text=str),
    render.Field("counter", lambda c: c.sample.name, header="COUNTER"),
    render.Field("source", lambda c: c.sample.source, header="SOURCE"),
    render.Field("before", lambda c: c.before, header="BEFORE"),
    render.Field("delta", lambda c: c.delta, header="DELTA", always=True),
    render.Field("unit", lambda c: _unit(c.sample), header="UNIT"),
    render.Field("rate_per_sec", lambda c: c.rate, header="RATE/s", text=lambda v: f"{v:,.1f}"),
    render.Field("note", lambda c: c.note, header="NOTE"),
]
OBJECT_FIELDS = [
    render.Field("object", lambda o: o.kind, header="OBJECT"),
    render.Field("ifname", lambda o: o.device, header="DEV"),
    render.Field("pid", lambda o: o.pid, header="PID"),
    render.Field("comm", lambda o: o.comm, header="COMM"),
    render.Field("appeared", lambda o: o.appeared, header="APPEARED", always=True),
    render.Field("gone", lambda o: o.gone, header="GONE", always=True),
]
GID_FIELDS = [
    render.Field("ifname", lambda g: g.device),
    render.Field("port", lambda g: g.port),
    render.Field("index", lambda g: g.index),
    render.Field("gid", lambda g: g.gid),
    render.Field("type", lambda g: g.type.label if g.type is not None else None),
    render.Field("netdev", lambda g: g.netdev),
]


def _meta(data: dict[str, Any], path: str) -> dict[str, Any]:
    return {
        "file": path,
        "host": data.get("host"),
        "time": _when(data.get("time")),
        "kernel": data.get("kernel"),
        "ibtool": data.get("ibtool"),
    }


def _diff(inv: Invocation, a_path: str, b_path: str) -> None:
    from ibtool.api.events import event_json, event_line
    from ibtool.api.snapshot import SnapshotHost, compare

    a = SnapshotHost(a_path, inv.warn, False, **inv.snapshot_kwargs())
    try:
        b = SnapshotHost(b_path, inv.warn, False, **inv.snapshot_kwargs())
        try:
            seconds = float(b.data["time"]) - float(a.data["time"])
            result = compare(a.host, b.host, seconds)
        finally:
            b.close()
    finally:
        a.close()
    fabric = None  # compared where a snapshot holds a fabric scan; then both must
    if a.fabric is not None or b.fabric is not None:
        from ibtool.api.fabric import fabric_changes

        if a.fabric is None or b.fabric is None:
            inv.warn("the fabric is not compared: only one snapshot holds a fabric scan")
        else:
            fabric = fabric_changes(a.fabric[0], b.fabric[0], a.fabric[1], b.fabric[1])
    metas = _meta(a.data, a_path), _meta(b.data, b_path)
    if metas[0]["host"] != metas[1]["host"]:
        inv.warn(
            "the snapshots are of two hosts: "
            f"{_plain(metas[0]['host'])} and {_plain(metas[1]['host'])}"
        )
    if inv.json:
        inv.emit_json(
            {
                "a": metas[0],
                "b": metas[1],
                "seconds": round(seconds, 3),
                "events": [event_json(e) for e in result.events],
                "gids_added": [render.record_json(g, GID_FIELDS, True) for g in result.gids_added],
                "gids_removed": [
                    render.record_json(g, GID_FIELDS, True) for g in result.gids_removed
                ],
                "counters": [render.record_json(c, COUNTER_FIELDS, True) for c in result.counters],
                "objects": [render.record_json(o, OBJECT_FIELDS, True) for o in result.objects]
                if result.objects_known
                else None,
                **(
                    {"fabric": [{"kind": c.kind, "what": c.what} for c in fabric]}
                    if fabric is not None
                    else {}
                ),
            }
        )
        return
    inv.print(
        f"from {a_path} ({_plain(metas[0]['host'])}, {metas[0]['time']}) "
        f"to {b_path} ({_plain(metas[1]['host'])}, {metas[1]['time']}): {seconds:,.1f} s"
    )
    for e in result.events:
        inv.print(event_line(e).removeprefix("- "))
    for sign, gids in (("+", result.gids_added), ("-", result.gids_removed)):
        for g in gids:
            where = f"{g.device}/{g.port}"
            kind = g.type.label if g.type is not None else ""
            inv.print(f"gid {sign} {where} {g.index} {g.gid} {kind} {g.netdev or ''}".rstrip())
    if result.counters:
        inv.print()
        for line in render.table(result.counters, COUNTER_FIELDS, False):
            inv.print(line)
    if result.objects:
        inv.print()
        for line in render.table(result.objects, OBJECT_FIELDS, False):
            inv.print(line)
    elif not result.objects_known:
        inv.warn("RDMA objects are not compared: a snapshot holds no resource dumps")
    if fabric:
        inv.print()
        for change in fabric:
            inv.print(_plain(f"fabric: {change.what}"))
    elif fabric is not None:
        inv.print()
        inv.print("fabric: no node, link or error counter changed")


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    if words[:1] != ["save"]:
        for option, value in (("--fabric", inv.args.fabric), ("--via", inv.args.via)):
            if value:
                raise UsageError(f"{option} is for snapshot save", USAGE)
    if inv.args.via and not inv.args.fabric:
        raise UsageError("--via is for snapshot save --fabric", USAGE)
    if words[:1] == ["save"] and len(words) == 2:
        return _save(inv, words[1])
    if words[:1] == ["show"] and len(words) == 2:
        return _show(inv, words[1])
    if words[:1] == ["diff"] and len(words) == 3:
        return _diff(inv, words[1], words[2])
    if words[:1] in (["save"], ["show"], ["diff"]):
        need = "two files" if words[0] == "diff" else "a file"
        raise UsageError(f"snapshot {words[0]} takes {need}", USAGE)
    raise UsageError(f"unknown snapshot action {' '.join(words[:1]) or '(none)'}", USAGE)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "snapshot",
        run,
        help="save this host's RDMA state in one file, say what such a file is, or compare two",
        configure=_configure,
    )
