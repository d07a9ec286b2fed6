"""The fabric screen (f): fed the scans of a fabric saved on the simulated NARROW fabric
(tests/tui/fabric_fixture.py: two cables at 1X, error counters at leaf02/2 and spine01/1), the
second with ten seconds of traffic and errors on top, as a FabricWatch would give them."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from textual.widgets import Static

from ibtool.tui.screens.fabric import FabricPortScreen, FabricScreen
from ibtool.tui.screens.help import HelpScreen
from ibtool.tui.widgets.fabric import FabricTable, fabric_rows
from tests.tui.conftest import EPOCH, cell, settle
from tests.tui.fabric_fixture import FIXTURE

GBIT_WORDS = 1_000_000_000 // 8 // 4  # PortXmitData counts 4-octet words: one Gb/s for 1 s
SECONDS = 10.0


def saved_scan():
    """The fixture's saved fabric, as a FabricWatch scans a snapshot: once."""
    from ibtool.live.fabric import FabricWatch
    from ibtool.snapshot.save import SnapshotHost

    capture = SnapshotHost(str(FIXTURE), lambda m: None, False)
    try:
        return FabricWatch(lambda note: capture.host, live=False).scan()
    finally:
        capture.close()


def grown(first, changes: dict) -> object:
    """The scan SECONDS after `first`, with `changes` ((node, port) -> {counter: growth}) on
    its counters, and the rates between the two, as FabricWatch computes them."""
    from ibtool.live.fabric import rates

    guid = {n.description: n.guid for n in first.fabric.nodes.values()}
    counters = dict(first.counters)
    for (node, port), add in changes.items():
        key = (guid[node], port)
        pc = counters[key]
        values = {k: v + add.get(k, 0) for k, v in pc.values.items()}
        counters[key] = dataclasses.replace(pc, values=values)
    return dataclasses.replace(
        first,
        number=first.number + 1,
        time=EPOCH - 4,  # four seconds before the dashboard's clock
        counters=counters,
        rates=rates(first.counters, counters, SECONDS),
    )


def scans():
    """node003's cable busy (6 Gb/s from leaf01/3, 2 Gb/s into it), 12 more symbol errors at
    leaf02/2."""
    first = saved_scan()
    first = dataclasses.replace(first, time=EPOCH - 4 - SECONDS)
    tx, rx = 6 * GBIT_WORDS * SECONDS, 2 * GBIT_WORDS * SECONDS
    second = grown(
        first,
        {
            ("leaf01", 3): {"PortXmitData": tx, "PortRcvData": rx, "PortXmitPkts": 3_000_000},
            ("node003 mlx5_0", 1): {"PortXmitData": rx, "PortRcvData": tx},
            ("leaf02", 2): {"SymbolErrorCounter": 12},
        },
    )
    return first, second


def counters(screen) -> dict[str, list[str]]:
    """The port's counters as its table shows them: name -> [value, rate]."""
    table = screen.query_one("#fabric-counters")
    rows = [
        [getattr(v, "plain", str(v)) for v in table.get_row_at(i)] for i in range(table.row_count)
    ]
    return {r[0]: r[1:] for r in rows}


class Watch:
    """What the dashboard reads of a FabricWatch: `latest`, set by the test."""

    def __init__(self, latest=None, live: bool = True, interval: float = 10.0) -> None:
        self.latest, self.live, self.interval = latest, live, interval
        self.started = self.stopped = 0

    def start(self) -> None:
        self.started += 1

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped += 1


@pytest.fixture(scope="module")
def two_scans():
    return scans()


def names(rows) -> list[str]:
    return [r.name for r in rows]


def test_the_ports_to_look_at_come_first_each_with_why(two_scans):
    from ibtool.model.health import Status

    rows = fabric_rows(two_scans[1], {})
    bad = [r for r in rows if r.status != Status.OK]
    assert names(bad) == ["leaf01/1", "leaf01/2", "leaf01/4", "leaf02/2", "spine01/1"]
    assert all(r.status == Status.OK for r in rows[len(bad) :])
    by = {r.name: r for r in rows}
    assert [f.kind for f in by["leaf01/1"].findings] == ["below_norm"]
    assert [f.kind for f in by["leaf01/2"].findings] == ["width_enabled_below"]
    assert [(n, v) for n, v, *_ in by["leaf02/2"].over] == [
        ("SymbolErrorCounter", 69),
        ("LinkErrorRecoveryCounter", 3),
    ]
    assert by["leaf01/4"].over == () and by["leaf01/4"].far_over[0][:2] == ("PortRcvErrors", 4)
    # every cable of the tree, from its switch end (and spine-leaf cables from both): no port
    # without a cable
    assert len(rows) == 14 and all(r.far is not None for r in rows)


def test_thresholds_leave_counters_under_them_out(two_scans):
    rows = fabric_rows(two_scans[1], {"SymbolErrorCounter": 100, "PortRcvErrors": 10})
    by = {r.name: r for r in rows}
    assert [n for n, *_ in by["leaf02/2"].over] == ["LinkErrorRecoveryCounter"]
    assert by["spine01/1"].over == () and by["leaf01/4"].far_over == ()


