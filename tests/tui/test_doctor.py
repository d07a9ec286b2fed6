"""The doctor from the dashboard: `d` on a port, a peer typed, the checklist of a runner handed
in (here a fake one: the report is built, no host or peer is reached)."""

from __future__ import annotations

import threading

import pytest
from textual.widgets import DataTable, Input, Static

from ibtool.errors import NotFoundError
from ibtool.model.doctor import Facts, Finding, GidFact, Verdict
from ibtool.tui.screens.detail import PortScreen
from ibtool.tui.screens.doctor import DoctorScreen
from tests.tui.conftest import settle

LONG_FIX = (
    "set the same MTU on both ends: ip link set enp3s0f0 mtu 9000 here and on the peer, "
    "then check every switch port on the path carries 9000-byte frames (jumbo frames on)"
)


def report(peer: str | None = "10.0.0.2"):
    from ibtool.doctor.run import Report

    local = Facts(
        hostname="node1",
        device="mlx5_0",
        port=1,
        gid_index=3,
        gids=(
            GidFact(
                3,
                "0000:0000:0000:0000:0000:ffff:c0a8:0a01",
                "RoCE v2",
                "enp3s0f0",
                ip="192.168.10.1",
            ),
        ),  # fmt: skip
    )
    remote = Facts(hostname="node2", device="mlx5_1", port=1, lid=7) if peer else None
    findings = [
        Finding("port", Verdict.PASS, "mlx5_0/1 ACTIVE, LINK_UP, 100 Gb/sec (4X EDR)"),
        Finding("route", Verdict.SKIP, "no route read (a capture)"),
        Finding(
            "mtu",
            Verdict.FAIL,
            "here: active MTU 4096 (netdev enp3s0f0 9000); there: "
            "active MTU 1024 (netdev ens1 1500): the path's MTU is 1024",
            LONG_FIX,
        ),  # fmt: skip
        Finding(
            "pcie",
            Verdict.WARN,
            "trained down: 0000:03:00.0 8.0 GT/s PCIe x8 of 16.0 GT/s PCIe x16",
            "reseat the card or move it to a full slot",
        ),  # fmt: skip
    ]
    return Report(local, remote, findings, peer)


class Fake:
    """A runner: the report (or the exception) it is given, and the calls it had."""

    def __init__(self, result=None) -> None:
        self.result = report() if result is None else result
        self.calls: list = []

    def __call__(self, device, port, peer, cancelled):
        self.calls.append((device, port, peer))
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


async def run(pilot, peer: str | None = None) -> DoctorScreen:
    screen = pilot.app.screen
    assert isinstance(screen, DoctorScreen)
    if peer is not None:
        screen.query_one(Input).value = peer
    await pilot.press("enter")
    await screen.workers.wait_for_complete()
    await pilot.pause()
    return screen


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


