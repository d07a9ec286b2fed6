"""A port up close: every counter with its rate and history, the GID table, the resources."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

from ibtool.live.feed import Frame, PortKey
from ibtool.model.health import Status
from ibtool.model.names import escaped
from ibtool.tui import format
from ibtool.tui.widgets.counters import CounterTable, explain
from ibtool.tui.widgets.gids import GidTable
from ibtool.tui.widgets.owners import OwnerTable
from ibtool.tui.widgets.ports import address_cell, physical_state_cell, rate_cell, state_cell
from ibtool.tui.widgets.statusline import StatusLine


def facts(frame: Frame, key: PortKey) -> Text:
    row = frame.row(key)
    # the device's name, a netdev's, an error naming a file: the kernel's or a capture's,
    # escaped (format.plain)
    name = escaped(f"{key[0]}/{key[1]}")
    if row is None and frame.failed:
        return format.plain(f" {name}: not read: {frame.error}", style="bold red")
    if row is None:
        return Text(f" {name}: gone (the device or port is no longer there)", style="bold red")
    p = row.port
    text = Text(f" {name} ", style="bold")
    for part in (state_cell(row), physical_state_cell(row), rate_cell(row)):
        text.append_text(format.escaped_text(part))
        text.append("  ")
    text.append(f"{p.link_layer.label if p.link_layer else '?'}  {escaped(address_cell(row))}")
    text.append("  health ")
    text.append_text(format.status(row.health))
    for f in row.findings:
        if f.status != Status.OK:
            text.append(
                f"\n   {format.STATUS_WORD[f.status]} ", style=format.STATUS_STYLE[f.status]
            )
            text.append(escaped(f"{f.check}: {f.summary}"))
    if row.degraded:
        text.append(f"\n   link: {escaped(row.degraded)}", style="yellow")
    return text


class PortScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", key_display="Esc"),
        ("l", "app.loopback", "Loopback"),
        ("d", "app.doctor", "Doctor"),
        Binding("1", "tab('counters')", "Counters tab", show=False),
        Binding("2", "tab('gids')", "GIDs tab", show=False),
        Binding("3", "tab('owners')", "Resources tab", show=False),
    ]
    TABS = {"counters": "counters-tab", "gids": "gids-tab", "owners": "resources-tab"}

    def __init__(self, key: PortKey) -> None:
        super().__init__()
        self.key = key
        self.frame: Frame | None = None

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Static(id="facts")
        with TabbedContent(id="tabs"):
            with TabPane("Counters", id="counters-tab"):
                yield CounterTable(self.key, id="counters")
                yield Static(id="explain")
            with TabPane("GIDs", id="gids-tab"):
                yield Static(id="gid-note")
                yield GidTable(id="gids")
            with TabPane("Resources", id="resources-tab"):
                yield Static(id="owner-note")
                yield OwnerTable(id="owners")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(CounterTable).focus()

    def action_tab(self, table: str) -> None:
        self.query_one(TabbedContent).active = self.TABS[table]
        self.query_one(f"#{table}", DataTable).focus()

    def show_frame(self, frame: Frame, interval: float, paused: bool) -> None:
        self.frame = frame
        self.query_one(StatusLine).show(frame, interval, paused)
        self.query_one("#facts", Static).update(facts(frame, self.key))
        counters = self.query_one(CounterTable)
        counters.show(frame)
        if frame.row(self.key) is None:
            self._absent(frame)
            return
        if not frame.counters.get(self.key):
            self.query_one("#explain", Static).update(Text("no counters on this port"))
        else:
            self._explain()
        focus = (
            frame.focus
            if frame.focus and (frame.focus.device, frame.focus.port) == self.key
            else None
        )
        waiting = "paused: r reads this port's" if paused else "reading this port's"
        gid_note = f"{waiting} GIDs…" if focus is None else None
        owner_note = f"{waiting} resources…" if focus is None else None
        if focus is not None:
            self.query_one(GidTable).show(focus)
            self.query_one(OwnerTable).show(focus)
            gid_note = focus.gid_note or self._gid_summary(focus)
            owner_note = focus.resources_note or (
                f"{len(focus.owners)} holder(s) of QPs on this port, CQs and MRs on {self.key[0]}"
                if focus.owners
                else "no QPs, CQs or MRs held"
            )
        # a note may quote the kernel's or a capture's error, naming a device or a file
        self.query_one("#gid-note", Static).update(format.plain(gid_note or ""))
        self.query_one("#owner-note", Static).update(format.plain(owner_note or ""))

    def _absent(self, frame: Frame) -> None:
        """The port is not in this frame (gone, or the poll failed): nothing of it is shown as
        if current. Its GIDs and resources are read again when it is back."""
        name = escaped(f"{self.key[0]}/{self.key[1]}")
        why = "not read" if frame.failed else "gone"
        self.query_one(GidTable).show_rows([])
        self.query_one(OwnerTable).show_rows([])
        self.query_one("#explain", Static).update(Text(f"{name} is {why}: no counters"))
        self.query_one("#gid-note", Static).update(Text(f"{name} is {why}: no GIDs"))
        self.query_one("#owner-note", Static).update(Text(f"{name} is {why}: no resources"))

    def _gid_summary(self, focus) -> str:
        count = f"{len(focus.gids)} GID{'s' * (len(focus.gids) != 1)}"
        if focus.best_gid is None:
            return count
        best = focus.best_gid
        return f"{count}; * index {best}: what the data path uses (gids --best)"

    def _explain(self) -> None:
        r = self.query_one(CounterTable).highlighted()
        if r is not None:  # Text: the counter's name is not markup
            self.query_one("#explain", Static).update(Text(explain(r.sample.name, r.sample.source)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, CounterTable):
            self._explain()
