"""What a person sees, at 80x24 and at 160x48: the SVG of each screen against the one
recorded (pytest --snapshot-update records anew; look at the PNG before committing one)."""

from __future__ import annotations

import pytest

from tests.tui.conftest import poll, settle

GBIT = 1_000_000_000 // 8 // 4
SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


async def busy(pilot, n) -> None:
    """Five seconds of traffic on mlx5_0/1 (a rising 60-80 Gb/s out, 20-32 in), three symbol
    errors in the fourth."""
    await settle(pilot)
    for second in range(5):
        n.tick()
        n.add("port_xmit_data", (60 + 5 * second) * GBIT)
        n.add("port_rcv_data", (20 + 3 * second) * GBIT)
        n.add("port_xmit_packets", 5_000_000)
        n.add("port_rcv_packets", 2_000_000)
        if second == 3:
            n.add("symbol_error", 3)
        await poll(pilot)


@pytest.mark.parametrize("size", SIZES)
def test_overview(snap_compare, node, size):
    n = node()

    async def run_before(pilot):
        await settle(pilot)
        n.tick()
        n.write("sys/class/infiniband/mlx5_0/ports/2/state", "2: INIT")
        n.write("sys/class/infiniband/mlx5_0/ports/2/phys_state", "5: LinkUp")
        await poll(pilot)
        await busy(pilot, n)

    assert snap_compare(n.app(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_port_detail(snap_compare, node, size):
    n = node()

    async def run_before(pilot):
        await busy(pilot, n)
        await pilot.press("enter")
        n.tick()
        n.add("port_rcv_errors", 2)
        await poll(pilot)

    assert snap_compare(n.app(), terminal_size=size, run_before=run_before)


def test_loopback_results(snap_compare, node):
    from tests.tui.test_dashboard import results

    def runner(device, port, ops, report, cancelled):
        for r in results(("send", "PASS"), ("write", "PASS"), ("read", "FAIL")):
            r.error = "remote access error (IBV_WC_REM_ACCESS_ERR)" if r.op == "read" else None
            report(r)

    n = node()

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("l")
        await pilot.app.screen.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(n.app(loopback=runner), terminal_size=(80, 24), run_before=run_before)


def test_help(snap_compare, node):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("question_mark")

    assert snap_compare(node().app(), terminal_size=(80, 24), run_before=run_before)


def test_a_capture(snap_compare, node):
    async def run_before(pilot):
        await settle(pilot)

    app = node(live=False).app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_doctor(snap_compare, node, size):
    """The doctor of mlx5_0/1 against a peer: a PASS, SKIP, FAIL (highlighted, its long fix
    wrapped below) and WARN, the head line above and the summary below."""
    from tests.tui.test_doctor import Fake

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("d")
        await pilot.press(*"10.0.0.2", "enter")
        await pilot.app.screen.workers.wait_for_complete()
        await pilot.pause()

    app = node().app(doctor=Fake())
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_mesh(snap_compare, node, tmp_path, size):
    """`m`: the last mesh of 6 nodes x 2 rails (a port down, a slow endpoint, a lossy path, a
    node with no agent): the head, the heat map coloured by health, the verdicts."""
    from ibtool.mesh import last
    from tests.tui.test_mesh import faulty

    path = tmp_path / "mesh.json"
    last.save(faulty(), str(path))

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("m")
        await pilot.pause()

    app = node().app(mesh=str(path))
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_mesh_none_yet(snap_compare, node, tmp_path):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("m")
        await pilot.pause()

    app = node().app(mesh=str(tmp_path / "mesh.json"))
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_fabric(snap_compare, node, size):
    """`f`: the simulated fabric's switch ports (tests/tui/fabric_fixture.py), the two cables
    at 1X and the ports with error counters first, node003's cable busy; the SM above."""
    from tests.tui.test_fabric import Watch, scans

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f")
        await pilot.pause()

    app = node().app(fabric=Watch(scans()[1]), thresholds={})
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_fabric_port(snap_compare, node, size):
    """Enter on leaf02/2 (57 symbol errors saved, 12 more since): every PMA counter."""
    from tests.tui.test_fabric import Watch, scans

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f")
        await pilot.pause()
        await pilot.press("down", "down", "down", "enter")
        await pilot.pause()

    app = node().app(fabric=Watch(scans()[1]), thresholds={})
    assert snap_compare(app, terminal_size=size, run_before=run_before)
