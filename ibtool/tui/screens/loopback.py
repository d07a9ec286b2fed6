"""The loopback self-test on one port, run from the dashboard: progress, then each
operation's PASS/FAIL. The test runs in a thread; the dashboard keeps polling. What runs it (a
`Runner`) is handed in by the command: the screen shows results and never reaches the data
path itself."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, ProgressBar, Static
from textual.worker import get_current_worker

from ibtool.errors import IbtoolError
from ibtool.model.names import escaped
from ibtool.tui import format

OPS = ("send", "write", "write_imm", "read", "fetch_add", "cmp_swap", "ud_send")
SIZE, ITERS, TIMEOUT = 4096, 100, 2.0
STYLE = {"PASS": "bold green", "FAIL": "bold red", "TIMEOUT": "bold red", "UNSUPPORTED": "yellow"}

# runner(device, port, ops, report, cancelled): runs the ops (SIZE bytes, ITERS iterations,
# TIMEOUT seconds each), report(result) after each.
Runner = Callable[[str, int, tuple, Callable[[object], None], Callable[[], bool]], None]


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


class LoopbackScreen(ModalScreen):
    BINDINGS = [("escape,q", "dismiss", "Close")]

    def __init__(self, device: str, port: int, runner: Runner, ops: tuple = OPS) -> None:
        super().__init__()
        self.device, self.port, self.runner, self.ops = device, port, runner, ops
        self.results: list = []
        self.done = False

    def compose(self) -> ComposeResult:
        with Vertical(id="loopback"):
            yield Static(
                # Text: a str is markup; the device's name is any but '/'
                format.plain(
                    f"loopback on {self.device}/{self.port}: {len(self.ops)} operations, "
                    f"{SIZE} bytes, {ITERS} iterations each"
                ),
                id="loopback-title",
            )
            yield ProgressBar(total=len(self.ops), show_eta=False, id="loopback-progress")
            yield DataTable(id="loopback-results", cursor_type="none")
            yield Static(
                "running… (Escape closes; the test stops after the current operation)",
                id="loopback-status",
            )

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("OP", "STATUS", "P50_us", "P99_us", "MB/s")
        self.run_test()

    @work(thread=True, exclusive=True)
    def run_test(self) -> None:
        worker = get_current_worker()
        try:
            self.runner(
                self.device,
                self.port,
                self.ops,
                lambda r: self.app.call_from_thread(self.add_result, r),
                lambda: worker.is_cancelled,
            )
        except IbtoolError as e:
            why = e.message + (f" (hint: {e.hint})" if e.hint else "")
            self.app.call_from_thread(self.finish, why)
        except Exception as e:  # the test's fault is shown here, never a traceback on screen
            self.app.call_from_thread(self.finish, f"{type(e).__name__}: {e}")
        else:
            self.app.call_from_thread(self.finish, None)

    def add_result(self, r) -> None:
        self.results.append(r)
        status = r.status.value
        bw = "-" if r.bandwidth_mbps is None else f"{r.bandwidth_mbps:.1f}"
        self.query_one(DataTable).add_row(
            r.op,
            Text(status, style=STYLE.get(status, "")),
            _us(r.percentile(50)),
            _us(r.percentile(99)),
            bw,
        )
        self.query_one(ProgressBar).advance(1)

    def finish(self, error: str | None) -> None:
        self.done = True
        bar = self.query_one(ProgressBar)
        bar.update(total=len(self.results) or 1, progress=len(self.results) or 1)
        failed = [r.op for r in self.results if r.status.value in ("FAIL", "TIMEOUT")]
        if error is not None:  # may name the device, or quote the provider's words
            text = format.plain(f"not run: {error}", style="bold red")
        elif failed:
            text = Text(f"FAILED: {', '.join(failed)}", style="bold red")
        else:
            text = Text(
                f"all {len(self.results)} operations passed or are unsupported", style="bold green"
            )
        for r in self.results:
            if r.error:
                text.append(
                    "\n" + escaped(f"{r.op}: {r.error}"),
                    style="" if r.status.value == "UNSUPPORTED" else "red",
                )
        text.append("\n(Escape closes)", style="dim")
        self.query_one("#loopback-status", Static).update(text)
