"""The line on top: what is shown, how often it is read, the host's health at a glance."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.widget import Widget

from ibtool.api import Status
from ibtool.feed import Frame
from ibtool.tui import format


def clock(wall: float) -> str:
    return datetime.fromtimestamp(wall).astimezone().strftime("%H:%M:%S")


def describe(frame: Frame | None, interval: float, paused: bool) -> Text:
    if frame is None:
        return Text(" ibtool · reading the host…", style="bold")
    text = Text(" ibtool ", style="bold")
    text.append(f"· {frame.source} ")
    devices = len({r.key[0] for r in frame.rows})
    text.append(
        f"· {devices} device{'s' * (devices != 1)}, {len(frame.rows)} "
        f"port{'s' * (len(frame.rows) != 1)} "
    )
    if not frame.live:
        text.append("· capture: no rates ", style="yellow")
    elif paused:
        text.append("· PAUSED ", style="bold reverse yellow")
    else:
        text.append(f"· every {interval:g} s ")
    statuses = [r.health for r in frame.rows if r.health is not None]
    statuses += [f.status for f in frame.host_findings]
    if statuses:
        worst = Status.worst(statuses)
        text.append("· health ")
        text.append(format.STATUS_WORD[worst], style=format.STATUS_STYLE[worst])
        if frame.health_time is not None:
            text.append(f" at {clock(frame.health_time)}")
        text.append(" ")
    text.append(f"· {clock(frame.time)}", style="dim")
    return text


class StatusLine(Widget):
    """One line, repainted in place: its clock changes every poll, and a Static's update
    would lay the whole screen out again each time."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shown = describe(None, 0, False)

    def render(self) -> Text:
        return self.shown

    def show(self, frame: Frame | None, interval: float, paused: bool) -> None:
        text = describe(frame, interval, paused)
        if text != self.shown:
            self.shown = text
            self.refresh()
