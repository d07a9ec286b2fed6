"""What each process holds on a port: QPs, CQs and MRs, as `ibtool res` counts them."""

from __future__ import annotations

from ibtool.live.feed import Focus
from ibtool.tui.widgets.tables import WholeTable

COLUMNS = ("PID", "COMMAND", "QPs", "CQs", "MRs")


def rows(focus: Focus) -> list[tuple]:
    return [
        ("-" if o.pid is None else str(o.pid), o.comm or "?", str(o.qp), str(o.cq), str(o.mr))
        for o in focus.owners
    ]


class OwnerTable(WholeTable):
    headers = COLUMNS

    def show(self, focus: Focus) -> None:
        self.show_rows(rows(focus))
