"""`ibtool doctor` on one port, from the dashboard: a PEER to type (empty: this host's side
only), then the checklist (STATUS, CHECK, EVIDENCE) between the head line naming both ends and
the summary, and the highlighted check's evidence and fix in full below. The doctor runs in a
thread; the dashboard keeps polling. What runs it (a `Runner`) is handed in by the command: the
screen shows the report and never reaches the host or the peer itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from ibtool.errors import IbtoolError
from ibtool.model.doctor import Finding, Verdict
from ibtool.model.names import escaped
from ibtool.tui import format

STYLE = {
    Verdict.PASS: "green",
    Verdict.WARN: "yellow",
    Verdict.FAIL: "bold red",
    Verdict.SKIP: "dim",
}
READY = "Enter runs the doctor (no peer: this host's side only)"

# runner(device, port, peer, cancelled) -> ibtool.doctor.run.Report: the checklist of
# device/port (and of the peer, an address or name, when given); `cancelled()` says the screen
# is gone and the result is no longer wanted.
Runner = Callable[[str, int, Optional[str], Callable[[], bool]], object]


class DoctorScreen(ModalScreen):
    """Dismissed with the last peer run (None: nothing ran), for the dashboard to offer it
    again the next time."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        # the keys browse the checklist while the peer field keeps the focus
        Binding("up", "row(-1)", show=False),
        Binding("down", "row(1)", show=False),
        Binding("pageup", "row(-10)", show=False),
        Binding("pagedown", "row(10)", show=False),
    ]

    def __init__(self, device: str, port: int, runner: Runner, peer: str | None = None) -> None:
        super().__init__()
        self.device, self.port, self.runner = device, port, runner
        self.peer = peer or ""
        self.report = None
        self.findings: list[Finding] = []
        self.ran: str | None = None  # the peer of the last run ("" : none)
        self.running = False
        self._fitted = (0, 0)  # the box's and the table's max-height
        self._run = 0  # the number of the run whose result is shown when it comes

    def compose(self) -> ComposeResult:
        with Vertical(id="doctor") as box:
            # Text: a str title is markup; the device's name is any but '/'
            box.border_title = format.plain(f"doctor {self.device}/{self.port}")
            box.border_subtitle = "Enter runs · Escape closes"
            with Horizontal(id="doctor-ask"):
                yield Static("peer ", id="doctor-label")
                yield Input(
                    self.peer,
                    placeholder="address or name running ibtool ping --server; empty: this side",
                    id="doctor-peer",
                )
            yield Static("", id="doctor-head")
            yield DataTable(id="doctor-checks", cursor_type="row", zebra_stripes=False)
            yield Static(Text(READY, style="dim"), id="doctor-status")
            yield Static("", id="doctor-fix")

    def on_mount(self) -> None:
        self._columns()
        self.query_one("#doctor-fix").display = False
        self.query_one("#doctor-head").display = False
        self.query_one(DataTable).display = False  # until there is a checklist to show
        self.query_one(Input).focus()

    # -- the layout ----------------------------------------------------------------------------

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _fit(self) -> None:
        """The box as tall as its content, within the screen less a line above and below; the
        checklist scrolls within what the peer field, the head, the summary and the fix leave
        (CSS cannot say "auto, but at most what is left")."""
        if not self.is_attached:
            return
        box = self.query_one("#doctor")
        table = self.query_one(DataTable)
        tall = max(8, self.size.height - 2)
        rest = 2 + sum(  # the box's border, then its other lines
            w.outer_size.height for w in box.children if w.display and w.id != "doctor-checks"
        )
        most = max(3, tall - rest)
        if self._fitted != (tall, most):
            self._fitted = (tall, most)
            box.styles.max_height = tall
            table.styles.max_height = most
            # the highlighted check back in view, once the table has its new height
            self.call_after_refresh(lambda: table.move_cursor(row=table.cursor_row, scroll=True))

    def _columns(self) -> None:
        """The table emptied, its columns as wide as their headings again."""
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_column("STATUS", key="status")
        table.add_column("CHECK", key="check")
        table.add_column("EVIDENCE", key="evidence")

    # -- running -------------------------------------------------------------------------------

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()  # the dashboard's own Input is the port filter: not this one

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.start(event.value)

    def start(self, peer: str) -> None:
        peer = peer.strip()
        self._run += 1
        self.running = True
        self.ran = peer
        where = f"{self.device}/{self.port}" + (f" -> {peer}" if peer else "")
        self.query_one("#doctor-status", Static).update(
            format.plain(f"running… ({where})", style="bold")
        )
        self.diagnose(self._run, peer or None)

    @work(thread=True, exclusive=True, group="doctor")
    def diagnose(self, run: int, peer: str | None) -> None:
        worker = get_current_worker()
        try:
            report = self.runner(self.device, self.port, peer, lambda: worker.is_cancelled)
        except IbtoolError as e:
            error = "not run: " + e.message + (f" (hint: {e.hint})" if e.hint else "")
            result = (None, error)
        except Exception as e:  # the doctor's fault is shown here, never a traceback on screen
            result = (None, f"not run: {type(e).__name__}: {e}")
        else:
            result = (report, None)
        if not worker.is_cancelled:
            self.app.call_from_thread(self.show, run, *result)

    def show(self, run: int, report, error: str | None) -> None:
        if run != self._run or not self.is_attached:
            return  # a run started after this one: its result is the one wanted
        self.running = False
        self._columns()
        table = self.query_one(DataTable)
        status = self.query_one("#doctor-status", Static)
        head = self.query_one("#doctor-head", Static)
        if error is not None:
            self.report, self.findings = None, []
            head.update("")
            head.display = False
            table.display = False
            status.update(format.plain(error, style="bold red"))
            self._show_fix(None)
            self.call_after_refresh(self._fit)
            return
        from ibtool.views import doctor as view

        self.report, self.findings = report, list(report.findings)
        # what the peer answered (its host's, device's and netdev's names) as text, escaped
        head.update(format.plain(view.head(report.local, report.peer, report.peer_address)))
        head.display = True
        table.display = bool(self.findings)
        for i, f in enumerate(self.findings):
            table.add_row(
                Text(f.verdict.value, style=STYLE.get(f.verdict, "")),
                format.cell(f.check),
                format.plain(f.evidence, no_wrap=True),
                key=str(i),
            )
        status.update(Text(view.summary(self.findings), style=STYLE.get(report.verdict, "") or ""))
        if self.findings:
            first = next(
                (i for i, f in enumerate(self.findings) if f.verdict == Verdict.FAIL),
                next((i for i, f in enumerate(self.findings) if f.fix), 0),
            )
            table.move_cursor(row=first)
            self._show_fix(self.findings[first])
        self.call_after_refresh(self._fit)

    # -- the highlighted check -----------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if 0 <= event.cursor_row < len(self.findings):
            self._show_fix(self.findings[event.cursor_row])

    def _show_fix(self, finding: Finding | None) -> None:
        box = self.query_one("#doctor-fix", Static)
        if finding is None:
            box.display = False
            return
        text = Text()
        text.append(f"{escaped(finding.check)}: ", style="bold")
        text.append(escaped(finding.evidence))
        if finding.fix:
            text.append("\nfix: ", style="bold yellow")
            text.append(escaped(finding.fix))
        else:
            text.append("\nno fix", style="dim")
        box.update(text)
        box.display = True
        self.call_after_refresh(self._fit)

    @property
    def fix(self) -> str:
        """The fix box's text, as shown ("" when hidden)."""
        box = self.query_one("#doctor-fix", Static)
        return str(box.render()) if box.display else ""

    def action_row(self, by: int) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            row = max(0, min(table.row_count - 1, table.cursor_row + by))
            table.move_cursor(row=row)

    def action_close(self) -> None:
        self.workers.cancel_group(self, "doctor")
        self.dismiss(self.ran)
