"""`ibtool tui` headless on the live rxe pair: perftest traffic shown as it flows, with the
holder of its QPs; veth1 down and up logged and shown; the loopback run from the dashboard,
nothing left behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

from tests.integration import faults
from tests.integration.running import wait_listening

pytestmark = pytest.mark.integration


def live_dashboard():
    """The dashboard as `ibtool tui` builds it on this host, its own checks and loopback."""
    from ibtool_plugins.tui import loopback_runner

    from ibtool.health import state as healthstate
    from ibtool.health.config import HealthConfig
    from ibtool.host import Host
    from ibtool.live.feed import Feed
    from ibtool.plugin.hooks import health_checks
    from ibtool.plugin.manager import build_plugins
    from ibtool.tui.app import Dashboard

    feed = Feed(
        lambda: Host(warn=feed.note),
        live=True,
        source="this host",
        checks=health_checks(build_plugins(), lambda m: None),
        config=HealthConfig(),
        boot_id=lambda host: healthstate.boot_id(host.root, host.fs),
    )

    def gid_index(device, port):
        host = Host()
        try:
            return host.roce_gid_index(device, port)
        finally:
            host.close()

    return Dashboard(feed, interval=1.0, loopback=loopback_runner(gid_index))


async def until(pilot, predicate, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"the dashboard never showed {what}")
        await pilot.pause(0.5)


def perftest(device: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    """ib_write_bw server and client on DEVICE's IPv4 GID for 60 s (-D): traffic to watch."""
    args = ["ib_write_bw", "-d", device, "-x", "1", "-s", "65536", "-D", "60", "-p", "18998"]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(server, 18998)  # before the client connects
    client = subprocess.Popen(
        [*args, "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return server, client


def our_qps() -> list:
    out = subprocess.run(
        ["rdma", "-j", "res", "show", "qp"], capture_output=True, text=True, check=True
    ).stdout
    return [q for q in json.loads(out or "[]") if q.get("pid") == os.getpid()]


async def watch(topo) -> None:
    from textual.widgets import DataTable, Static

    from ibtool.tui.screens.loopback import LoopbackScreen
    from ibtool.tui.widgets.events import EventLog
    from ibtool.tui.widgets.ports import PortTable

    device, peer = topo["device"], topo["peer_device"]
    mine, theirs = (device, 1), (peer, 1)
    app = live_dashboard()
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.frame is not None and app.frame.row(mine), "rxe0/1")
        table = app.query_one(PortTable)

        def cell(key, column) -> str:
            value = table.get_cell(f"{key[0]}/{key[1]}", column)
            return getattr(value, "plain", value)

        assert cell(mine, "state") == "ACTIVE" and cell(mine, "addr") == topo["netdev"]

        # perftest traffic: rxe counts packets, shown per second; its QPs by their holder
        server, client = perftest(device)
        try:
            await until(
                pilot,
                lambda: (app.frame.row(mine).traffic.tx_packets or 0) > 0,
                "packets per second on rxe0/1",
            )
            tx = cell(mine, "tx")
            assert tx.endswith("pkt/s") and tx.split()[0] != "0", tx
            shots = topo.get("out")  # what a person sees, kept with the run's results
            if shots:
                app.save_screenshot("tui-overview.svg", shots)
            await pilot.press("enter")
            await until(
                pilot,
                lambda: (
                    app.frame.focus is not None
                    and any(o.comm == "ib_write_bw" and o.qp for o in app.frame.focus.owners)
                ),
                "ib_write_bw among the holders of rxe0/1's QPs",
            )
            if shots:
                app.save_screenshot("tui-detail.svg", shots)
            gids = app.screen.query_one("#gids", DataTable)
            assert gids.row_count >= 2  # the link-local GID and the IPv4 ones, RoCE v1 and v2
            await pilot.press("escape")
        finally:
            for p in (client, server):
                p.kill()
                p.wait()

        # veth1 down and up: the peer's port (and ours, across the veth pair) shown and logged
        with faults.link_down(topo, topo["peer_netdev"]):
            await until(pilot, lambda: cell(theirs, "state") == "DOWN", "rxe1/1 DOWN")
            assert cell(theirs, "health") == "CRIT"
        await until(pilot, lambda: cell(theirs, "state") == "ACTIVE", "rxe1/1 ACTIVE again")
        log = str(app.query_one(EventLog).render())
        assert f"port_state {peer}/1 state DOWN (was ACTIVE)" in log, log
        assert f"port_state {peer}/1 state ACTIVE (was DOWN)" in log, log
        # newest first: the port came back after it went down
        assert log.index(f"{peer}/1 state ACTIVE") < log.index(f"{peer}/1 state DOWN")

        # the loopback from the dashboard, on the selected port (the first: rxe0/1)
        table.move_cursor(row=0)
        await pilot.press("l")
        screen = app.screen
        assert isinstance(screen, LoopbackScreen)
        await until(pilot, lambda: screen.done, "the loopback's end", timeout=300)
        statuses = {r.op: r.status.value for r in screen.results}
        assert len(statuses) == 7
        assert set(statuses.values()) <= {"PASS", "UNSUPPORTED"}, statuses
        assert statuses["send"] == statuses["write"] == statuses["read"] == "PASS"
        status = str(screen.query_one("#loopback-status", Static).render())
        assert status.startswith("all 7 operations passed"), status
        assert our_qps() == []
        await pilot.press("escape", "q")
    assert app.return_code == 0


def test_the_dashboard_on_the_live_rxe_pair(testbed):
    asyncio.run(watch(testbed))
