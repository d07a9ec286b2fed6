"""The dashboard driven as an operator drives it: keys, mouse, what each screen shows."""

from __future__ import annotations

import os

import pytest
from textual.widgets import DataTable, Static

from ibtool.tui.screens.detail import PortScreen
from ibtool.tui.screens.help import HelpScreen
from ibtool.tui.screens.loopback import LoopbackScreen
from ibtool.tui.widgets.counters import CounterTable
from ibtool.tui.widgets.events import EventLog
from ibtool.tui.widgets.ports import PortTable
from tests.tui.conftest import cell, poll, settle

pytestmark = pytest.mark.asyncio  # Textual's pilot drives the app from an event loop

GBIT = 1_000_000_000 // 8 // 4  # PMA data counters count 4-octet words: one Gb/s for 1 s


def events(app) -> list[str]:
    return [e.event + " " + (e.device or "") + f"/{e.port}" for e in app.query_one(EventLog).events]


async def test_every_port_in_one_table_with_its_state_and_health(node):
    app = node().app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        table = app.query_one(PortTable)
        assert table.row_count == 2
        assert cell(table, "mlx5_0/1", "state") == "ACTIVE"
        assert cell(table, "mlx5_0/1", "addr") == "LID 28"
        assert cell(table, "mlx5_0/1", "rate") == "100G 4X EDR"
        assert cell(table, "mlx5_0/2", "state") == "DOWN"
        assert cell(table, "mlx5_0/2", "health") == "CRIT"
        findings = str(app.query_one("#findings", Static).render())
        assert "mlx5_0/2: state DOWN (physical_state POLLING)" in findings