@pytest.mark.asyncio
async def test_f_enter_and_escape(node, two_scans):
    watch = Watch(two_scans[1])
    app = node().app(fabric=watch, thresholds={})
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        assert watch.started == 0  # nothing scanned before the screen is opened
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, FabricScreen) and watch.started == 1
        table = app.screen.query_one(FabricTable)
        head = str(app.screen.query_one("#fabric-head", Static).render())
        assert "4 switches, 6 CAs, 10 links · 5 ports to look at · scanned 4 s ago" in head
        assert "SM master LID 1 on spine01/0, priority 0 · no standby · OK" in head
        top = table.selected
        assert cell(table, top, "switch") == "leaf01" and cell(table, top, "port") == "1"
        assert cell(table, top, "check") == "WARN" and cell(table, top, "width") == "1X"
        assert cell(table, top, "far") == "node001 mlx5_0/1"
        why = str(app.screen.query_one("#fabric-why", Static).render())
        assert why.startswith("WARN 1X SDR, below the 4X SDR of 4 of 6 switch-to-CA links")
        busy = next(k for k, r in table.by_key.items() if r.name == "leaf01/3")
        assert cell(table, busy, "tx").endswith("6.0 Gb/s")
        assert cell(table, busy, "rx").endswith("2.0 Gb/s")
        errors = next(k for k, r in table.by_key.items() if r.name == "leaf02/2")
        assert cell(table, errors, "errors") == "69 SymbolErrorCounter +1 more"

        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FabricPortScreen)
        facts = str(app.screen.query_one("#fabric-facts", Static).render())
        assert facts.startswith(" leaf01/1 ACTIVE  LINK_UP  1X SDR  LID 4  to node001 mlx5_0/1")

        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FabricScreen)
        table = app.screen.query_one(FabricTable)
        table.move_cursor(row=list(table.shown).index(busy))
        await pilot.press("enter")
        await pilot.pause()
        shown = counters(app.screen)
        # in bytes, as the local port detail shows them: 6 Gb/s is 750 MB/s
        assert shown["PortXmitData (bytes)"][1] == "750M"
        assert shown["PortRcvData (bytes)"][1] == "250M"
        assert shown["PortXmitPkts"][1] == "300k"
        assert shown["SymbolErrorCounter"] == ["0", "0.0"]
        assert len(shown) == 17  # every PMA counter the port answered
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert app.screen is app.overview


@pytest.mark.asyncio
async def test_a_new_scan_is_shown_within_a_second_and_not_while_paused(node, two_scans):
    first, second = two_scans
    watch = Watch(first)
    app = node().app(fabric=watch, thresholds={})
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        await pilot.pause()
        screen = app.screen
        assert screen.seen is first
        await pilot.press("p")  # paused: the scan shown stays
        watch.latest = second
        screen.refresh_scan()
        assert screen.seen is first
        head = str(screen.query_one("#fabric-head", Static).render())
        assert "PAUSED" in head
        await pilot.press("p")
        screen.refresh_scan()
        assert screen.seen is second


@pytest.mark.asyncio
async def test_where_there_is_no_fabric_there_is_no_key(node):
    app = node().app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        await pilot.pause()
        assert app.screen is app.overview
        assert "fabric" not in {b.binding.action for b in app.active_bindings.values()}
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "Fabric" not in str(app.screen.query_one(Static).render())


@pytest.mark.asyncio
async def test_a_scan_that_failed_says_why(node):
    from ibtool.live.fabric import FabricSeen

    failed = FabricSeen(1, EPOCH, 0.1, error="no active InfiniBand port to scan the fabric through")
    app = node().app(fabric=Watch(failed), thresholds={})
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        await pilot.pause()
        head = str(app.screen.query_one("#fabric-head", Static).render())
        assert head == " fabric · no active InfiniBand port to scan the fabric through"
        assert app.screen.query_one(FabricTable).row_count == 0


def _inv(snapshot=None, root="/"):
    return SimpleNamespace(snapshot=snapshot, root=root, args=SimpleNamespace(fabric_interval=10.0))


def _capture_feed(path):
    from ibtool.live.engine import Hosts
    from ibtool.live.feed import Feed
    from ibtool.snapshot.save import SnapshotHost

    capture = SnapshotHost(str(path), lambda m: None, False)
    hosts = Hosts(lambda: capture.host, live=False, source="snapshot", close=capture.close)
    return Feed(hosts), hosts


def test_offered_for_a_snapshot_with_a_fabric_not_for_one_without_nor_a_tree(tmp_path):
    from ibtool_plugins import tui

    feed, hosts = _capture_feed(FIXTURE)
    try:
        watch = tui.fabric_watch(_inv(snapshot=str(FIXTURE)), feed)
        assert watch is not None and not watch.live and watch.interval == 10.0
        seen = watch.scan()
        assert seen.error is None and len(seen.fabric.nodes) == 10
    finally:
        hosts.close()
    without = FIXTURE.with_name("host.json.gz")
    feed, hosts = _capture_feed(without)
    try:
        assert tui.fabric_watch(_inv(snapshot=str(without)), feed) is None
    finally:
        hosts.close()
    assert tui.fabric_watch(_inv(root=str(tmp_path)), None) is None


