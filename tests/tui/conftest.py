"""The dashboard on fixture trees, with the time and the counters in the test's hands: every
poll reads the tree, the clock moves only when the test says, so frames and screenshots are
the same on every run."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ibtool.api import HealthResult, Status
from tests.fixtures import sysfs_trees

EPOCH = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
BOOT = "5b4e5a6c-2f0a-4c59-9d1e-0d5f4b1c6a77"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


class Node:
    """A fixture tree read by a live-like Feed: `tick(s)` moves the clock, `write` changes a
    file before the next poll."""

    def __init__(
        self,
        tmp_path: Path,
        tree: str = "mlx5_ib_hca",
        live: bool = True,
        checks=None,
        netlink=None,
    ):
        from ibtool.health.config import HealthConfig
        from ibtool.host import Host
        from ibtool.live.feed import Feed

        self.root = sysfs_trees.build(tree, tmp_path / "root")
        names = sorted(os.listdir(self.root / "sys/class/infiniband"))
        sysfs_trees.uverbs(self.root, names)
        boot = self.root / "proc/sys/kernel/random"
        boot.mkdir(parents=True, exist_ok=True)
        (boot / "boot_id").write_text(BOOT + "\n")
        self.now = 0.0
        self.host = Host(root=str(self.root), warn=lambda m: self.feed.note(m), netlink=netlink)
        if checks is None:
            checks = default_checks()
        self.feed = Feed(
            lambda: self.host,
            live=live,
            source="this host" if live else f"--root {self.root.name}",
            checks=checks,
            config=HealthConfig(),
            clock=lambda: self.now,
            wall=lambda: EPOCH + self.now,
            boot_id=lambda host: BOOT,
        )

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds

    def port(self, device: str = "mlx5_0", port: int = 1) -> Path:
        return self.root / "sys/class/infiniband" / device / "ports" / str(port)

    def counter(self, name: str, value: int, device: str = "mlx5_0", port: int = 1) -> None:
        (self.port(device, port) / "counters" / name).write_text(f"{value}\n")

    def value(self, name: str, device: str = "mlx5_0", port: int = 1) -> int:
        return int((self.port(device, port) / "counters" / name).read_text())

    def add(self, name: str, amount: int, device: str = "mlx5_0", port: int = 1) -> None:
        self.counter(name, self.value(name, device, port) + amount, device, port)

    def write(self, relative: str, text: str) -> None:
        (self.root / relative).write_text(text + "\n")

    def app(self, **kwargs):
        kwargs.setdefault("interval", 10.0)  # the test polls (`refresh`); no timer fires
        return noting_dashboard()(self.feed, **kwargs)


@dataclass(frozen=True)
class Note:
    """A notification the dashboard raised (a toast on the screen)."""

    message: str
    title: str
    severity: str


def noting_dashboard():
    """The Dashboard, with every notification it raises (App.notify) also kept in `notes`."""
    from ibtool.tui.app import Dashboard

    class Noting(Dashboard):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.notes: list[Note] = []

        def notify(self, message, *, title="", severity="information", **kwargs):
            self.notes.append(Note(str(message), title, severity))
            super().notify(message, title=title, severity=severity, **kwargs)

    return Noting


def default_checks():
    """ibtool health's own checks, as the command gets them (and no third-party plugin's this
    machine may have installed)."""
    from ibtool.plugin.hooks import health_checks
    from ibtool.plugin.manager import ENV_DISABLE_AUTOLOAD, build_plugins

    return health_checks(build_plugins(environ={ENV_DISABLE_AUTOLOAD: "1"}), lambda m: None)


@pytest.fixture
def node(tmp_path):
    made = []

    def make(**kw) -> Node:
        made.append(Node(tmp_path / f"node{len(made)}", **kw))
        return made[-1]

    return make


async def settle(pilot) -> None:
    """Until the poll under way has been shown."""
    app = pilot.app
    for _ in range(200):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not app.polling:
            return
    raise AssertionError("the poll did not finish")


async def poll(pilot) -> None:
    """One poll, shown."""
    await settle(pilot)
    pilot.app.action_refresh()
    await settle(pilot)


def cell(table, row_key: str, column: str) -> str:
    value = table.get_cell(row_key, column)
    return getattr(value, "plain", str(value))


def ok(summary: str) -> list[HealthResult]:
    return [HealthResult(Status.OK, "", summary)]