async def test_throughput_is_the_data_counters_rate_against_the_link_rate(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        n.tick(2.0)
        n.add("port_xmit_data", 50 * GBIT * 2)  # 50 Gb/s for 2 s on a 100 Gb/s link
        n.add("port_rcv_data", 1 * GBIT * 2)
        n.add("port_xmit_packets", 4_000_000)
        await poll(pilot)
        table = app.query_one(PortTable)
        tx = cell(table, "mlx5_0/1", "tx")
        assert tx == "██▌    50.0 Gb/s"  # half of 5 cells
        assert cell(table, "mlx5_0/1", "rx").endswith("   1.0 Gb/s")
        assert app.frame.row(("mlx5_0", 1)).traffic.tx_packets == 2_000_000


async def test_error_deltas_count_from_the_start_and_mark_the_last_interval(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        n.tick()
        n.add("port_rcv_errors", 5)
        await poll(pilot)
        table = app.query_one(PortTable)
        assert cell(table, "mlx5_0/1", "errors") == "5 +5"
        n.tick()
        n.add("symbol_error", 2)
        await poll(pilot)
        assert cell(table, "mlx5_0/1", "errors") == "7 +2"
        n.tick()
        await poll(pilot)
        assert cell(table, "mlx5_0/1", "errors") == "7"


async def test_a_counter_reset_is_an_event_not_a_rate(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        n.tick()
        n.counter("port_xmit_data", 10)
        await poll(pilot)
        assert "counter_reset mlx5_0/1" in events(app)
        assert app.frame.row(("mlx5_0", 1)).traffic.tx_bytes is None
        assert "counter port_xmit_data" in str(app.query_one(EventLog).render())


async def test_a_port_going_down_is_logged_and_checked_at_once(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        n.tick()
        n.write("sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN")
        n.write("sys/class/infiniband/mlx5_0/ports/1/phys_state", "3: Disabled")
        await poll(pilot)
        table = app.query_one(PortTable)
        assert cell(table, "mlx5_0/1", "state") == "DOWN"
        assert cell(table, "mlx5_0/1", "health") == "CRIT"  # not at the next health run
        log = str(app.query_one(EventLog).render())
        assert "14:13:21 port_state mlx5_0/1 state DOWN (was ACTIVE) physical_state DISABLED" in log


async def test_a_root_tree_read_again_checks_a_port_that_went_down(node):
    n = node(live=False)  # --root on a host's /sys mounted in a container, r to read it again
    app = n.app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        table = app.query_one(PortTable)
        assert cell(table, "mlx5_0/1", "health") == "OK"
        n.tick()
        n.write("sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN")
        n.write("sys/class/infiniband/mlx5_0/ports/1/phys_state", "3: Disabled")
        await poll(pilot)
        assert cell(table, "mlx5_0/1", "state") == "DOWN"
        assert cell(table, "mlx5_0/1", "health") == "CRIT"
        assert "mlx5_0/1: state DOWN" in str(app.query_one("#findings", Static).render())


async def test_a_port_that_went_down_during_a_failed_poll_is_checked_at_the_next(node):
    n = node()
    app = n.app()
    real = n.host.counters
    failing = []

    def counters(*args, **kwargs):
        if failing:
            raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    n.host.counters = counters
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        n.tick()
        n.write("sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN")
        failing.append(1)
        await poll(pilot)
        assert "poll failed: OSError" in str(app.query_one("#findings", Static).render())
        failing.clear()
        n.tick()
        await poll(pilot)
        table = app.query_one(PortTable)
        assert cell(table, "mlx5_0/1", "state") == "DOWN"
        assert cell(table, "mlx5_0/1", "health") == "CRIT"
        assert "port_state mlx5_0/1" in events(app)


async def test_a_device_that_disappears_and_comes_back(node):
    n = node()
    app = n.app()
    link = n.root / "sys/class/infiniband/mlx5_0"
    target = os.readlink(link)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        link.unlink()
        n.tick()
        await poll(pilot)
        assert app.query_one(PortTable).row_count == 0
        assert "no RDMA devices" in str(app.query_one("#findings", Static).render())
        os.symlink(target, link)
        n.tick()
        await poll(pilot)
        assert app.query_one(PortTable).row_count == 2
        kinds = [e.event for e in app.query_one(EventLog).events]
        assert kinds[:1] == ["unregister"] and "register" in kinds[1:]


async def test_the_detail_of_a_device_that_went_away_says_so_and_shows_nothing_stale(node):
    n = node()
    app = n.app(loopback=lambda *a: None)
    link = n.root / "sys/class/infiniband/mlx5_0"
    target = os.readlink(link)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await poll(pilot)
        screen = app.screen
        gids = screen.query_one("#gids", DataTable)
        assert gids.row_count == 1
        link.unlink()
        n.tick()
        await poll(pilot)
        text = lambda widget: str(screen.query_one(widget, Static).render())  # noqa: E731
        assert text("#facts").startswith(" mlx5_0/1: gone")
        assert text("#gid-note") == "mlx5_0/1 is gone: no GIDs"
        assert text("#owner-note") == "mlx5_0/1 is gone: no resources"
        assert text("#explain") == "mlx5_0/1 is gone: no counters"
        assert gids.row_count == 0 and screen.query_one(CounterTable).row_count == 0
        await pilot.press("l")
        assert app.screen is screen  # no loopback test on a port that is gone
        assert "mlx5_0/1 is not there any more" in [m.message for m in app.notes]
        os.symlink(target, link)
        n.tick()
        await poll(pilot)
        assert gids.row_count == 1 and text("#gid-note") == "1 GID"
        assert text("#facts").startswith(" mlx5_0/1 ACTIVE")


async def test_enter_opens_the_port_with_every_counter_and_escape_comes_back(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, PortScreen)
        assert n.feed.focus == ("mlx5_0", 1)
        counters = app.screen.query_one(CounterTable)
        names = [cell(counters, k.value, "name") for k in counters.rows]
        assert "symbol_error" in names and "out_of_buffer" in names
        assert cell(counters, "pma:port_xmit_wait", "value") == "4,294,967,295 SAT"
        explain = str(app.screen.query_one("#explain", Static).render())
        assert explain.startswith(names[0] + " (")
        await pilot.press("down")
        explain = str(app.screen.query_one("#explain", Static).render())
        assert explain.startswith(names[1] + " (")
        await pilot.press("escape")
        assert not isinstance(app.screen, PortScreen)
        assert n.feed.focus is None


async def test_the_detail_shows_gids_and_says_why_resources_are_missing(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await poll(pilot)
        screen = app.screen
        gids = screen.query_one("#gids", DataTable)
        assert gids.row_count == 1
        assert "fe80:0000:0000:0000" in str(gids.get_row_at(0)[2])
        note = str(screen.query_one("#owner-note", Static).render())
        assert note.startswith("resources are read from the running kernel over netlink")


async def test_a_counter_rate_and_its_history_in_the_detail(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        for step in (1, 2, 3):
            n.tick()
            n.add("port_rcv_errors", step)
            await poll(pilot)
        counters = app.screen.query_one(CounterTable)
        assert cell(counters, "pma:port_rcv_errors", "rate") == "3.0"
        assert cell(counters, "pma:port_rcv_errors", "history").endswith(
            " ▃▆█"
        )  # no rate at the first poll, then 1, 2, 3


async def test_pause_stops_polling_and_p_resumes(node):
    n = node()
    app = n.app(interval=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        assert app.paused and not app.poll_armed
        assert "PAUSED" in str(app.query_one("#status").render())
        polled = app.frame.number
        await pilot.pause(0.5)
        assert app.frame.number == polled
        await pilot.press("p")
        await settle(pilot)
        assert not app.paused and app.frame.number > polled


async def test_less_and_greater_than_change_the_interval(node):
    app = node().app(interval=1.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("greater_than_sign")
        assert app.interval == 0.5
        await pilot.press("less_than_sign", "less_than_sign", "less_than_sign")
        assert app.interval == 5.0
        assert "every 5 s" in str(app.query_one("#status").render())
        for _ in range(6):
            await pilot.press("less_than_sign")
        assert app.interval == 10.0


async def test_slash_filters_the_ports_and_escape_clears(node):
    app = node().app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("slash", "D", "O", "W", "N")
        table = app.query_one(PortTable)
        assert [k.value for k in table.rows] == ["mlx5_0/2"]
        await pilot.press("escape")
        assert table.row_count == 2 and table.has_focus


async def test_escape_clears_a_filter_kept_with_enter(node):
    app = node().app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        footer = app.query_one("Footer")
        assert "Clear" not in [k.description for k in footer.query("FooterKey")]
        await pilot.press("slash", "D", "O", "W", "N", "enter")
        table = app.query_one(PortTable)
        assert [k.value for k in table.rows] == ["mlx5_0/2"] and table.has_focus
        await pilot.pause()
        keys = {k.description: k.region for k in footer.query("FooterKey")}
        assert list(keys)[-4:-1] == ["Filter", "Clear", "Help"]
        assert keys["Help"].right <= keys["palette"].x  # not cut off at 80 columns
        await poll(pilot)
        assert table.row_count == 1  # the filter holds across polls
        await pilot.press("escape")
        assert table.row_count == 2 and table.has_focus
        assert not app.query_one("#filter").display
        await poll(pilot)
        assert table.row_count == 2


async def test_question_mark_lists_every_key(node):
    app = node().app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one(Static).render())
        for key in ("q", "l", "p", "r", "<", ">", "/", "?", "Esc"):
            assert f"\n  {key} " in text, key
        assert "\n  Esc          Clear the / filter\n" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_q_quits_and_so_does_ctrl_c(node):
    for key in ("q", "ctrl+c"):
        app = node().app()
        async with app.run_test(size=(120, 30)) as pilot:
            await settle(pilot)
            await pilot.press(key)
            await pilot.pause()
            assert not app.is_running, key
        assert app.return_code == 0


async def test_a_click_selects_and_a_second_click_opens(node):
    app = node().app()
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        table = app.query_one(PortTable)
        await pilot.click(PortTable, offset=(3, 2))  # the header is row 0; mlx5_0/2 is row 2
        assert table.selected == ("mlx5_0", 2)
        await pilot.click(PortTable, offset=(3, 2))
        assert isinstance(app.screen, PortScreen) and app.screen.key == ("mlx5_0", 2)


def results(*statuses):
    from ibtool.rdma.loopback.results import OpResult, Status

    return [
        OpResult(
            op,
            Status(status),
            4096,
            100,
            [5.0, 6.0, 7.0],
            900.0 if op == "write" else None,
            "device reports atomic_caps NONE" if status == "UNSUPPORTED" else None,
        )
        for op, status in statuses
    ]


async def test_the_loopback_runs_in_a_thread_and_shows_each_operation(node):
    ran = []

    def runner(device, port, ops, report, cancelled):
        ran.append((device, port, ops))
        for r in results(("send", "PASS"), ("write", "PASS"), ("fetch_add", "UNSUPPORTED")):
            report(r)

    app = node().app(loopback=runner)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("l")
        screen = app.screen
        assert isinstance(screen, LoopbackScreen)
        await screen.workers.wait_for_complete()
        await pilot.pause()
        assert ran[0][:2] == ("mlx5_0", 1)
        table = screen.query_one("#loopback-results", DataTable)
        assert [str(table.get_row_at(i)[1]) for i in range(3)] == ["PASS", "PASS", "UNSUPPORTED"]
        status = str(screen.query_one("#loopback-status", Static).render())
        assert status.startswith("all 3 operations passed or are unsupported")


async def test_a_loopback_that_cannot_start_says_why(node):
    from ibtool.errors import UnsupportedError

    def runner(device, port, ops, report, cancelled):
        raise UnsupportedError("pyverbs is not installed", "apt install python3-pyverbs")

    app = node().app(loopback=runner)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("l")
        await app.screen.workers.wait_for_complete()
        await pilot.pause()
        status = str(app.screen.query_one("#loopback-status", Static).render())
        assert status.startswith("not run: pyverbs is not installed (hint: apt install")


async def test_no_loopback_on_a_down_port_or_a_capture(node):
    app = node().app(loopback=lambda *a: None)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("down", "l")
        assert not isinstance(app.screen, LoopbackScreen)
        assert "mlx5_0/2 is DOWN" in [n.message for n in app.notes][-1]
    capture = node(live=False).app()
    async with capture.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("l")
        assert not isinstance(capture.screen, LoopbackScreen)
        assert "not a capture" in capture.notes[-1].message


async def test_a_capture_is_read_once_and_shows_no_rates(node):
    app = node(live=False).app(interval=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.pause(0.5)
        assert app.frame.number == 1 and not app.poll_armed
        status = str(app.query_one("#status").render())
        assert "capture: no rates" in status
        assert cell(app.query_one(PortTable), "mlx5_0/1", "errors") == "-"


async def test_a_poll_that_fails_is_shown_and_the_next_one_runs(node):
    n = node()
    app = n.app()
    real = n.feed.poll
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        return real()

    n.feed.poll = flaky
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await poll(pilot)
        assert "poll failed: OSError" in str(app.query_one("#findings", Static).render())
        await poll(pilot)
        assert app.frame.error is None and app.query_one(PortTable).row_count == 2


async def test_plugin_panels_get_the_shared_feed_and_every_frame(node):
    from textual.widgets import Static as Base

    from ibtool.tui.messages import Polled

    got = []

    class Panel(Base):
        def on_polled(self, message: Polled) -> None:
            got.append(message.frame.number)
            self.update(f"{len(message.frame.rows)} ports")

    def broken(feed):
        raise RuntimeError("no such thing")

    n = node()
    feeds = []
    app = n.app(panels={"mine": lambda feed: feeds.append(feed) or Panel(), "bad": broken})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await poll(pilot)
        assert feeds == [n.feed]
        assert got == [1, 2]
        texts = [str(w.render()) for w in app.query(".panel")]
        assert "panel bad failed: RuntimeError: no such thing" in texts
        assert "2 ports" in texts


async def test_without_cap_net_admin_the_resources_panel_says_why(node):
    from ibtool.errors import PermissionDeniedError

    def refused():
        raise PermissionDeniedError("RDMA_NLDEV_CMD_RES_QP_GET needs CAP_NET_ADMIN", "run as root")

    app = node(netlink=refused).app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await poll(pilot)
        note = str(app.screen.query_one("#owner-note", Static).render())
        assert note == "RDMA_NLDEV_CMD_RES_QP_GET needs CAP_NET_ADMIN (hint: run as root)"
        assert app.screen.query_one("#owners", DataTable).row_count == 0
        assert app.screen.query_one(CounterTable).row_count > 0  # the rest is shown


async def test_80x24_shows_every_column_but_phys_without_scrolling(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        n.tick()
        n.add("port_xmit_data", 96 * GBIT)  # 96 Gb/s on a 100 Gb/s link
        await poll(pilot)
        table = app.query_one(PortTable)
        keys = [c.key.value for c in table.ordered_columns]
        assert keys == ["port", "health", "state", "tx", "rx", "errors", "rate", "addr"]
        assert sum(c.get_render_width(table) for c in table.ordered_columns) <= 80
        assert table.max_scroll_x == 0 and table.row_count == 2
        assert cell(table, "mlx5_0/1", "rate") == "100G 4X"  # EDR: 4 lanes of 25 Gb/s
        tx = table.get_cell("mlx5_0/1", "tx")
        assert tx.plain == " 96.0 Gb/s" and "red" in str(tx.style)  # above 90%: no bar
        assert [str(c.label) for c in table.ordered_columns][-1] == "LID"  # no RoCE port
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        assert [c.key.value for c in table.ordered_columns][-1] == "phys"
        assert cell(table, "mlx5_0/1", "rate") == "100G 4X EDR" and table.row_count == 2


async def test_scrolled_sideways_the_port_column_stays(node):
    app = node().app()
    async with app.run_test(size=(50, 24)) as pilot:
        await settle(pilot)
        table = app.query_one(PortTable)
        assert table.max_scroll_x > 0
        table.scroll_to(x=table.max_scroll_x, animate=False)
        await pilot.pause()
        line = "".join(segment.text for segment in table.render_line(1))
        assert line.startswith(" mlx5_0/1 ") and "LID 28" in line


async def test_the_detail_shows_the_minute_before_it_was_opened(node):
    n = node()
    app = n.app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        for step in (1, 2, 3):
            n.tick()
            n.add("port_rcv_packets", 1000 * step)
            await poll(pilot)
        await pilot.press("enter")
        await settle(pilot)  # the poll Enter starts, with the focused port's history
        counters = app.screen.query_one(CounterTable)
        assert cell(counters, "pma:port_rcv_packets", "history").rstrip().endswith("▃▆█")


async def test_a_terminal_smaller_than_80x24_is_cramped_but_works(node):
    app = node().app()
    async with app.run_test(size=(40, 12)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await poll(pilot)
        await pilot.press("escape", "question_mark")
        await pilot.pause()
        await pilot.press("escape", "q")
    assert app.return_code == 0


async def test_a_snapshot_from_the_testbed_is_shown_as_captured(tmp_path):
    from pathlib import Path

    from ibtool.live.feed import Feed
    from ibtool.snapshot.save import SnapshotHost
    from tests.tui.conftest import default_checks

    path = Path(__file__).resolve().parents[1] / "fixtures/captured/snapshot/host.json.gz"
    feed = None
    capture = SnapshotHost(str(path), lambda m: feed.note(m), False)
    try:
        feed = Feed(lambda: capture.host, live=False, source="snapshot", checks=default_checks())
        from ibtool.tui.app import Dashboard

        app = Dashboard(feed, interval=1.0)
        async with app.run_test(size=(120, 30)) as pilot:
            await settle(pilot)
            table = app.query_one(PortTable)
            assert [k.value for k in table.rows] == ["rxe0/1", "rxe1/1"]
            assert cell(table, "rxe0/1", "addr") == "veth0"
            assert cell(table, "rxe0/1", "tx").strip() == "-"  # a capture has no rates
            await pilot.press("enter")
            await poll(pilot)
            counters = app.screen.query_one(CounterTable)
            (captured,) = [
                int(e["text"])
                for e in capture.data["sysfs"]
                if e["path"].endswith("/rxe0/ports/1/hw_counters/rcvd_pkts")
            ]
            assert cell(counters, "hw:rcvd_pkts", "value") == f"{captured:,}"
            assert cell(counters, "hw:rcvd_pkts", "rate") == "-"
            # the Resources tab: each process's QPs on rxe0/1, as the device's whole dump has
            # them on port 1 (the per-port replay once gave none: 0 QPs for every process)
            netlink = capture.host.netlink("")
            qps = netlink.resources("qp", netlink.devices("rxe0"), None, False)
            on_port = {}
            for qp in qps:
                if qp.port == 1:
                    on_port[str(qp.owner.pid or "-")] = on_port.get(str(qp.owner.pid or "-"), 0) + 1
            await pilot.press("3")
            owners = app.screen.query_one("#owners", DataTable)
            shown = {}
            for i in range(owners.row_count):
                row = owners.get_row_at(i)
                if row[2] != "0":
                    shown[row[0]] = int(row[2])
            assert sum(on_port.values()) == 7 and shown == on_port
    finally:
        capture.close()


async def test_a_capture_shows_the_opened_ports_gids_without_a_key(node):
    app = node(live=False).app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)  # no `r`: opening the port reads the capture for it
        await pilot.pause()
        screen = app.screen
        assert screen.query_one("#gids", DataTable).row_count == 1
        note = str(screen.query_one("#owner-note", Static).render())
        assert note.startswith("resources are read from the running kernel over netlink")


async def test_digits_switch_the_detail_tabs(node):
    app = node().app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await poll(pilot)
        tabs = app.screen.query_one("#tabs")
        for key, tab, table in (("2", "gids-tab", "gids"), ("3", "resources-tab", "owners"),
                                ("1", "counters-tab", "counters")):  # fmt: skip
            await pilot.press(key)
            assert tabs.active == tab
            assert app.screen.focused.id == table


async def test_a_paused_dashboard_says_how_to_read_the_opened_port(node):
    app = node().app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("p", "enter")
        await pilot.pause()
        note = str(app.screen.query_one("#gid-note", Static).render())
        assert note == "paused: r reads this port's GIDs…"
        await pilot.press("r")
        await poll(pilot)
        assert app.screen.query_one("#gids", DataTable).row_count == 1


async def until(pilot, condition) -> None:
    """Until `condition()` holds (a timer of the app's own, not a poll, brings it)."""
    for _ in range(200):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("the condition never held")


def _palette_first(app) -> str:
    """The command the palette's Enter would run: its first, highlighted, option."""
    from textual.command import CommandList

    found = app.screen.query(CommandList)
    if not found or found.first().highlighted is None:
        return ""
    return str(found.first().get_option_at_index(0).prompt)


async def test_the_palettes_screenshot_is_saved_where_it_can_be_and_named(
    node, tmp_path, monkeypatch
):
    home, here = tmp_path / "home", tmp_path / "work"  # a server's root: no ~/Downloads
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.chdir(here)
    app = node().app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"screenshot")
        await until(pilot, lambda: "Screenshot" in _palette_first(app))
        await pilot.press("enter")
        await until(pilot, lambda: any(n.title == "Screenshot" for n in app.notes))
        (saved,) = here.glob("ibtool-tui-*.svg")
        (note,) = [n for n in app.notes if n.title == "Screenshot"]
        assert note.message == f"saved to {saved}" and note.severity == "information"
        assert "mlx5_0/1" in saved.read_text()


async def test_a_screenshot_that_cannot_be_saved_says_why(node, tmp_path):
    app = node().app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.action_screenshot(path=str(tmp_path / "gone"))
        await until(pilot, lambda: app.notes)
        (note,) = [n for n in app.notes if n.title == "Screenshot"]
        assert note.severity == "error"
        assert note.message.startswith(f"screenshot not saved: {tmp_path}/gone/ibtool-tui-")
        assert note.message.endswith(".svg: No such file or directory")


async def test_a_long_snapshot_path_leaves_the_health_in_the_status_line(node):
    n = node(live=False)
    n.feed.source = "snapshot /srv/support/tickets/2026/11/customer-a/node17/ticket-4711.json.gz"
    app = n.app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        line = str(app.query_one("#status").render())
        assert line.startswith(" ibtool · …") and "4711.json.gz · 1 device" in line
        assert "health CRIT" in line[:80]  # the rest (its time, the clock) may be cut off
        await pilot.resize_terminal(200, 48)
        await pilot.pause()
        line = str(app.query_one("#status").render())
        assert f"· {n.feed.source} ·" in line
