"""A port's counters: value, rate and a sparkline of the rates, errors highlighted."""

from __future__ import annotations

from rich.text import Text

from ibtool.live.feed import HISTORY, Frame, PortKey, counter_key
from ibtool.model import counters as counterinfo
from ibtool.model.names import escaped
from ibtool.model.rates import Rated, is_saturated
from ibtool.tui import format
from ibtool.tui.widgets.tables import KeyedTable

COLUMNS = (
    ("name", "COUNTER"),
    ("value", "VALUE"),
    ("rate", "RATE/s"),
    ("history", "RATES"),
    ("source", "SRC"),
)


def spark_width(screen_width: int) -> int:
    """All HISTORY rates at 160 columns; at 80 as many as fit beside the other columns."""
    return max(10, min(HISTORY, screen_width - 74))


def explain(name: str, source: str) -> str:
    """What `ibtool counters --explain NAME` says, on one line, the name escaped (a counter
    is a file of the driver's, or of a capture's, named as it likes)."""
    info = counterinfo.info(name, source)
    if info is None:
        return f"{escaped(name)}: no explanation known for this counter"
    where = "InfiniBand PMA PortCounters" if source == "pma" else "driver hw_counters"
    text = f"{escaped(name)} ({where}, {info.kind}): {info.description}."
    if info.causes:
        text += f" Usually raised by: {info.causes}."
    return text


def _value(r: Rated) -> Text:
    s = r.sample
    if s.value is None:
        return Text("unreadable", style="magenta")
    value = s.value * s.scale
    error = counterinfo.is_error(s.name, s.source)
    style = "bold red" if error and value else ""
    text = Text(f"{value:,}", style=style)
    if is_saturated(s):
        text.append(" SAT", style="bold yellow")
    return text


def _rate(r: Rated) -> Text:
    if r.note in ("reset", "saturated", "unknown"):
        return Text(r.note, style="yellow")
    if r.rate is None:
        return Text("-", style="dim")
    error = counterinfo.is_error(r.sample.name, r.sample.source)
    # Exact below 10^4 per second (error counts), three figures above (data: 913M bytes/s).
    shown = f"{r.rate:,.1f}" if r.rate < 10_000 else format.si(r.rate)
    return Text(shown, style="bold red" if error and r.rate else "")


def cells(r: Rated, frame: Frame, width: int = 60) -> tuple:
    s = r.sample
    error = counterinfo.is_error(s.name, s.source)
    history = frame.history.get(counter_key(s), ())
    return (
        format.plain(s.name, style="red" if error else ""),
        _value(r),
        _rate(r),
        Text(format.spark(history, width), style="red" if error else "cyan"),
        s.source,
    )


class CounterTable(KeyedTable):
    layout_columns = COLUMNS

    def __init__(self, port: PortKey, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.port = port
        self.rated: dict[str, Rated] = {}

    def on_mount(self) -> None:
        self.spark = spark_width(self.app.size.width)
        for key, label in COLUMNS:
            if key == "history":
                label = f"LAST {self.spark} RATES"
            self.add_column(label, key=key)

    def show(self, frame: Frame) -> None:
        rated = frame.counters.get(self.port, ())
        wanted = {f"{r.sample.source}:{r.sample.name}": r for r in rated}
        if list(wanted) != list(self.shown):
            self.clear()
            self.shown = {}
        self.rated = wanted
        self.sync({key: cells(r, frame, self.spark) for key, r in wanted.items()})

    def highlighted(self) -> Rated | None:
        if not self.shown or not 0 <= self.cursor_row < self.row_count:
            return None
        key = self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
        return self.rated.get(key)
