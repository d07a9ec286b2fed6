"""`f`: the InfiniBand fabric, from the latest scan of the dashboard's FabricWatch
(ibtool.live.fabric), which scans in a thread of its own on its own interval: the screens only
read its `latest`, once a second, and never scan. The switches' ports, worst first, under a
head naming the subnet managers and the scan's age; Enter on a port shows every PMA counter
of it with its rate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ibtool.model import counters as counterinfo
from ibtool.model.fabric import (
    CONGESTION,
    ERROR_COUNTERS,
    ERROR_FIXES,
    SYSFS_NAMES,
    NodeType,
    SmState,
    end_name,
    judge_sms,
    over,
)
from ibtool.model.fabric.cables import SM_IDLE
from ibtool.model.health import Status
from ibtool.model.names import escaped
from ibtool.tui import format
from ibtool.tui.widgets.fabric import (
    WORD,
    FabricRow,
    FabricTable,
    fabric_rows,
    parse_key,
    state_cell,
)
from ibtool.tui.widgets.tables import WholeTable

REFRESH = 1.0  # seconds between two looks at the watch's latest scan (the age shown moves)
DATA = ("PortXmitData", "PortRcvData")  # in 4-octet words: shown in bytes


def _clock(wall: float) -> str:
    return datetime.fromtimestamp(wall).astimezone().strftime("%H:%M:%S")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def sm_activity(baseline, seen) -> tuple[int | None, float, tuple | None]:
    """How far the master's activity count moved since `baseline` (its GUID, count and the
    scan time it last moved at), in how long, and the baseline to keep: as the health
    check's sm_idle judges it, a count that stood still is said (0) only after SM_IDLE
    seconds (opensm moves it at each sweep, every 10 s by default); None where it is not
    known (a first scan, no master or two, a new one)."""
    if seen.sms is None:
        return None, 0.0, baseline
    masters = [s for s in seen.sms.sms if s.state == SmState.MASTER]
    if len(masters) != 1:
        return None, 0.0, None
    m = masters[0]
    if baseline is None or baseline[0] != m.guid:
        return None, 0.0, (m.guid, m.activity, seen.time)
    moved = (m.activity - baseline[1]) % (1 << 32)  # SMInfo.ActCount, 32 bits
    waited = seen.time - baseline[2]
    if moved:
        return moved, waited, (m.guid, m.activity, seen.time)
    return (0 if waited >= SM_IDLE else None), waited, baseline


def sm_text(seen, activity: tuple[int | None, float] = (None, 0.0)) -> Text:
    """The subnet managers on one line: the master (its LID and node), the standbys, and what
    is wrong with them (judge_sms), the worst first."""
    text = Text(" SM ", style="bold")
    scan = seen.sms
    if scan is None:
        return text.append("not read (the scan's notes say why)", style="magenta")
    masters = [s for s in scan.sms if s.state == SmState.MASTER]
    standbys = [s for s in scan.sms if s.state == SmState.STANDBY]
    for s in masters:
        text.append(f"master LID {s.lid} on ")
        text.append(escaped(s.node.description), style="bold")
        text.append(f"/{s.port}, priority {s.priority} · ")
    if standbys:
        names = ", ".join(f"LID {s.lid} on {escaped(s.node.description)}" for s in standbys)
        text.append(f"standby {names} · ")
    else:
        text.append("no standby · ", style="dim")
    moved, waited = activity
    findings = judge_sms(scan.sms, scan.silent, scan.local_sm_lid, moved, waited)
    if not findings:
        return text.append("OK", style="green")
    findings.sort(key=lambda f: f.status != Status.CRITICAL)
    text.append(
        format.STATUS_WORD[findings[0].status], style=format.STATUS_STYLE[findings[0].status]
    )
    text.append(" " + escaped(findings[0].what))
    if len(findings) > 1:
        text.append(f" (+{len(findings) - 1} more)")
    return text


def head_text(
    seen,
    activity: tuple[int | None, float],
    rows: list[FabricRow],
    now: float,
    live: bool,
    interval: float,
    paused: bool,
    width: int = 0,
) -> Text:
    """Two lines (three with notes): the subnet, the ports to look at and the scan's age
    (the subnet's counts left out where the line would be wider than `width`), then the
    SMs."""
    if seen is None:
        return Text(" fabric · scanning the subnet…", style="bold")
    if seen.error or seen.fabric is None:
        text = Text(" fabric · ", style="bold")
        return text.append(escaped(seen.error or "no fabric"), style="bold red")
    fabric = seen.fabric
    switches = len(fabric.by_type(NodeType.SWITCH))
    cas = len(fabric.by_type(NodeType.CA))
    counts = (
        f"{switches} switch{'es' * (switches != 1)}, {cas} CA{'s' * (cas != 1)}, "
        f"{len(fabric.links())} links · "
    )
    for shown in (counts, ""):
        text = Text(" fabric ", style="bold")
        text.append(f"via {escaped(f'{fabric.ca}/{fabric.ca_port}')} · {shown}")
        bad = sum(r.status != Status.OK for r in rows)
        if bad:
            text.append(f"{bad} port{'s' * (bad != 1)} to look at", style="bold yellow")
        else:
            text.append("every port OK", style="green")
        text.append(" · ")
        if not live:
            text.append("saved in the snapshot", style="yellow")
        elif paused:
            text.append("PAUSED", style="bold reverse yellow")
            text.append(f" at the scan of {_clock(seen.time)}")
        else:
            text.append(f"scanned {_ago(now - seen.time)}, every {interval:g} s", style="dim")
        if not width or text.cell_len <= width:
            break
    text.append("\n")
    text.append_text(sm_text(seen, activity))
    if seen.notes:
        more = f" (+{len(seen.notes) - 1} more)" if len(seen.notes) > 1 else ""
        text.append(f"\n {escaped(seen.notes[0])}{more}", style="yellow")
    return text


def why_text(row: FabricRow | None, fixes: bool = True) -> Text:
    """What is wrong with a port's link and counters (either end's), each with its fix."""
    if row is None:
        return Text("")
    text = Text()
    said = []
    for f in row.findings:
        said.append((f.status, f.what, f.fix))
    for where, counters in ((row.name, row.over), (_far(row), row.far_over)):
        for name, value, limit, saturated in counters:
            what = "saturated" if saturated else f"threshold {limit:,}"
            said.append((Status.WARNING, f"{where} {name} {value:,} ({what})", ERROR_FIXES[name]))
    for status, what, fix in said:
        text.append(f"{format.STATUS_WORD[status]} ", style=format.STATUS_STYLE[status])
        text.append(escaped(what) + "\n")
        if fixes:
            text.append("  fix: ", style="cyan")
            text.append(escaped(fix) + "\n")
    if not said:
        text.append(f"{escaped(row.name)}: nothing wrong; Enter shows its counters", style="dim")
    return text.rstrip() or text


def _far(row: FabricRow) -> str:
    return end_name(row.far) if row.far is not None else "-"


class FabricScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", key_display="Esc"),
        Binding("enter", "open", "Port counters", key_display="Enter"),
    ]

    def __init__(
        self,
        watch,
        thresholds: Mapping[str, int],
        wall: Callable[[], float],
    ) -> None:
        super().__init__()
        self.watch = watch
        self.thresholds = dict(thresholds)
        self.wall = wall
        self.seen = None  # the scan shown
        self.failed = None  # a scan after it that found no fabric (its error said above)
        self.sm_baseline = None  # the master's GUID, activity count and when it last moved
        self.activity: tuple[int | None, float] = (None, 0.0)
        self.rows: list[FabricRow] = []

    def compose(self) -> ComposeResult:
        yield Static(id="fabric-head")
        yield FabricTable(id="fabric-ports")
        yield Static(id="fabric-why")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(FabricTable).focus()
        self.refresh_scan()
        self.set_interval(REFRESH, self.refresh_scan)

    def refresh_scan(self) -> None:
        """The watch's latest scan, shown if it is new (and the dashboard not paused); the
        head's age in any case."""
        latest = self.watch.latest
        fresh = latest is not None and latest is not self.seen and latest is not self.failed
        if fresh and not self.app.paused and latest.fabric is None and self.seen is not None:
            # a scan that failed after one that did not: its table stays, the head says why
            self.failed = latest
        elif fresh and not self.app.paused:
            self.seen, self.failed = latest, None
            moved, waited, self.sm_baseline = sm_activity(self.sm_baseline, latest)
            self.activity = (moved, waited)
            self.rows = fabric_rows(latest, self.thresholds)
            self.query_one(FabricTable).show(self.rows)
            self._why()
        head = head_text(
            self.seen,
            self.activity,
            self.rows,
            self.wall(),
            self.watch.live,
            self.watch.interval,
            self.app.paused,
            self.size.width,
        )
        if self.failed is not None:
            head.append(f"\n the scan of {_clock(self.failed.time)} failed: ", style="bold red")
            head.append(escaped(self.failed.error or "no fabric"), style="red")
        self.query_one("#fabric-head", Static).update(head)

    def _why(self) -> None:
        self.query_one("#fabric-why", Static).update(
            why_text(self.query_one(FabricTable).highlighted())
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, FabricTable):
            self._why()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, FabricTable):
            event.stop()
            self.action_open()

    def action_open(self) -> None:
        key = self.query_one(FabricTable).selected
        if key is None or self.seen is None:
            return
        self.app.push_screen(FabricPortScreen(key, self.watch, self.seen, self.thresholds))


