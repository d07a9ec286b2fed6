"""How the dashboard writes figures: throughput bars against the link rate, rates, sparklines
and health colours. Pure functions, shared by the widgets."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from ibtool.model.health import Status

EIGHTHS = " ▏▎▍▌▋▊▉█"
SPARKS = "▁▂▃▄▅▆▇█"
STATUS_STYLE = {
    Status.OK: "green",
    Status.WARNING: "bold yellow",
    Status.CRITICAL: "bold red",
    Status.UNKNOWN: "magenta",
}
STATUS_WORD = {
    Status.OK: "OK",
    Status.WARNING: "WARN",
    Status.CRITICAL: "CRIT",
    Status.UNKNOWN: "UNKN",
}


def bar(fraction: float, width: int) -> str:
    """A horizontal bar `width` cells wide, filled to `fraction` in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[part] if part else "")
    return text.ljust(width)


def si(value: float) -> str:
    """1234 -> '1.2k', 5.6e9 -> '5.6G': three significant figures at most."""
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}" if value else "0"


def throughput(
    bytes_per_s: float | None, packets_per_s: float | None, gbps: float | None, width: int = 5
) -> Text:
    """A port's throughput one way in 17 cells: a bar against the link rate and Gb/s where
    bytes are counted, packets per second where only packets are (rxe), '-' where nothing is.
    With `width` 0, in 11 cells: no bar, the figure in red above 90% of the link rate."""
    if bytes_per_s is not None:
        bits = bytes_per_s * 8
        fraction = bits / (gbps * 1e9) if gbps else 0.0
        figure = f"{bits / 1e9:5.1f} Gb/s"
        if not width:
            return Text(figure, style="bold red" if fraction > 0.9 else "")
        text = Text(bar(fraction, width), style="bold red" if fraction > 0.9 else "cyan")
        text.append(" " + figure)
        return text
    lead = " " * (width + 1) if width else ""
    if packets_per_s is not None:
        return Text(f"{lead}{si(packets_per_s):>5} pkt/s")
    return Text(f"{lead}    -", style="dim")


def spark(values: Iterable[float | None], width: int = 30) -> str:
    """The last `width` values as a sparkline scaled to their maximum; gaps are blank."""
    values = list(values)[-width:]
    known = [v for v in values if v is not None]
    top = max(known) if known else 0
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(SPARKS[0])
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))])
    return "".join(out).rjust(width)


def status(value: Status | None) -> Text:
    if value is None:
        return Text("-", style="dim")
    return Text(STATUS_WORD[value], style=STATUS_STYLE[value])
