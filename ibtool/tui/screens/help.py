"""`?`: every key of the dashboard, from the bindings themselves."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

MOUSE = "Mouse: click a row to select it, click it again to open it; scroll with the wheel."


def key_lines(bindings) -> list[str]:
    lines = []
    for binding in bindings:
        if isinstance(binding, tuple):
            binding = Binding(*binding)
        if binding.description:
            # the tooltip where there is one: the footer's word is short, the help need not be
            said = binding.tooltip or binding.description
            lines.append(f"  {binding.key_display or binding.key:<12} {said}")
    return lines


class HelpScreen(ModalScreen):
    BINDINGS = [("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, list]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        lines = ["ibtool tui: keys", ""]
        for title, bindings in self.sections:
            lines.append(title)
            lines.extend(key_lines(bindings))
            lines.append("")
        lines.append(MOUSE)
        lines.append("Escape, q or ? closes this help.")
        with VerticalScroll(id="help"):
            yield Static("\n".join(lines), markup=False)
