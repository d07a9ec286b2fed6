"""The overview: every device/port in one table, updated in place."""

from __future__ import annotations

from rich.text import Text

from ibtool.live.feed import Frame, PortKey, PortRow
from ibtool.model.names import escaped
from ibtool.model.records import LinkLayer, PhysState, PortState
from ibtool.tui import format
from ibtool.tui.widgets.tables import KeyedTable

# What an operator reads first is leftmost; PORT stays put when the table scrolls sideways.
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
# Below this many columns the wide layout (about 110 cells) does not fit, and the table is
# narrow: TX and RX without their bars (the figure turns red above 90% of the link), RATE
# without the speed's name (EDR, HDR: Gb/s and lanes say it), and no PHYS, which is LINK_UP
# beside ACTIVE and is named, with what it means, in the finding under the table otherwise.
# So every other column fits 80 columns.
NARROW_BELOW = 110
NARROW_WIDTH = {"tx": 11, "rx": 11, "errors": 8}


def _name(key: PortKey) -> str:
    return f"{key[0]}/{key[1]}"


def state_cell(row: PortRow) -> Text:
    state = row.port.state
    if state is None:
        return Text("?", style="magenta")
    return Text(state.name, style="green" if state == PortState.ACTIVE else "bold red")


def physical_state_cell(row: PortRow) -> Text:
    phys = row.port.physical_state
    if phys is None:
        return Text("?", style="magenta")
    return Text(phys.label, style="" if phys == PhysState.LINK_UP else "bold red")


def rate_cell(row: PortRow, narrow: bool = False) -> Text:
    rate = row.port.rate
    if rate is None:
        return Text("?", style="magenta")
    words = [f"{rate.gbps:g}G"]
    if rate.lanes:
        words.append(f"{rate.lanes}X")
    if rate.speed and not narrow:
        words.append(rate.speed)
    text = Text(" ".join(words))
    if row.degraded:
        text.stylize("bold yellow")
        text.append(" !", style="bold yellow")
    return text


def address_cell(row: PortRow) -> str:
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


def address_label(frame: Frame) -> str:
    """LID where every port is InfiniBand, NETDEV where none is: a shorter header than both."""
    ib = {r.port.link_layer == LinkLayer.INFINIBAND for r in frame.rows}
    if ib == {True}:
        return "LID"
    if ib == {False}:
        return "NETDEV"
    return "LID/NETDEV"


def cells(row: PortRow, frame: Frame, narrow: bool = False) -> tuple:
    gbps = row.port.rate.gbps if row.port.rate else None
    t = row.traffic
    bar = 0 if narrow else 5
    values = (
        _name(row.key),
        format.status(row.health),
        state_cell(row),
        format.throughput(t.tx_bytes, t.tx_packets, gbps, bar),
        format.throughput(t.rx_bytes, t.rx_packets, gbps, bar),
        _errors(row, frame.live),
        rate_cell(row, narrow),
        address_cell(row),
    )
    return values if narrow else (*values, physical_state_cell(row))


def matches(row: PortRow, text: str) -> bool:
    """The `/` filter: a port whose name, netdev, state or health contains the text."""
    if not text:
        return True
    p = row.port
    words = [_name(row.key), p.netdev or "", p.state.name if p.state else ""]
    words.append(format.STATUS_WORD.get(row.health, "") if row.health else "")
    # a name with a control character is shown escaped: what is typed may be what is seen
    words += [escaped(w) for w in words[:2] if not w.isprintable()]
    return any(text.lower() in w.lower() for w in words)


class PortTable(KeyedTable):
    """One row per port; a new frame changes only the cells that changed."""

    layout_columns = COLUMNS
    fixed = WIDTH

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, fixed_columns=1, **kwargs)
        self.filter = ""
        self._restore: PortKey | None = None
        self.narrow = False
        self._address = "LID/NETDEV"
        self._frame: Frame | None = None

    def on_mount(self) -> None:
        self._lay_out(self.app.size.width < NARROW_BELOW, self._address)

    def _lay_out(self, narrow: bool, address: str) -> None:
        """The columns for this width and these ports, the rows added again under them."""
        selected = self.selected
        self.narrow, self._address = narrow, address
        widths = NARROW_WIDTH if narrow else WIDTH
        self.layout_columns = [
            (key, address if key == "addr" else label)
            for key, label in COLUMNS
            if not (narrow and key == "phys")
        ]
        self.fixed = widths
        self.clear(columns=True)
        self.shown = {}
        for key, label in self.layout_columns:
            self.add_column(label, key=key, width=widths.get(key))
        self._restore = selected

    def on_resize(self) -> None:
        if (self.app.size.width < NARROW_BELOW) != self.narrow:
            if self._frame is None:
                self._lay_out(not self.narrow, self._address)
            else:
                self.show(self._frame)

    def show(self, frame: Frame) -> None:
        self._frame = frame
        narrow = self.app.size.width < NARROW_BELOW
        address = address_label(frame) if frame.rows else self._address
        if (narrow, address) != (self.narrow, self._address):
            self._lay_out(narrow, address)
        rows = [r for r in frame.rows if matches(r, self.filter)]
        wanted = {_name(r.key): cells(r, frame, self.narrow) for r in rows}
        for gone in [k for k in self.shown if k not in wanted]:
            self.remove_row(gone)
            del self.shown[gone]
        order = list(wanted)
        kept = order[: len(self.shown)]
        if kept != list(self.shown):  # a port inserted before others, or the order changed
            selected = self.selected
            self.clear()
            self.shown = {}
            self._restore = selected or self._restore
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
