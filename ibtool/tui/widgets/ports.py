"""The overview: every device/port in one table, updated in place."""

from __future__ import annotations

from rich.text import Text

from ibtool.feed import Frame, PortKey, PortRow
from ibtool.model import LinkLayer, PhysState, PortState
from ibtool.tui import format
from ibtool.tui.widgets.tables import KeyedTable

# What an operator reads first is leftmost: at 80 columns PORT to ERRORS fit, the rest scroll.
COLUMNS = (
    ("port", "PORT"),
    ("health", "HEALTH"),
    ("state", "STATE"),
    ("tx", "TX"),
    ("rx", "RX"),
    ("errors", "ERRORS"),
    ("rate", "RATE"),
    ("addr", "LID/NETDEV"),
    ("phys", "PHYS"),
)
WIDTH = {"tx": 17, "rx": 17, "errors": 8}  # TX, RX: format.throughput's 17 cells


def _name(key: PortKey) -> str:
    return f"{key[0]}/{key[1]}"


def _state(row: PortRow) -> Text:
    state = row.port.state
    if state is None:
        return Text("?", style="magenta")
    return Text(state.name, style="green" if state == PortState.ACTIVE else "bold red")


def _phys(row: PortRow) -> Text:
    phys = row.port.physical_state
    if phys is None:
        return Text("?", style="magenta")
    return Text(phys.label, style="" if phys == PhysState.LINK_UP else "bold red")


def _rate(row: PortRow) -> Text:
    rate = row.port.rate
    if rate is None:
        return Text("?", style="magenta")
    words = [f"{rate.gbps:g}G"]
    if rate.lanes:
        words.append(f"{rate.lanes}X")
    if rate.speed:
        words.append(rate.speed)
    text = Text(" ".join(words))
    if row.degraded:
        text.stylize("bold yellow")
        text.append(" !", style="bold yellow")
    return text


def _address(row: PortRow) -> str:
    p = row.port
    if p.link_layer == LinkLayer.INFINIBAND:
        return f"LID {p.lid}" if p.lid is not None else "LID ?"
    return p.netdev or "-"


def _errors(row: PortRow, live: bool) -> Text:
    if not live:
        return Text("-", style="dim")
    text = Text(str(row.errors), style="bold red" if row.new_errors else "")
    if row.new_errors:
        text.append(f" +{row.new_errors}", style="bold red")
    return text


def cells(row: PortRow, frame: Frame) -> tuple:
    gbps = row.port.rate.gbps if row.port.rate else None
    t = row.traffic
    return (
        _name(row.key),
        format.status(row.health),
        _state(row),
        format.throughput(t.tx_bytes, t.tx_packets, gbps),
        format.throughput(t.rx_bytes, t.rx_packets, gbps),
        _errors(row, frame.live),
        _rate(row),
        _address(row),
        _phys(row),
    )


def matches(row: PortRow, text: str) -> bool:
    """The `/` filter: a port whose name, netdev, state or health contains the text."""
    if not text:
        return True
    p = row.port
    words = [_name(row.key), p.netdev or "", p.state.name if p.state else ""]
    words.append(format.STATUS_WORD.get(row.health, "") if row.health else "")
    return any(text.lower() in w.lower() for w in words)


class PortTable(KeyedTable):
    """One row per port; a new frame changes only the cells that changed."""

    layout_columns = COLUMNS
    fixed = WIDTH

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.filter = ""
        self._restore: PortKey | None = None

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key, width=WIDTH.get(key))

    def show(self, frame: Frame) -> None:
        rows = [r for r in frame.rows if matches(r, self.filter)]
        wanted = {_name(r.key): cells(r, frame) for r in rows}
        for gone in [k for k in self.shown if k not in wanted]:
            self.remove_row(gone)
            del self.shown[gone]
        order = list(wanted)
        kept = order[: len(self.shown)]
        if kept != list(self.shown):  # a port inserted before others, or the order changed
            selected = self.selected
            self.clear()
            self.shown = {}
            self._restore = selected
        self.sync(wanted)
        restore, self._restore = self._restore, None
        if restore is not None and _name(restore) in self.shown:
            self.move_cursor(row=list(self.shown).index(_name(restore)))

    @property
    def selected(self) -> PortKey | None:
        """The port under the cursor, if any."""
        if not self.shown or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        key = self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
        device, _, port = key.rpartition("/")
        return device, int(port)