@pytest.mark.asyncio
async def test_d_opens_the_doctor_of_the_selected_port_and_shows_the_checklist(node):
    fake = Fake()
    app = node().app(doctor=fake)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("down", "d")  # mlx5_0/2 is DOWN: the doctor is for that too
        screen = app.screen
        assert isinstance(screen, DoctorScreen) and (screen.device, screen.port) == ("mlx5_0", 2)
        assert "Enter runs the doctor" in text(screen, "#doctor-status")
        assert fake.calls == []  # nothing runs before Enter
        await run(pilot, "10.0.0.2")
        assert fake.calls == [("mlx5_0", 2, "10.0.0.2")]
        table = screen.query_one(DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert [(str(r[0]), r[1]) for r in rows] == [
            ("PASS", "port"),
            ("SKIP", "route"),
            ("FAIL", "mtu"),
            ("WARN", "pcie"),
        ]
        assert [r[0].style for r in rows] == ["green", "dim", "bold red", "yellow"]
        assert str(rows[2][2]).startswith("here: active MTU 4096")
        head = text(screen, "#doctor-head")
        assert head == ("doctor: mlx5_0/1 GID 3 192.168.10.1 -> 10.0.0.2 (mlx5_1/1 LID 7 on node2)")
        assert (
            text(screen, "#doctor-status")
            == "status: FAIL (1 failed, 1 warned, 1 passed, 1 skipped)"
        )


@pytest.mark.asyncio
async def test_the_highlighted_check_shows_its_evidence_and_fix_in_full(node):
    app = node().app(doctor=Fake())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        screen = await run(pilot, "")
        table = screen.query_one(DataTable)
        assert table.cursor_row == 2  # the first FAIL
        fix = " ".join(screen.fix.split())  # wrapped at 80 columns: every word there
        assert fix.startswith("mtu: here: active MTU 4096")
        assert "the path's MTU is 1024" in fix and fix.endswith("fix: " + LONG_FIX)
        await pilot.press("down")  # the peer field keeps the focus; the keys move the row
        assert screen.query_one(Input).has_focus
        assert table.cursor_row == 3 and "fix: reseat the card" in screen.fix
        await pilot.press("up", "up", "up")
        assert table.cursor_row == 0
        assert screen.fix.endswith("no fix")


@pytest.mark.asyncio
async def test_an_error_is_said_and_a_rerun_with_another_peer_works(node):
    fake = Fake(NotFoundError("cannot resolve nosuch.invalid: Name or service not known",
                              "give the peer's address"))  # fmt: skip
    app = node().app(doctor=fake)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        screen = await run(pilot, "nosuch.invalid")
        assert text(screen, "#doctor-status") == (
            "not run: cannot resolve nosuch.invalid: Name or service not known "
            "(hint: give the peer's address)"
        )
        assert screen.query_one(DataTable).row_count == 0 and screen.fix == ""
        fake.result = ValueError("bad facts")
        await run(pilot, "10.0.0.3")
        assert text(screen, "#doctor-status") == "not run: ValueError: bad facts"
        fake.result = report(None)
        await run(pilot, "")
        assert fake.calls[-1] == ("mlx5_0", 1, None)  # empty: this host's side only
        assert screen.query_one(DataTable).row_count == 4
        assert text(screen, "#doctor-head") == "doctor: mlx5_0/1 GID 3 192.168.10.1"


@pytest.mark.asyncio
async def test_escape_closes_and_the_peer_is_offered_again(node):
    app = node().app(doctor=Fake(), peers=("peer-a", "peer-b"))
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        assert app.screen.query_one(Input).value == "peer-a"  # the config's first peer
        await pilot.press("escape")
        assert not isinstance(app.screen, DoctorScreen) and app.screen is app.overview
        assert app.query_one("#filter", Input).display is False  # Escape was the doctor's
        await pilot.press("d")
        await run(pilot, "10.9.9.9")
        await pilot.press("escape")
        await pilot.press("d")
        assert app.screen.query_one(Input).value == "10.9.9.9"  # the last one run


@pytest.mark.asyncio
async def test_the_peer_typed_does_not_filter_the_ports(node):
    app = node().app(doctor=Fake())
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d", "x", "y")
        assert app.screen.query_one(Input).value == "xy"
        await pilot.press("escape")
        assert app.query_one("#ports").row_count == 2


@pytest.mark.asyncio
async def test_the_doctor_from_a_port_detail_and_without_a_runner(node):
    app = node().app(doctor=Fake())
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("down", "enter")
        assert isinstance(app.screen, PortScreen)
        await pilot.press("d")
        assert isinstance(app.screen, DoctorScreen) and app.screen.port == 2
        await pilot.press("escape")
        assert isinstance(app.screen, PortScreen)
    bare = node().app()
    async with bare.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        assert not isinstance(bare.screen, DoctorScreen)
        assert bare.notes[-1].message == "this dashboard has no doctor"


@pytest.mark.asyncio
async def test_a_result_that_comes_after_escape_is_dropped(node):
    release = threading.Event()

    def slow(device, port, peer, cancelled):
        release.wait(5)
        return report()

    app = node().app(doctor=slow)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d", "enter")
        screen = app.screen
        assert text(screen, "#doctor-status").startswith("running… (mlx5_0/1)")
        await pilot.press("escape")
        release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.screen is app.overview and screen.report is None


def test_the_runner_checks_a_capture_without_a_probe(tmp_path):
    """plugins/tui's runner on a capture: the capture's host, ibtool doctor's options, no
    RDMA round trip (a capture cannot send one)."""
    from ibtool_plugins.tui import doctor_runner

    from ibtool.host import Host
    from tests.fixtures import sysfs_trees

    root = sysfs_trees.build("mlx5_roce", tmp_path / "root")
    host = Host(root=str(root), warn=lambda m: None)
    done = []
    runner = doctor_runner(lambda: host, done.append, False, lambda m: None)
    result = runner("mlx5_0", 1, None, lambda: False)
    assert done == [host]
    assert (result.local.device, result.local.port) == ("mlx5_0", 1)
    checks = {f.check: f.verdict for f in result.findings}
    assert checks["peer"] == Verdict.SKIP and "probe" not in checks
    assert checks["pcie"] == Verdict.WARN


@pytest.mark.asyncio
async def test_every_key_fits_an_80_column_footer_with_a_filter_set(node):
    from textual.widgets._footer import FooterKey

    app = node().app(doctor=Fake())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("slash", "m", "enter")  # "Esc Clear" joins the footer
        await pilot.pause()
        keys = list(app.screen.query(FooterKey))
        palette = next(k for k in keys if k.has_class("-command-palette"))
        shown = [k for k in keys if k is not palette]
        assert [k.description for k in shown] == [
            "Quit", "Loopback", "Doctor", "Pause", "Read", "Filter", "Clear", "Help"
        ]  # fmt: skip
        assert all(k.region.right <= palette.region.x for k in shown)


def test_the_runner_probes_a_peer_only_on_the_live_host(monkeypatch):
    """ibtool doctor's options: a peer given is probed on the running host (3 round trips, 2 s);
    no peer, or a capture, no probe; the host is given back however the run ends."""
    from ibtool_plugins.tui import doctor_runner

    import ibtool.api.doctor as doctor

    seen = []

    def diagnose(host, selector, opts, warn):
        seen.append((host, selector, opts))
        if opts.peer == "boom":
            raise NotFoundError("cannot resolve boom")
        return report(opts.peer)

    monkeypatch.setattr(doctor, "diagnose", diagnose)
    done = []
    live = doctor_runner(lambda: "host", done.append, True, lambda m: None)
    capture = doctor_runner(lambda: "capture", done.append, False, lambda m: None)
    live("mlx5_0", 1, "10.0.0.2", lambda: False)
    live("mlx5_0", 2, None, lambda: False)
    capture("mlx5_0", 1, "10.0.0.2", lambda: False)
    with pytest.raises(NotFoundError):
        live("mlx5_0", 1, "boom", lambda: False)
    assert [(h, s, o.peer, o.probe) for h, s, o in seen] == [
        ("host", "mlx5_0/1", "10.0.0.2", True),
        ("host", "mlx5_0/2", None, False),
        ("capture", "mlx5_0/1", "10.0.0.2", False),
        ("host", "mlx5_0/1", "boom", True),
    ]
    assert {(o.count, o.timeout, o.tcp_port) for _, _, o in seen} == {(3, 2.0, 18520)}
    assert done == ["host", "host", "capture", "host"]