# -- a port's counters ------------------------------------------------------------------------


def port_facts(seen, key: str, thresholds: Mapping[str, int]) -> Text:
    """The port's name, state, width and speed, its LID and its cable's far end, and what is
    wrong (as the fabric screen's note says it)."""
    guid, number = parse_key(key)
    node = seen.fabric.nodes.get(guid) if seen.fabric is not None else None
    port = node.ports.get(number) if node is not None else None
    name = f"{node.description}/{number}" if node is not None else key
    if port is None:
        return Text(f" {escaped(name)}: not in this scan", style="bold red")
    row = next((r for r in fabric_rows(seen, thresholds) if r.key == key), None)
    text = Text(f" {escaped(name)} ", style="bold")
    text.append_text(state_cell(row) if row is not None else Text("?"))
    phys = port.phys_state.label if port.phys_state is not None else "?"
    speed = port.speed.active_name()
    text.append(f"  {phys}  {port.width or '-'} {speed or '-'}  LID {port.lid or node.lid}")
    far = seen.fabric.far_end(guid, number)
    if far is not None:
        text.append(f"  to {escaped(f'{far[0].description}/{far[1].number}')}")
        text.append(f" (LID {far[1].lid or far[0].lid})")
    if row is not None and row.status != Status.OK:
        text.append("\n")
        text.append_text(why_text(row, fixes=False))
    return text


