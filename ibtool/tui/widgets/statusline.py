"""The line on top: what is shown, how often it is read, the host's health at a glance."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.widget import Widget

from ibtool.live.feed import Frame
from ibtool.model.health import Status
from ibtool.model.names import escaped
from ibtool.tui import format


def clock(wall: float) -> str:
    return datetime.fromtimestamp(wall).astimezone().strftime("%H:%M:%S")


def describe(frame: Frame | None, interval: float, paused: bool, width: int = 0) -> Text:
    """The line; where it is wider than `width`, a snapshot's or tree's path is cut from the
    left (its end kept: the file's name) so that the health stays in sight."""
    # a path as typed, or as a directory listing gave it: a control character escaped
    source = escaped(frame.source) if frame else ""
    text = _describe(frame, interval, paused, source)
    if frame is None or not width or text.cell_len <= width:
        return text
    what, _, where = source.rpartition(" ")  # "snapshot PATH", "--root DIR"
    if "/" not in where.rstrip("/"):
        return text  # "this host", a relative directory: nothing to cut
    for head in (f"{what} " if what else "", ""):
        # the path's last 12 characters at least: most of a file name, its suffix
        keep = max(12, len(where) - (text.cell_len - width) - len(head) - 1)
        if keep >= len(where):
            return text
        shorter = _describe(frame, interval, paused, f"{head}…{where[-keep:]}")
        if shorter.cell_len <= width:
            break
    return shorter


def _describe(frame: Frame | None, interval: float, paused: bool, source: str) -> Text:
    if frame is None:
        return Text(" ibtool · reading the host…", style="bold")
    text = Text(" ibtool ", style="bold")
    text.append(f"· {source} ")
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
        self._said: tuple = (None, 0.0, False)

    def render(self) -> Text:
        return self.shown

    def show(self, frame: Frame | None, interval: float, paused: bool) -> None:
        self._said = (frame, interval, paused)
        text = describe(frame, interval, paused, self.size.width)
        if text != self.shown:
            self.shown = text
            self.refresh()

    def on_resize(self) -> None:
        self.show(*self._said)
