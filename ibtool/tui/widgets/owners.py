"""What each process holds on a port: QPs, CQs and MRs, as `ibtool res` counts them."""

from __future__ import annotations

from textual.widgets import DataTable

from ibtool.feed import Focus

COLUMNS = ("PID", "COMMAND", "QPs", "CQs", "MRs")


def rows(focus: Focus) -> list[tuple]:
    return [
        ("-" if o.pid is None else str(o.pid), o.comm or "?", str(o.qp), str(o.cq), str(o.mr))
        for o in focus.owners
    ]


class OwnerTable(DataTable):
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
