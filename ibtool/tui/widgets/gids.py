"""A port's GID table: type, netdev, VLAN and IP, the index the data path uses marked."""

from __future__ import annotations

from rich.text import Text

from ibtool.live.feed import Focus
from ibtool.tui import format
from ibtool.tui.widgets.tables import WholeTable

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
                format.plain(g.gid, style=style),  # a file's text in a --root tree
                g.type.label if g.type is not None else "-",
                g.netdev or "-",
                "-" if g.vlan is None else str(g.vlan),
                g.ip or "-",
            )
        )
    return out


class GidTable(WholeTable):
    headers = COLUMNS

    def show(self, focus: Focus) -> None:
        self.show_rows(rows(focus))
