"""The fabric screen's table: every switch port with a cable (or with errors), the ports whose
link is degraded or whose error counters are over their thresholds first; and the pure
functions that make its rows from a scan (ibtool.live.fabric's FabricSeen)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text

from ibtool.model.deferred import dataclass
from ibtool.model.fabric import (
    FabricNode,
    FabricPort,
    Link,
    LinkEnd,
    LinkFinding,
    NodeType,
    PortCounters,
    end_name,
    gbps,
    over,
)
from ibtool.model.health import Status
from ibtool.model.records import PortState
from ibtool.tui import format
from ibtool.tui.widgets.tables import KeyedTable
from ibtool.views.fabric import links_checked

Over = tuple[str, int, int, bool]  # counter, value, threshold, saturated (model.fabric.over)
# PortXmitData and PortRcvData count 4-octet words (IBTA vol. 1, 16.1.3.5)
WORD = 4


@dataclass(frozen=True)
class FabricRow:
    """One port of the fabric as the screen shows it: its cable's far end, its counters and
    their rates (per second, against the scan before), what is wrong with its link and which
    error counters of either end are over their thresholds."""

    key: str  # "0x…/PORT": the node's GUID and the port's number
    node: FabricNode
    port: FabricPort
    far: LinkEnd | None
    counters: PortCounters | None
    rates: Mapping[str, float]
    findings: tuple[LinkFinding, ...] = ()
    over: tuple[Over, ...] = ()
    far_over: tuple[Over, ...] = ()

    @property
    def name(self) -> str:
        """`leaf01/7`, as `ibtool fabric` names a port."""
        return f"{self.node.description}/{self.port.number}"

    @property
    def status(self) -> Status:
        """CRITICAL for a degraded link, WARNING for one below what its ends or its tier
        could do, not ACTIVE, or with an error counter over its threshold at either end."""
        statuses = [f.status for f in self.findings]
        if self.over or self.far_over:
            statuses.append(Status.WARNING)
        if self.far is not None and self.port.state != PortState.ACTIVE:
            statuses.append(Status.WARNING)
        return Status.worst(statuses) if statuses else Status.OK

    @property
    def gbps(self) -> float:
        return gbps(self.port.width, self.port.speed.active_name())


def row_key(guid: int, port: int) -> str:
    return f"{guid:#x}/{port}"


def parse_key(key: str) -> tuple[int, int]:
    guid, _, port = key.partition("/")
    return int(guid, 16), int(port)


def fabric_rows(seen, thresholds: Mapping[str, int]) -> list[FabricRow]:
    """The rows of a scan: each switch's external ports that have a cable or an error
    counter over its threshold (and, with no switch between them, the channel adapters'
    cables), worst first, then by switch and port."""
    fabric = seen.fabric
    if fabric is None:
        return []
    thresholds = dict(thresholds)
    links, _, findings = links_checked(fabric)
    by_end: dict[tuple[int, int], list[LinkFinding]] = {}
    for f in findings:
        for e in (f.link.a, f.link.b):
            by_end.setdefault((e.node.guid, e.port.number), []).append(f)
    shown = _ends(fabric, links)

    def overs(guid: int, port: int) -> tuple[Over, ...]:
        pc = seen.counters.get((guid, port))
        return tuple(over(pc.values, pc.bits, thresholds)) if pc is not None else ()

    rows = []
    for node, port in shown:
        far = fabric.far_end(node.guid, port.number)
        far_end = LinkEnd(*far) if far is not None else None
        mine = overs(node.guid, port.number)
        if far_end is None and not mine:
            continue
        key = (node.guid, port.number)
        rows.append(FabricRow(
            row_key(*key), node, port, far_end, seen.counters.get(key), seen.rates.get(key, {}),
            tuple(by_end.get(key, ())), mine,
            overs(far_end.node.guid, far_end.port.number) if far_end is not None else (),
        ))  # fmt: skip
    order = {Status.CRITICAL: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.OK: 3}
    rows.sort(key=lambda r: (order[r.status], r.node.description, r.node.guid, r.port.number))
    return rows


def _ends(fabric, links: list[Link]) -> list[tuple[FabricNode, FabricPort]]:
    """Every switch's external ports; and the ends of cables between two nodes that are not
    switches (which no switch port shows)."""
    found = []
    for node in fabric.nodes.values():
        if node.type == NodeType.SWITCH:
            found += [(node, p) for n, p in sorted(node.ports.items()) if n > 0]
    for lk in links:
        if NodeType.SWITCH not in (lk.a.node.type, lk.b.node.type):
            found.append((lk.a.node, lk.a.port))
    return found


# -- cells --------------------------------------------------------------------------------------

WIDE = (
    ("switch", "SWITCH"),
    ("port", "PORT"),
    ("check", "CHECK"),
    ("state", "STATE"),
    ("width", "WIDTH"),
    ("speed", "SPEED"),
    ("far", "FAR END"),
    ("errors", "ERRORS OVER THRESHOLD"),
    ("tx", "TX"),
    ("rx", "RX"),
)
# Narrower than this the wide columns do not fit: the switch and port in one (`leaf01/7`), no
# CHECK (the port's name is coloured by it), width and speed in one, both rates in one column
# (Gb/s); the errors column is cut, the note under the table names them all. So the table fits
# 80 columns with its scrollbar, where the far ends' names are 16 characters or fewer.
NARROW_BELOW = 130
NARROW = (
    ("port", "PORT"),
    ("state", "STATE"),
    ("link", "LINK"),
    ("far", "FAR END"),
    ("errors", "ERRORS"),
    ("rates", "TX/RX Gb/s"),
)
WIDTH = {"tx": 17, "rx": 17}  # format.throughput's 17 cells
NARROW_WIDTH = {"errors": 16, "rates": 10}


def state_cell(row: FabricRow) -> Text:
    state = row.port.state
    if state is None:
        return Text("?", style="magenta")
    return Text(state.name, style="green" if state == PortState.ACTIVE else "bold red")


def _port_style(row: FabricRow) -> str:
    """A port to look at in its status's colour: the narrow table has no CHECK column."""
    return format.STATUS_STYLE[row.status] if row.status != Status.OK else ""


