"""`m`: the last `ibtool mesh` run from this node (ibtool.mesh.last): when, how long, through
which engine, over how many endpoints; the verdicts with the commands to run next; the heat
map folded to the screen's width, coloured as the terminal's (ibtool.views.mesh). The file is
read as untrusted: a missing one says no mesh ran here yet, a malformed one its one-line error.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ibtool.errors import IbtoolError
from ibtool.mesh import last
from ibtool.model.mesh import CODE, Level
from ibtool.model.names import escaped
from ibtool.views import mesh as view

NONE_YET = "no mesh has run on this node yet (ibtool mesh NODESET)"
LEVEL_STYLE = {Level.FAIL: "bold red", Level.WARN: "bold yellow"}


def head_text(m: last.LastMesh) -> Text:
    s = m.settings
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(m.started))
    text = Text()
    text.append(when, style="bold")
    text.append(
        f", {_seconds(m.elapsed)} through {s.engine}: {m.endpoints_total:,} endpoints on "
        f"{m.nodes:,} nodes, {'all rails' if s.all_rails else 'rail to rail'}, "
        f"{m.rounds:,} rounds, {m.probed:,} of {m.pairs:,} pairs probed, {s.count} pings each"
    )
    for b in m.baselines:
        if b.median_us is None:
            text.append(f"\n{b.group}: no pair answered", style="dim")
        else:
            text.append(
                f"\n{b.group}: median {view.us(b.median_us)}, p90 {view.us(b.p90_us)} "
                f"over {b.pairs:,} pairs"
            )
    text.append("\n")
    if m.verdicts_total:
        levels = [v.level for v in m.verdicts]
        parts = [
            f"{levels.count(lv)} {lv.name}" for lv in (Level.FAIL, Level.WARN) if levels.count(lv)
        ]
        more = "" if m.verdicts_total == len(m.verdicts) else f" (of {m.verdicts_total:,})"
        text.append(
            f"{', '.join(parts)} verdicts{more}",
            style=LEVEL_STYLE.get(m.worst or Level.WARN, ""),
        )
    else:
        text.append("healthy: no verdict", style="bold green")
    if m.unreachable:
        names = ", ".join(n for n, _ in m.unreachable[:8])
        more = f" and {len(m.unreachable) - 8} more" if len(m.unreachable) > 8 else ""
        text.append(f"\nunreachable (no agent): {names}{more}", style="red")
    return text


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(round(s), 60)
    return f"{m} min {s} s" if m < 60 else f"{m // 60} h {m % 60} min"


def map_text(m: last.LastMesh, width: int) -> Text:
    """The folded heat map within `width` columns, each glyph in its health's style."""
    laid = view.layout(m.map, width)
    text = Text(no_wrap=True, overflow="crop")
    for line in laid.title:
        text.append(line + "\n", style="bold")
    for line in laid.header:
        text.append(line + "\n", style="dim")
    for label, glyphs in laid.rows:
        text.append(label)
        for ch in glyphs.rstrip():
            code = CODE.get(ch)
            text.append(ch, style=view.STYLE[code] if ch != " " and code is not None else "")
        text.append("\n")
    for line in laid.notes:
        text.append(line + "\n", style="dim")
    return text.rstrip() or text


def verdicts_text(m: last.LastMesh) -> Text:
    text = Text()
    for v in m.verdicts:
        text.append(v.level.name, style=LEVEL_STYLE[v.level])
        text.append(" ")
        text.append(f"{v.culprit.value} {v.subject}", style="bold")
        text.append(f": {v.why}\n")
        for cmd in v.next:
            text.append("  ")
            text.append("next:", style="cyan")
            text.append(f" {cmd}\n")
    if m.verdicts_total > len(m.verdicts):
        text.append(f"… and {m.verdicts_total - len(m.verdicts):,} more in the file's run\n")
    return text.rstrip() or text


class MeshScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,m", "dismiss", "Close")]

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.mesh: last.LastMesh | None = None
        self.error: str | None = None
        self._width = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="mesh") as box:
            box.border_title = "last mesh"
            box.border_subtitle = "Escape closes"
            with VerticalScroll(id="mesh-body"):
                yield Static("", id="mesh-head")
                # the verdicts first: they name the culprit and what to run; on 24 lines the
                # map would push them below the fold
                yield Static("", id="mesh-verdicts")
                yield Static("", id="mesh-map")

    def on_mount(self) -> None:
        self.load()
        self.query_one("#mesh-body").focus()  # the arrows and page keys scroll it

    def load(self) -> None:
        self.mesh, self.error = None, None
        try:
            self.mesh = last.load(self.path)
        except FileNotFoundError:
            self.error = NONE_YET
        except IbtoolError as e:
            self.error = e.message
        except Exception as e:  # never a traceback on the dashboard
            self.error = f"last mesh {self.path}: {type(e).__name__}: {e}"
        head = self.query_one("#mesh-head", Static)
        if self.mesh is None:
            style = "dim" if self.error == NONE_YET else "bold red"
            # the path, the loader's words: as text, escaped. What a loaded file names is
            # printable text already: the loader refuses a control character in any name.
            head.update(Text(escaped(self.error or ""), style=style))
            self.query_one("#mesh-map").display = False
            self.query_one("#mesh-verdicts").display = False
            return
        head.update(head_text(self.mesh))
        verdicts = self.query_one("#mesh-verdicts", Static)
        verdicts.update(verdicts_text(self.mesh))
        verdicts.display = bool(self.mesh.verdicts)
        self._show_map()

    def on_resize(self) -> None:
        self.call_after_refresh(self._show_map)

    def _show_map(self) -> None:
        if self.mesh is None or not self.is_attached:
            return
        body = self.query_one("#mesh-body")
        width = max(20, body.content_region.width - 2)  # the scrollbar's room
        if width != self._width:
            self._width = width
            self.query_one("#mesh-map", Static).update(map_text(self.mesh, width))

    @property
    def text(self) -> str:
        """Everything the screen shows, as plain text (for tests)."""
        return "\n".join(
            str(w.render()) for w in self.query(Static) if w.display and w.id != "mesh"
        )