def counter_rows(seen, key: str, thresholds: Mapping[str, int]) -> list[tuple[str, tuple]]:
    """(name, cells) of every PMA counter the port answered: its name, value and rate, the
    error counters in red (their value bold where over its threshold, as the fabric screen
    counts it), the data counters in bytes."""
    pc = seen.counters.get(parse_key(key))
    if pc is None:
        return []
    rates = seen.rates.get(parse_key(key), {})
    bad = {name for name, *_ in over(pc.values, pc.bits, dict(thresholds))}
    rows = []
    for name, value in pc.values.items():
        scale = WORD if name in DATA else 1
        error = name in ERROR_COUNTERS and name != CONGESTION
        shown = Text(f"{value * scale:,}", style="bold red" if name in bad else "")
        if pc.saturated(name):
            shown.append(" SAT", style="bold yellow")
        rate = rates.get(name)
        if rate is None:
            rate_cell = Text("-", style="dim")
        else:
            rate *= scale
            figure = f"{rate:,.1f}" if rate < 10_000 else format.si(rate)
            rate_cell = Text(figure, style="bold red" if error and rate else "")
        label = f"{name} (bytes)" if scale != 1 else name
        rows.append((name, (Text(label, style="red" if error else ""), shown, rate_cell)))
    return rows


def counter_explained(name: str) -> str:
    """What a PMA counter counts, on one line, as the local port detail explains its own."""
    sysfs = SYSFS_NAMES.get(name)
    info = counterinfo.info(sysfs, "pma") if sysfs is not None else None
    if info is None:
        return f"{name}: no explanation known for this counter"
    text = f"{name} (PMA PortCounters, sysfs {sysfs}, {info.kind}): {info.description}."
    if name in DATA:
        text += " Shown in bytes: the PMA counts 4-octet words."
    if name in ERROR_FIXES:
        text += f" Fix: {ERROR_FIXES[name]}."
    elif info.causes:
        text += f" Usually raised by: {info.causes}."
    return text


class CounterList(WholeTable):
    headers = ("COUNTER", "VALUE", "RATE/s")

    def __init__(self, **kwargs) -> None:
        super().__init__(zebra_stripes=True, **kwargs)


class FabricPortScreen(Screen):
    """One port of the fabric: every PMA counter with its rate, from the watch's latest scan
    (looked at once a second, as the fabric screen does)."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back", key_display="Esc")]

    def __init__(self, key: str, watch, seen, thresholds: Mapping[str, int]) -> None:
        super().__init__()
        self.key = key
        self.watch = watch
        self.seen = seen
        self.thresholds = dict(thresholds)
        self.names: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static(id="fabric-facts")
        yield CounterList(id="fabric-counters")
        yield Static(id="fabric-explain")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(CounterList).focus()
        self.show_scan(self.seen)
        self.set_interval(REFRESH, self._look)

    def _look(self) -> None:
        latest = self.watch.latest
        if latest is not None and latest is not self.seen and not self.app.paused:
            self.show_scan(latest)

    def show_scan(self, seen) -> None:
        self.seen = seen
        self.query_one("#fabric-facts", Static).update(port_facts(seen, self.key, self.thresholds))
        rows = counter_rows(seen, self.key, self.thresholds)
        self.names = [name for name, _ in rows]
        self.query_one(CounterList).show_rows([cells for _, cells in rows])
        if not rows:
            self.query_one("#fabric-explain", Static).update(
                Text("its PMA did not answer this scan: no counters", style="yellow")
            )
        else:
            self._explain()

    def _explain(self) -> None:
        row = self.query_one(CounterList).cursor_row
        if 0 <= row < len(self.names):
            said = counter_explained(self.names[row])
            self.query_one("#fabric-explain", Static).update(Text(said))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, CounterList):
            self._explain()
