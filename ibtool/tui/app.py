"""The dashboard: the overview of every port, a port's detail, the events, the actions.

One poller feeds every screen and panel: a thread worker reads the host (`Feed.poll`), posts
the frame, and only then is the next poll armed, so polls never overlap and a slow read
delays the next frame, never the keys. Screens that are not shown are brought up to date
when they come back, not at every frame.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Footer, Input, Static

from ibtool.errors import IbtoolError
from ibtool.live.feed import Feed, Frame
from ibtool.model.health import Status
from ibtool.model.names import escaped
from ibtool.tui import format
from ibtool.tui.messages import Polled
from ibtool.tui.screens.detail import PortScreen
from ibtool.tui.screens.doctor import DoctorScreen
from ibtool.tui.screens.doctor import Runner as DoctorRunner
from ibtool.tui.screens.fabric import FabricPortScreen, FabricScreen
from ibtool.tui.screens.help import HelpScreen
from ibtool.tui.screens.loopback import LoopbackScreen, Runner
from ibtool.tui.screens.mesh import MeshScreen
from ibtool.tui.widgets.events import EventLog
from ibtool.tui.widgets.ports import PortTable
from ibtool.tui.widgets.statusline import StatusLine

INTERVALS = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)  # `<` and `>` step through these, as rdmatop's
SHOWN_FINDINGS = 4


def findings_text(frame: Frame):
    """The findings that are not OK, worst first: why a port says CRIT."""
    from rich.text import Text

    found = [f for r in frame.rows for f in r.findings] + list(frame.host_findings)
    bad = sorted({f for f in found if f.status != Status.OK}, key=_worst_first)
    if frame.error:
        return format.plain(f" {frame.error}", style="bold red")
    if not bad:
        return Text(" health: every check OK" if found else "", style="green")
    text = Text()
    for f in bad[:SHOWN_FINDINGS]:
        text.append(f" {format.STATUS_WORD[f.status]} ", style=format.STATUS_STYLE[f.status])
        where = f"{f.subject}: " if f.subject else ""
        # a HealthResult escapes its subject and summary when made: again here, at no cost,
        # for a finding that came some other way
        text.append(escaped(f"{where}{f.summary}") + "\n")
    if len(bad) > SHOWN_FINDINGS:
        text.append(f" … and {len(bad) - SHOWN_FINDINGS} more (Enter on a port shows its own)")
    return text.rstrip() or text


def _worst_first(f):
    order = {Status.CRITICAL: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.OK: 3}
    return (order[f.status], f.subject, f.summary)


class Dashboard(App):
    # Absolute: textual resolves a relative CSS_PATH beside the module of a subclass.
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "ibtool"
    # Narrower than 100 columns the screens are "-narrow": the footer's keys closer together
    # (app.tcss), for every key to fit 80 columns
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # as every other tool
        Binding("enter", "open", "Port detail", show=False),
        Binding("l", "loopback", "Loopback"),
        Binding("d", "doctor", "Doctor", tooltip="Doctor: why RDMA to a peer fails"),
        # only where there is a fabric to show (check_action): an InfiniBand port here, or a
        # snapshot that saved one. Narrower than 100 columns with a filter set the footer has
        # no room for it beside "Esc Clear": its twin, never in the footer, takes the key.
        Binding("f", "fabric", "Fabric", tooltip="Fabric: the subnet's switch ports and SMs"),
        Binding("f", "fabric('twin')", show=False),
        # in the help, not the footer: with a filter set, an 80-column footer has no room for it
        Binding("m", "mesh", "Mesh", tooltip="Mesh: the last ibtool mesh run here", show=False),
        Binding("p", "pause", "Pause"),
        Binding("r", "refresh", "Read", tooltip="Read now (a capture: read it again)"),
        # < and > are in the help, not the footer: at 80 columns it has room for the rest only
        Binding("less_than_sign", "slower", "Slower", key_display="<", show=False),
        Binding("greater_than_sign", "faster", "Faster", key_display=">", show=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        # In the footer only while a filter is typed or set (check_action), as "Clear" beside
        # "/ Filter": a longer word pushes "? Help" off an 80-column footer. The help says more.
        Binding("escape", "clear_filter", "Clear", key_display="Esc", tooltip="Clear the / filter"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(
        self,
        feed: Feed,
        *,
        interval: float = 1.0,
        panels: dict[str, Callable] | None = None,
        loopback: Runner | None = None,
        doctor: DoctorRunner | None = None,
        peers: tuple[str, ...] | None = None,
        mesh: str | None = None,
        fabric=None,
        thresholds: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        self.feed = feed
        self.interval = interval
        self.paused = False
        self.frame: Frame | None = None
        self.loopback_runner = loopback
        self.doctor_runner = doctor
        self.mesh_path = mesh  # the last mesh's file; None: ibtool.mesh.last.default_path()
        # the fabric's FabricWatch (ibtool.live.fabric), started when the fabric screen is
        # first opened, stopped by whoever made it; and the error counters' thresholds
        self.fabric = fabric
        self.thresholds = dict(thresholds or {})
        # the doctor's peer: the last one run in this session, else the health config's first
        # [datapath] peer
        if peers is None:
            peers = getattr(getattr(getattr(feed, "engine", None), "config", None), "peers", ())
        self.doctor_peer: str | None = next(iter(peers or ()), None)
        self._panel_factories = panels or {}
        self.panels: list = []
        self._timer = None
        self._polling = False
        self._notes_seen: set[str] = set()
        self._findings = None

    @property
    def polling(self) -> bool:
        """Whether a poll is under way (its worker reading the host, its frame not shown yet)."""
        return self._polling

    @property
    def poll_armed(self) -> bool:
        """Whether the next poll is scheduled (not while paused, nor for a capture)."""
        return self._timer is not None

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield PortTable(id="ports")
        yield Static(id="findings")
        yield Input(
            placeholder="filter ports: name, netdev, state or health (Escape clears)", id="filter"
        )
        with VerticalScroll(id="events-box"):
            yield EventLog(id="events")
        if self._panel_factories:
            with Horizontal(id="panels"):
                for name, factory in self._panel_factories.items():
                    yield self._panel(name, factory)
        yield Footer()

    def _panel(self, name: str, factory: Callable):
        try:
            panel = factory(self.feed)
            panel.border_title = name
        except Exception as e:  # a plugin's panel fails alone, shown in its place
            panel = Static(format.plain(f"panel {name} failed: {type(e).__name__}: {e}"))
            panel.border_title = name
        else:
            self.panels.append(panel)
        panel.add_class("panel")
        return panel

    @property
    def overview(self):
        """The first screen: the port table, findings, events and panels, shown or not."""
        return self.screen_stack[0]

    def on_mount(self) -> None:
        self.overview.query_one("#filter", Input).display = False
        self.overview.query_one("#events-box").border_title = "events, newest first"
        self.overview.query_one(PortTable).focus()
        self._start_poll()

    def _start_poll(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._polling = True
        self.poll()

    # -- polling -------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="poll")
    def poll(self) -> None:
        try:
            frame = self.feed.poll()
        except IbtoolError as e:
            frame = _failed(self.feed, e.message)
        except Exception as e:  # one bad poll is shown and the next one tried
            frame = _failed(self.feed, f"poll failed: {type(e).__name__}: {e}")
        self.post_message(Polled(frame))

    def on_polled(self, message: Polled) -> None:
        if self.frame is None:
            # What start-up built lives as long as the app: out of the collector's way, its
            # full collections walk only what the polls allocate (bench_tui: CPU at 64 ports).
            gc.freeze()
        self.frame = message.frame
        self._polling = False
        self._show()
        for panel in self.panels:
            panel.post_message(Polled(message.frame))
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if self.feed.live and not self.paused:
            self._timer = self.set_timer(self.interval, self._start_poll)

    def _show(self) -> None:
        frame = self.frame
        if frame is None:
            return
        for note in frame.notes:
            if note not in self._notes_seen:
                self._notes_seen.add(note)
                # a warning names files and devices (the kernel's, a capture's): plain text
                self.notify(escaped(note), severity="warning", timeout=8, markup=False)
        self.overview.query_one(EventLog).add(frame.events)
        screen = self.screen
        if isinstance(screen, PortScreen):
            screen.show_frame(frame, self.interval, self.paused)
        elif screen is self.screen_stack[0]:
            self._show_overview()

    def _show_overview(self) -> None:
        frame = self.frame
        self.overview.query_one(StatusLine).show(frame, self.interval, self.paused)
        if frame is None:
            return
        with self.batch_update():
            self.overview.query_one(PortTable).show(frame)
            findings = findings_text(frame)
            if findings != self._findings:  # an update lays the screen out again: only if new
                self._findings = findings
                self.overview.query_one("#findings", Static).update(findings)

    def on_screen_resume(self) -> None:
        self._show_overview()

    def on_unmount(self) -> None:
        """Quitting (q, Ctrl-C): the fabric's scans end after the one under way, if any; the
        terminal is given back without waiting for it."""
        if self.fabric is not None:
            self.fabric.stop(timeout=0)

    # -- actions -------------------------------------------------------------------------------

    def _selected(self):
        screen = self.screen
        if isinstance(screen, PortScreen):
            return screen.key
        return self.overview.query_one(PortTable).selected

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, PortTable):
            self.action_open()

    def action_open(self) -> None:
        key = self.overview.query_one(PortTable).selected
        if key is None or isinstance(self.screen, PortScreen):
            return
        self.feed.focus = key
        screen = PortScreen(key)
        self.push_screen(screen)
        self.call_after_refresh(self._show_detail, screen)
        if self.feed.live:
            self._poll_soon()
        elif not self._polling:
            self._start_poll()  # a capture is read again for this port's GIDs and resources

    def _show_detail(self, screen: PortScreen) -> None:
        """The newest frame, once the screen is there: a poll may have finished meanwhile."""
        if self.frame is not None and screen.is_attached:
            screen.show_frame(self.frame, self.interval, self.paused)

    def action_pop_screen(self) -> None:
        if isinstance(self.screen, PortScreen):
            self.feed.focus = None
        self.pop_screen()

    def _poll_soon(self) -> None:
        """A poll now, unless one is running (its frame comes soon) or the app is paused."""
        if self.feed.live and not self.paused and not self._polling:
            self._start_poll()

    def action_refresh(self) -> None:
        """One poll now, paused or not (a capture is read again too)."""
        if not self._polling:
            self._start_poll()

    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.paused:
            if self._timer is not None:
                self._timer.stop()
                self._timer = None
        else:
            self._poll_soon()
        self._show_status()

    def _show_status(self) -> None:
        for status in self.screen.query(StatusLine):
            status.show(self.frame, self.interval, self.paused)

    def _step(self, by: int) -> None:
        now = min(INTERVALS, key=lambda i: abs(i - self.interval))
        index = max(0, min(len(INTERVALS) - 1, INTERVALS.index(now) + by))
        self.interval = INTERVALS[index]
        self._show_status()
        if not self._polling:
            self._arm()  # the next poll at the new interval

    def action_slower(self) -> None:
        self._step(+1)

    def action_faster(self) -> None:
        self._step(-1)

    def action_filter(self) -> None:
        field = self.overview.query_one("#filter", Input)
        field.display = True
        field.focus()
        self.refresh_bindings()

    def on_input_changed(self, event: Input.Changed) -> None:
        table = self.overview.query_one(PortTable)
        table.filter = event.value.strip()
        if self.frame is not None:
            table.show(self.frame)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.action_clear_filter()
            return
        self.overview.query_one(PortTable).focus()

    def _filtering(self) -> bool:
        return self.overview.query_one("#filter", Input).display

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "clear_filter":
            return self.screen is self.overview and self._filtering()
        if action == "filter":  # the overview's ports: not from a port's detail
            return self.screen is self.overview
        if action in ("loopback", "doctor", "mesh"):  # of the overview's port or the detail's
            return self.screen is self.overview or isinstance(self.screen, PortScreen)
        if action == "fabric":  # not offered at all where there is no fabric
            if self.fabric is None or self.screen is not self.overview:
                return False
            return bool(parameters) or self.size.width >= 100 or not self._filtering()
        if action == "refresh":  # the host's read, not the fabric's: its watch scans alone
            return not isinstance(self.screen, (FabricScreen, FabricPortScreen))
        return True

    def action_clear_filter(self) -> None:
        """Escape: every port again, typing the filter or after Enter kept it."""
        field = self.overview.query_one("#filter", Input)
        field.value = ""
        field.display = False
        table = self.overview.query_one(PortTable)
        table.filter = ""
        if self.frame is not None:
            table.show(self.frame)
        table.focus()
        self.refresh_bindings()

    def deliver_screenshot(
        self,
        filename: str | None = None,
        path: str | None = None,
        time_format: str | None = None,
    ) -> str | None:
        """The palette's Screenshot: an SVG of the screen, saved where it can be (see
        screenshot_directory), the notification naming the file, or the reason it could not."""
        import time

        directory = Path(path) if path else screenshot_directory()
        stamp = time.strftime(time_format or "%Y%m%d-%H%M%S")
        svg = self.export_screenshot()
        for n in range(1, 100):
            name = filename or f"ibtool-tui-{stamp}{'' if n == 1 else f'-{n}'}.svg"
            target = directory / name
            try:
                # "x": never through a link or over a file someone placed there
                with open(target, "x", encoding="utf-8") as out:
                    out.write(svg)
            except FileExistsError:
                if filename:
                    break
                continue
            except OSError as e:
                self.notify(
                    escaped(f"screenshot not saved: {target}: {e.strerror or e}"),
                    title="Screenshot",
                    severity="error",
                    markup=False,
                )
                return None
            self.notify(escaped(f"saved to {target}"), title="Screenshot", markup=False, timeout=10)
            return str(target)
        self.notify(
            escaped(f"screenshot not saved: {target} exists"),
            title="Screenshot",
            severity="error",
            markup=False,
        )
        return None

    def action_help(self) -> None:
        overview = [
            b for b in self.BINDINGS if self.fabric is not None or not b.action.startswith("fabric")
        ]
        sections = [("Overview", overview), ("Port detail", PortScreen.BINDINGS)]
        if self.fabric is not None:
            sections.append(("Fabric", FabricScreen.BINDINGS))
        self.push_screen(HelpScreen(sections))

    def action_fabric(self, twin: str = "") -> None:
        """The fabric's switch ports and SMs, from the latest scan of the FabricWatch, which
        starts scanning (in its own thread) the first time the screen opens."""
        if self.fabric is None:
            return
        self.fabric.start()
        self.push_screen(FabricScreen(self.fabric, self.thresholds, self.feed.wall))

    def action_loopback(self) -> None:
        key = self._selected()
        if key is None:
            return
        if not self.feed.live or self.loopback_runner is None:
            why = "not a capture" if not self.feed.live else "and this dashboard has no verbs"
            self.notify(
                f"the loopback test needs this host's RDMA devices, {why}", severity="error"
            )
            return
        row = self.frame.row(key) if self.frame else None
        if self.frame is not None and row is None:
            self._gone(key)
            return
        if row is not None and row.port.state is not None and row.port.state.name != "ACTIVE":
            self.notify(
                f"{_shown(key)} is {row.port.state.name}: bring the link up and retry",
                severity="error",
                markup=False,
            )
            return
        self.push_screen(LoopbackScreen(key[0], key[1], self.loopback_runner))

    def action_doctor(self) -> None:
        """`ibtool doctor` on the selected port, on this host or the capture: any state (why
        a port is down is what it says)."""
        key = self._selected()
        if key is None:
            return
        if self.doctor_runner is None:
            self.notify("this dashboard has no doctor", severity="error")
            return
        if self.frame is not None and self.frame.row(key) is None:
            self._gone(key)
            return
        screen = DoctorScreen(key[0], key[1], self.doctor_runner, peer=self.doctor_peer)
        self.push_screen(screen, self._doctor_closed)

    def _gone(self, key) -> None:
        self.notify(f"{_shown(key)} is not there any more", severity="error", markup=False)

    def action_mesh(self) -> None:
        """The last mesh run from this node (read when the screen opens)."""
        from ibtool.mesh import last

        self.push_screen(MeshScreen(self.mesh_path or last.default_path()))

    def _doctor_closed(self, peer: str | None) -> None:
        if peer is not None:
            self.doctor_peer = peer


def screenshot_directory() -> Path:
    """Where the palette's Screenshot goes: the Downloads directory where there is one (a
    desktop's terminal, where Textual puts it), else the directory the dashboard was started
    in, else home, else the temporary directory. Textual tries Downloads alone, and a server
    has none: "Failed to save screenshot"."""
    import os
    import tempfile

    candidates = []
    try:
        from platformdirs import user_downloads_path

        candidates.append(user_downloads_path())
    except Exception:  # platformdirs comes with textual; without it, the other places
        pass
    candidates += [Path.cwd(), Path.home(), Path(tempfile.gettempdir())]
    for directory in candidates:
        if directory.is_dir() and os.access(directory, os.W_OK | os.X_OK):
            return directory
    return candidates[-1]


def _shown(key) -> str:
    """A port's name in a line of text: the device's name (any but '/') escaped."""
    return escaped(f"{key[0]}/{key[1]}")


def _failed(feed: Feed, error: str) -> Frame:
    return Frame(
        number=0,
        time=feed.wall(),
        interval=None,
        live=feed.live,
        source=feed.source,
        error=error,
        failed=True,
    )
