"""What the dashboard's tables share: rows kept by key and changed cell by cell, or replaced
whole when they differ; every cell shown as text (format.cell), whatever name it holds."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from textual.widgets import DataTable

from ibtool.tui import format


class KeyedTable(DataTable):
    """Rows by key; `sync` adds the new ones and updates only the cells that changed, so a
    frame repaints what moved and nothing flickers. `layout_columns` are (key, label) pairs;
    the keys in `fixed` keep the width they were given."""

    layout_columns: Sequence[tuple[str, str]] = ()  # not `columns`: DataTable has that
    fixed: Collection[str] = ()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shown: dict[str, tuple] = {}

    def sync(self, wanted: dict[str, tuple]) -> None:
        for key, values in wanted.items():
            # names (a device's, a netdev's, a process's) come from the kernel or a capture:
            # as text, escaped, never as markup; the row's key stays the real name
            values = tuple(format.cell(v) for v in values)
            before = self.shown.get(key)
            if before is None:
                self.add_row(*values, key=key)
            else:
                for (column, _), old, new in zip(self.layout_columns, before, values):
                    if old != new:
                        self.update_cell(key, column, new, update_width=column not in self.fixed)
            self.shown[key] = values


class WholeTable(DataTable):
    """A short table shown anew whenever any of its rows changed (GIDs, holders)."""

    headers: Sequence[str] = ()

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", **kwargs)
        self._rows: list[tuple] | None = None

    def on_mount(self) -> None:
        self.add_columns(*self.headers)

    def show_rows(self, wanted: list[tuple]) -> None:
        if wanted == self._rows:
            return
        self._rows = wanted
        self.clear()
        for values in wanted:
            self.add_row(*(format.cell(v) for v in values))
