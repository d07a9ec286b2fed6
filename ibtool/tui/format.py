"""How the dashboard writes figures and names: throughput bars against the link rate, rates,
sparklines and health colours; names as plain text. Pure functions, shared by the widgets."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from ibtool.model.health import Status
from ibtool.model.names import escaped

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


def plain(value: str, style: str = "", **kwargs) -> Text:
    """A name, or a line naming things, as the dashboard shows it: each control, format or
    separator character written as its escape (\\x1b, \\n, \\u202e), and as text, never read
    as markup. A device may be renamed to anything but '/', and a capture or a peer says what
    it likes: an ESC would reach the terminal, a newline start a line of its own, and a str
    given to a Static or a toast is markup ("[@click=app.quit]" a button, "[/]" a crash)."""
    return Text(escaped(value), style=style, **kwargs)


def cell(value):
    """A table cell as shown. DataTable reads a str as Rich markup: one that holds a control
    character or a '[' becomes plain Text, escaped; any other stays the str it was (what is
    shown and what a test reads are unchanged). A Text holding a control character is
    escaped, its styles kept."""
    if isinstance(value, str):
        if value.isprintable() and "[" not in value:
            return value
        # as DataTable makes a str of a one-line row: no wrapping, no newline after
        return Text(escaped(value), no_wrap=True, end="")
    if isinstance(value, Text) and not value.plain.isprintable():
        return escaped_text(value)
    return value


def escaped_text(text: Text) -> Text:
    """`text` with its control, format and separator characters escaped, each piece keeping
    the styles it had."""
    plain = text.plain
    if plain.isprintable():
        return text
    out = text.blank_copy()
    spans = [s for s in text.spans if s.start < s.end]
    cuts = sorted({0, len(plain), *(min(len(plain), p) for s in spans for p in (s.start, s.end))})
    for start, end in zip(cuts, cuts[1:]):
        at = len(out)
        out.append(escaped(plain[start:end]))
        for s in spans:
            if s.start <= start and end <= s.end:
                out.stylize(s.style, at, len(out))
    return out
