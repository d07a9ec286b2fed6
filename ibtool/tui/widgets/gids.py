"""A port's GID table: type, netdev, VLAN and IP, the index the data path uses marked."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from ibtool.feed import Focus

COLUMNS = ("", "INDEX", "GID", "TYPE", "NETDEV", "VLAN", "IP")


def rows(focus: Focus) -> list[tuple]:
    out = []
    for g in focus.gids:
        best = g.index == focus.best_gid
        style = "bold green" if best else ""
        out.append(
            (
                Text("*" if best else "", style=style),
                Text(str(g.index), style=style),
                Text(g.gid, style=style),
                g.type.label if g.type is not None else "-",
                g.netdev or "-",
                "-" if g.vlan is None else str(g.vlan),
                g.ip or "-",
            )
        )
    return out


class GidTable(DataTable):
    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", **kwargs)
        self._rows: list[tuple] | None = None

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show(self, focus: Focus) -> None:
        wanted = rows(focus)
        if wanted == self._rows:
            return
        self._rows = wanted
        self.clear()
        for values in wanted:
            self.add_row(*values)