@pytest.mark.asyncio
async def test_the_watch_scans_in_its_thread_and_stops_when_the_dashboard_quits(node):
    """A FabricWatch on its own thread (the saved fabric as if scanned live, every 50 ms):
    the screen takes each new scan, the rates come with the second, and q stops it."""
    import threading

    from ibtool.live.fabric import FabricWatch
    from ibtool.snapshot.save import SnapshotHost

    capture = SnapshotHost(str(FIXTURE), lambda m: None, False)
    watch = FabricWatch(lambda note: capture.host, live=True, interval=0.05)
    try:
        app = node().app(fabric=watch, thresholds={})
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("f")
            screen = app.screen
            for _ in range(400):
                await pilot.pause(0.01)
                screen.refresh_scan()
                if screen.seen is not None and screen.seen.number >= 2:
                    break
            assert screen.seen.number >= 2 and screen.seen.rates
            table = screen.query_one(FabricTable)
            assert cell(table, table.selected, "rates") == "0.0/0.0"
            await pilot.press("q")
        for thread in threading.enumerate():
            if thread.name == "ibtool-fabric":
                thread.join(5.0)
                assert not thread.is_alive()
    finally:
        watch.stop()
        capture.close()


def footer_actions(app) -> set[str]:
    return {b.binding.action for b in app.active_bindings.values() if b.binding.show}


@pytest.mark.asyncio
async def test_f_is_in_the_footer_but_for_80_columns_with_a_filter_set_and_works_there(
    node, two_scans
):
    app = node().app(fabric=Watch(two_scans[1]), thresholds={})
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "fabric" in footer_actions(app)
        await pilot.press("slash", *"mlx5", "enter")
        await pilot.pause()
        # "Esc Clear" and "? Help" keep their room
        assert "fabric" not in footer_actions(app) and "clear_filter" in footer_actions(app)
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, FabricScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.overview
        await pilot.press("question_mark")
        await pilot.pause()
        helped = str(app.screen.query_one(Static).render())
        assert helped.count("Fabric") == 2  # the key, and the fabric screen's section


@pytest.mark.asyncio
async def test_a_failed_scan_after_a_good_one_keeps_its_table_and_says_why(node, two_scans):
    from ibtool.live.fabric import FabricSeen

    watch = Watch(two_scans[1])
    app = node().app(fabric=watch, thresholds={})
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        await pilot.pause()
        screen = app.screen
        watch.latest = FabricSeen(
            3, EPOCH - 1, 0.1, error="the subnet could not be discovered through ibsim0/1"
        )
        screen.refresh_scan()
        assert screen.seen is two_scans[1] and screen.query_one(FabricTable).row_count == 14
        head = str(screen.query_one("#fabric-head", Static).render()).splitlines()
        assert head[0].endswith("scanned 4 s ago, every 10 s")
        assert head[-1] == (
            " the scan of 14:13:19 failed: the subnet could not be discovered through ibsim0/1"
        )
        watch.latest = two_scans[0]  # the next one answers: the error goes
        screen.refresh_scan()
        assert screen.seen is two_scans[0] and screen.failed is None
        assert "failed" not in str(screen.query_one("#fabric-head", Static).render())


@pytest.mark.parametrize("tree, offered", [("mlx5_ib_hca", True), ("mlx5_roce", False)])
def test_offered_on_a_host_with_an_infiniband_port_only(node, tree, offered):
    from ibtool_plugins import tui

    from ibtool.live.fabric import FabricWatch

    watch = tui.fabric_watch(_inv(), node(tree=tree).feed)
    if offered:
        assert isinstance(watch, FabricWatch) and watch.live and watch.interval == 10.0
        assert watch.latest is None  # made, not started: no MAD until the screen opens
    else:
        assert watch is None


def test_the_dashboard_draws_on_a_descriptor_no_capture_of_fd_2_takes(tmp_path, monkeypatch):
    """The MAD code points fd 2 at a file while libibmad runs (its messages become notes);
    from the scan's thread that would take the screen's writes too."""
    import os
    import sys

    from ibtool_plugins import tui

    terminal = open(tmp_path / "terminal", "w", encoding="utf-8")
    monkeypatch.setattr(sys, "__stderr__", terminal)
    with tui.screen_of_its_own():
        screen = sys.__stderr__
        assert screen is not terminal and screen.fileno() != terminal.fileno()
        sink = open(tmp_path / "libibmad", "w")
        os.dup2(sink.fileno(), terminal.fileno())  # as ibtool.sources.mad does to fd 2
        screen.write("drawn")
        screen.flush()
    assert sys.__stderr__ is terminal
    assert (tmp_path / "terminal").read_text() == "drawn"
    assert (tmp_path / "libibmad").read_text() == ""
    terminal.close()
    sink.close()
