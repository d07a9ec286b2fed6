"""Events (ibtool.model.events) as a line of text and as a JSON object: the columns of
`ibtool monitor`, `ibtool snapshot diff` and the dashboard's event log."""

from __future__ import annotations

from typing import Any

from ibtool.model.events import Event
from ibtool.views import render


def _change(key: str) -> list[render.Field]:
    return [
        render.Field(key, lambda e: e.now(key)),
        render.Field(f"old_{key}", lambda e: e.before(key)),
    ]


# JSON keys; time, event, ifname, port and source are in every object, the others only when
# the event has them.
FIELDS = [
    render.Field("time", lambda e: e.time),
    render.Field("event", lambda e: e.event),
    render.Field("ifname", lambda e: e.device),
    render.Field("port", lambda e: e.port),
    render.Field("dev_index", lambda e: e.device_index),
    render.Field("netdev", lambda e: e.now("netdev") or e.netdev),
    render.Field("netdev_index", lambda e: e.netdev_index),
    render.Field("event_type", lambda e: e.event_type),
    render.Field("old_ifname", lambda e: e.before("ifname")),
    render.Field("old_netdev", lambda e: e.before("netdev")),
    *_change("state"),
    *_change("physical_state"),
    *_change("lid"),
    *_change("sm_lid"),
    *_change("lmc"),
    render.Field("source", lambda e: e.source),
]
ALWAYS = {"time", "event", "ifname", "port", "source"}


def event_json(e: Event) -> dict[str, Any]:
    row = render.record_json(e, FIELDS, True)
    return {k: v for k, v in row.items() if k in ALWAYS or v is not None}


def event_line(e: Event) -> str:
    where = (e.device or "-") + (f"/{e.port}" if e.port is not None else "")
    parts = [e.time or "-", e.event, where]
    if e.event == "unknown":
        parts.append(f"event_type {e.event_type}")
    shown = set()
    for key, old, new in e.changes:
        shown.add(key)
        if key == "ifname":
            parts.append(f"(was {old})")
            continue
        parts.append(f"{key} {_text(new)}")
        if old is not None and old != new:
            parts.append(f"(was {_text(old)})")
    if e.netdev and "netdev" not in shown and e.event.startswith("netdev"):
        parts.append(f"netdev {e.netdev}")
    if e.netdev_index is not None and e.event.startswith("netdev"):
        parts.append(f"ifindex {e.netdev_index}")
    return " ".join(parts)


def _text(value: Any) -> str:
    # None: the value could not be read at that moment (the port went away mid-read, a file
    # the driver failed), not a state of its own.
    return "unknown" if value is None else str(value)