def _link_style(row: FabricRow) -> str:
    worst = Status.worst(f.status for f in row.findings) if row.findings else None
    return format.STATUS_STYLE[worst] if worst is not None else ""


def errors_cell(row: FabricRow, width: int = 0) -> Text:
    """This port's error counters over their thresholds: the first one's value and name, and
    how many more (`57 SymbolErrorCounter +1 more`); else its far end's, as `far …`; '-'
    where none is. Cut to `width` in the name: the value and how many more are kept."""
    said, style, far = row.over, "bold red", ""
    if not said and row.far_over:
        said, style, far = row.far_over, "yellow", "far "
    if not said:
        return Text("-", style="dim")
    name, value, _, saturated = said[0]
    head = f"{far}{value:,}{' SAT' if saturated else ''} "
    more = f" +{len(said) - 1} more" if len(said) > 1 else ""
    if width and len(head) + len(name) + len(more) > width:
        room = max(width - len(head) - len(more), 2)
        name = name[: room - 1] + "…"
    shown = Text(f"{head}{name}{more}", style=style, no_wrap=True, overflow="ellipsis")
    if width and shown.cell_len > width:
        shown.truncate(width, overflow="ellipsis")
    return shown


def _bytes(row: FabricRow, name: str) -> float | None:
    rate = row.rates.get(name)
    return rate * WORD if rate is not None else None


def _gbps(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s * 8 / 1e9:.1f}"


def rates_cell(row: FabricRow) -> Text:
    """`6.0/2.0`: Gb/s out and in, dim where nothing moved (or no rate is known yet)."""
    tx, rx = _bytes(row, "PortXmitData"), _bytes(row, "PortRcvData")
    idle = not (tx or rx)
    return Text(f"{_gbps(tx)}/{_gbps(rx)}", style="dim" if idle else "", justify="right")


def far_cell(row: FabricRow) -> str:
    return end_name(row.far) if row.far is not None else "-"


def cells(row: FabricRow, narrow: bool) -> tuple:
    speed = row.port.speed.active_name()
    if narrow:
        link = " ".join(w for w in (row.port.width, speed) if w) or "-"
        return (
            format.plain(row.name, style=_port_style(row)),
            state_cell(row),
            Text(link, style=_link_style(row)),
            far_cell(row),
            errors_cell(row, NARROW_WIDTH["errors"]),
            rates_cell(row),
        )
    rate = row.gbps or None
    return (
        format.plain(row.node.description),
        str(row.port.number),
        format.status(row.status),
        state_cell(row),
        Text(row.port.width or "-", style=_link_style(row)),
        Text(speed or "-", style=_link_style(row)),
        far_cell(row),
        errors_cell(row),
        format.throughput(
            _bytes(row, "PortXmitData"), row.rates.get("PortXmitPkts"), rate, width=5
        ),
        format.throughput(_bytes(row, "PortRcvData"), row.rates.get("PortRcvPkts"), rate, width=5),
    )


class FabricTable(KeyedTable):
    """One row per port; a new scan changes the cells that changed, or lays the rows out
    again where their order did (a port that went bad moves to the top)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, fixed_columns=1, **kwargs)
        self.narrow: bool | None = None
        self.by_key: dict[str, FabricRow] = {}

    def on_mount(self) -> None:
        self._lay_out(self.app.size.width < NARROW_BELOW)

    def _lay_out(self, narrow: bool) -> None:
        self.narrow = narrow
        self.layout_columns = NARROW if narrow else WIDE
        self.fixed = NARROW_WIDTH if narrow else WIDTH
        self.clear(columns=True)
        self.shown = {}
        for key, label in self.layout_columns:
            self.add_column(label, key=key, width=self.fixed.get(key))

    def show(self, rows: list[FabricRow]) -> None:
        narrow = self.app.size.width < NARROW_BELOW
        selected = self.selected
        if narrow != self.narrow:
            self._lay_out(narrow)
        self.by_key = {r.key: r for r in rows}
        wanted = {r.key: cells(r, self.narrow) for r in rows}
        if list(wanted) != list(self.shown):
            self.clear()
            self.shown = {}
        self.sync(wanted)
        if selected in self.shown:
            self.move_cursor(row=list(self.shown).index(selected))

    def on_resize(self) -> None:
        if (self.app.size.width < NARROW_BELOW) != self.narrow:
            self.show(list(self.by_key.values()))

    @property
    def selected(self) -> str | None:
        """The key of the port under the cursor, if any."""
        if not self.shown or not 0 <= self.cursor_row < self.row_count:
            return None
        return self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value

    def highlighted(self) -> FabricRow | None:
        key = self.selected
        return self.by_key.get(key) if key is not None else None
