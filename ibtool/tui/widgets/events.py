"""The change engine's events, newest first, with their time."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from rich.text import Text
from textual.widgets import Static

from ibtool.model.events import Event
from ibtool.model.names import escaped
from ibtool.views.events import event_line

KEPT = 500
ALARMING = {"unregister", "netdev_detach", "counter_reset"}


def _style(e: Event) -> str:
    if e.event in ALARMING:
        return "bold yellow"
    if e.event == "port_state":
        return "bold green" if e.now("state") == "ACTIVE" else "bold red"
    return ""


def line(e: Event) -> Text:
    """An event as `ibtool monitor` prints it, the time shortened to the clock; the names in it
    (a device's, a netdev's: the kernel's or a capture's) escaped."""
    text = escaped(event_line(e))
    stamp, _, rest = text.partition(" ")
    clock = stamp[11:19] if len(stamp) >= 19 else stamp
    out = Text(clock + " ", style="dim")
    out.append(rest, style=_style(e))
    return out


class EventLog(Static):
    """The last KEPT events; the newest on top."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.events: deque[Event] = deque(maxlen=KEPT)

    def on_mount(self) -> None:
        self._render_events()

    def add(self, events: Iterable[Event]) -> None:
        events = list(events)
        if events:
            self.events.extend(events)
            self._render_events()

    def _render_events(self) -> None:
        if not self.events:
            self.update(
                Text(
                    "no events yet: port state, LID, device and counter-reset changes show here",
                    style="dim",
                )
            )
            return
        self.update(Text("\n").join(line(e) for e in reversed(self.events)))
