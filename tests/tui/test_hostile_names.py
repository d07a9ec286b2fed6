"""The dashboard shows every name it did not make as text, never as something the terminal or
Textual obeys.

A device may be renamed to anything but '/', a netdev to anything but '/', ':' and white space,
a process's comm and netlink's NDEV_NAME and KERN_NAME are arbitrary, and a capture from
another host or a `--root` tree holds whatever was put there. Such a name, on any screen, has
its control, format and separator characters written as their escapes (\\x1b, \\n, \\u202e):
no ESC or BEL reaches the terminal, a newline forges no line. Nor is it read as Textual or Rich
markup: "[@click=app.quit]" is no button, "[link=https:x]" or "[/]" no crash."""

from __future__ import annotations

import gzip
import json
import os
import random
import unicodedata
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from ibtool.model.doctor import Facts, Finding, Verdict
from ibtool.tui.screens.detail import PortScreen
from ibtool.tui.screens.doctor import DoctorScreen
from ibtool.tui.screens.loopback import LoopbackScreen
from ibtool.tui.screens.mesh import MeshScreen
from ibtool.tui.widgets.counters import CounterTable
from ibtool.tui.widgets.events import EventLog
from ibtool.tui.widgets.ports import PortTable
from tests.fixtures import meshes
from tests.fixtures.sysfs_trees import CAPTURED, ROCE_NETDEV, require_capture
from tests.tui.conftest import poll, settle

pytestmark = pytest.mark.asyncio  # Textual's pilot drives the app from an event loop

ESC = "mlx5\x1b[31m_1"  # SGR: what follows turns red
NEWLINE = "mlx5\nok: fake"  # a line of its own
MARKUP = "[@click=app.quit]mlx5[reverse]_2"  # a button that quits, were it markup
NETDEV = "enp\x1b]0;owned\x07s0"  # OSC 0: sets the terminal's title
COUNTER = "[link=https:x]rx\x1b[2J_err"  # a MarkupError in Textual's markup; ESC [2J clears
COMM = "ib_write_bw\x1b[31m\x07\r\x08\u202e"
CAPTURE = CAPTURED / "snapshot" / "host.json.gz"
# what a terminal obeys or a reader misreads: controls, formats (bidi), line separators
UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def shown(name: str) -> str:
    """`name` as the dashboard writes it."""
    return "".join(
        c.encode("unicode_escape").decode() if unicodedata.category(c) in UNPRINTABLE else c
        for c in name
    )


def raw(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in UNPRINTABLE]


def screen_lines(app) -> list[str]:
    """The lines of the screen as the terminal is sent them (the toasts on top), without the
    cursor moves between them."""
    strips = app.screen._compositor.render_strips()
    return ["".join(s.text for s in strip if not s.control) for strip in strips]


def texts(app) -> list[str]:
    """Everything the screens on the stack hold to show, shown now or not (a hidden tab, a
    row scrolled away): every line of the screen, every cell and label of every table, every
    Static's text and every border title."""
    out = screen_lines(app)
    for screen in app.screen_stack:
        for table in screen.query(DataTable):
            out += [str(c.label) for c in table.columns.values()]
            for i in range(table.row_count):
                out += [getattr(v, "plain", str(v)) for v in table.get_row_at(i)]
        for widget in screen.query("*"):
            if isinstance(widget, Static):  # its own lines; a name's newline is in none
                out += str(widget.render()).split("\n")
            out += [t for t in (widget.border_title, widget.border_subtitle) if t]
    return out


async def painted(pilot) -> None:
    """Until the screen stops changing. A DataTable measures its columns when it is idle,
    after its rows came, and keeps the lines of a cell it drew before that, cut to the width
    its column had (textual 8.2.8): a resize draws them anew."""
    width, height = pilot.app.size
    await pilot.resize_terminal(width + 1, height)
    await pilot.resize_terminal(width, height)
    before = None
    for _ in range(20):
        await pilot.pause()
        now = screen_lines(pilot.app)
        if now == before:
            return
        before = now


async def assert_escaped(pilot, *names: str) -> str:
    """No raw control character anywhere; each of `names` on the screen, escaped, as text.
    The screen's text, for more."""
    app = pilot.app
    await painted(pilot)
    found = [(line, raw(line)) for line in texts(app) if raw(line)]
    assert not found, found
    screen = "\n".join(screen_lines(app))
    for name in names:
        assert shown(name) in screen, (name, screen)
    return screen


def hostile(n) -> None:
    """The mlx5_roce tree's mlx5_0 under three names (ESC, a newline, markup), its netdev
    renamed with an OSC sequence in the GID table, a counter named with markup and ESC."""
    devices = n.root / "sys/class/infiniband"
    target = os.readlink(devices / "mlx5_0")
    (devices / "mlx5_0").unlink()
    for name in (ESC, NEWLINE, MARKUP):
        os.symlink(target, devices / name)
    port = (devices / ESC).resolve() / "ports/1"
    for ndev in (port / "gid_attrs/ndevs").iterdir():
        if ndev.is_file() and ndev.read_text().strip() == ROCE_NETDEV:
            ndev.write_text(NETDEV + "\n")
    netdev = (n.root / "sys/class/net" / ROCE_NETDEV).resolve()
    netdev.rename(netdev.with_name(NETDEV))
    (n.root / "sys/class/net" / ROCE_NETDEV).unlink()
    os.symlink(netdev.with_name(NETDEV), n.root / "sys/class/net" / NETDEV)
    (port / "hw_counters" / COUNTER).write_text("7\n")


async def test_the_overview_and_the_events_show_hostile_names_escaped(node):
    n = node(tree="mlx5_roce")
    hostile(n)
    app = n.app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        table = app.query_one(PortTable)
        assert table.row_count == 3
        screen = await assert_escaped(pilot, f"{ESC}/1", f"{NEWLINE}/1", f"{MARKUP}/1", NETDEV)
        assert not any(line.startswith("ok: fake") for line in screen.splitlines())
        # the keys stay the real names: the detail, loopback and doctor run on those
        assert {k.value for k in table.rows} == {f"{d}/1" for d in (ESC, NEWLINE, MARKUP)}
        table.move_cursor(row=1)
        await pilot.click(PortTable, offset=(3, 1))  # on its name: no button there
        await pilot.pause()
        assert app.is_running and table.selected == (MARKUP, 1)  # '[' sorts before 'm'
        n.tick()
        n.write(f"sys/class/infiniband/{ESC}/ports/1/state", "1: DOWN")
        await poll(pilot)
        log = str(app.query_one(EventLog).render())
        for name in (ESC, NEWLINE, MARKUP):
            assert f"port_state {shown(name)}/1 state DOWN" in log
        await assert_escaped(pilot, f"port_state {shown(MARKUP)}/1 state DOWN")
        (n.root / f"sys/class/infiniband/{MARKUP}").unlink()
        n.tick()
        await poll(pilot)
        await assert_escaped(pilot, f"unregister {MARKUP}")


async def test_the_detail_of_a_hostile_port(node):
    n = node(tree="mlx5_roce")
    hostile(n)
    app = n.app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        table = app.query_one(PortTable)
        for row in range(table.row_count):
            table.move_cursor(row=row)
            await pilot.press("enter")
            await poll(pilot)
            screen = app.screen
            assert isinstance(screen, PortScreen)
            device = screen.key[0]
            await assert_escaped(pilot, f" {device}/1 ACTIVE")
            counters = screen.query_one(CounterTable)
            keys = [k.value for k in counters.rows]
            counters.move_cursor(row=keys.index(f"hw:{COUNTER}"))
            await pilot.pause()
            explain = str(screen.query_one("#explain", Static).render())
            assert explain == f"{shown(COUNTER)}: no explanation known for this counter"
            await assert_escaped(pilot, COUNTER)
            await pilot.press("2")
            await pilot.pause()
            await assert_escaped(pilot, NETDEV)
            await pilot.press("3")
            await pilot.pause()
            await assert_escaped(pilot)
            await pilot.press("escape")
            await pilot.pause()
        # the port gone while its detail is open says so, naming it
        await pilot.press("enter")
        await poll(pilot)
        device = app.screen.key[0]
        (n.root / "sys/class/infiniband" / device).unlink()
        n.tick()
        await poll(pilot)
        await assert_escaped(pilot, f"{device}/1: gone", f"{device}/1 is gone: no counters")


async def test_notifications_the_loopback_and_the_doctor_name_a_hostile_port(node):
    peer = Facts(hostname="node2\x1b]0;owned\x07", device=NETDEV, port=1, lid=7)
    local = Facts(hostname="node1", device=MARKUP, port=1)

    def report(device, port, peer_address, cancelled):
        from ibtool.doctor.run import Report

        findings = [
            Finding("[/]port", Verdict.PASS, f"{device}/1 ACTIVE"),
            Finding("mtu", Verdict.FAIL, f"there: netdev {NETDEV}", f"ip link set {NETDEV} up"),
        ]
        return Report(local, peer, findings, peer_address)

    def loopback(device, port, ops, report, cancelled):
        from ibtool.errors import UnsupportedError

        raise UnsupportedError(f"{device}: no such device [/]", f"check {NETDEV}")

    n = node(tree="mlx5_roce")
    hostile(n)
    app = n.app(loopback=loopback, doctor=report)
    async with app.run_test(size=(160, 48), notifications=True) as pilot:  # toasts shown
        await settle(pilot)
        table = app.query_one(PortTable)
        for row in range(table.row_count):
            table.move_cursor(row=row)
            device = table.selected[0]
            await pilot.press("l")
            screen = app.screen
            assert isinstance(screen, LoopbackScreen)
            await screen.workers.wait_for_complete()
            await pilot.pause()
            await assert_escaped(
                pilot, f"loopback on {device}/1", f"not run: {device}: no such device"
            )
            await pilot.press("escape")
            app.clear_notifications()  # a toast would hide the doctor's head line
            await pilot.press("d")
            screen = app.screen
            assert isinstance(screen, DoctorScreen) and screen.device == device  # the real name
            await assert_escaped(pilot, f"doctor {device}/1")
            await pilot.press(*"10.0.0.2", "enter")
            await screen.workers.wait_for_complete()
            await pilot.pause()
            await assert_escaped(
                pilot, f"doctor: {MARKUP}/1", f"-> 10.0.0.2 ({NETDEV}/1 LID 7 on node2"
            )
            assert f"ip link set {shown(NETDEV)} up" in screen.fix
            await pilot.press("escape")
            await pilot.pause()
        n.write(f"sys/class/infiniband/{ESC}/ports/1/state", "1: DOWN")
        n.tick()
        await poll(pilot)
        for row in range(table.row_count):
            table.move_cursor(row=row)
            device = table.selected[0]
            await pilot.press("l")  # not on a DOWN port: a toast says why, naming it
            await pilot.pause()
            assert not isinstance(app.screen, LoopbackScreen)
            assert app.notes[-1].message.startswith(f"{shown(device)}/1 is DOWN: ")
            await assert_escaped(pilot)
            toasts = [str(t.render()) for t in app.screen.query("Toast")]
            assert any(f"{shown(device)}/1 is DOWN: " in t for t in toasts), toasts


async def test_the_last_mesh_with_hostile_node_names(node, tmp_path):
    """The last mesh names nodes as the coordinator was told: markup is shown as text, a
    control character escaped (as saved); one in a forged file is refused in one line."""
    from ibtool.mesh import last

    name = "[b]node{:02d}[@click=app.quit]\x1b[31m"
    result = meshes.build(4, 1, down=(f"{name.format(2)}/mlx5_0/1",), node_name=name)
    path = tmp_path / "mesh.json"
    last.save(result, str(path))
    forged = json.loads(path.read_text())
    forged["endpoints"][0]["node"] = name.format(1)
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    for mesh, said in (
        (path, f"{name.format(2)}/mlx5_0/1: port DOWN"),
        (tmp_path / "forged.json", "endpoints[0].node: holds control characters"),
    ):
        app = node().app(mesh=str(mesh))
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            await pilot.press("m")
            await pilot.pause()
            assert isinstance(app.screen, MeshScreen)
            await assert_escaped(pilot, said)


def _capture() -> dict:
    with gzip.open(require_capture(CAPTURE)) as f:
        return json.load(f)


def _renamed(data: dict, old: str, new: str) -> dict:
    """The capture with device `old` called `new` everywhere."""
    text = json.dumps(data)
    return json.loads(text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))


def _poisoned(node, value):
    """Every netlink name (a netdev's, a kernel object's, a process's) changed by `value`."""
    if isinstance(node, dict):
        return {
            k: value(v)
            if isinstance(v, str) and k.endswith(("NDEV_NAME", "KERN_NAME", "COMM"))
            else _poisoned(v, value)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_poisoned(v, value) for v in node]
    return node


async def _show_capture(data: dict, path: Path, *names: str) -> None:
    """Every screen of every port of capture `data`: the overview, the detail's three tabs."""
    from ibtool.live.feed import Feed
    from ibtool.snapshot.save import SnapshotHost
    from ibtool.tui.app import Dashboard
    from tests.tui.conftest import default_checks

    path.write_text(json.dumps(data))
    feed = None
    capture = SnapshotHost(str(path), lambda m: feed.note(m), False)
    try:
        feed = Feed(lambda: capture.host, live=False, source="snapshot", checks=default_checks())
        app = Dashboard(feed, interval=1.0)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            await assert_escaped(pilot, *names)
            table = app.query_one(PortTable)
            assert table.row_count == 2
            for row in range(table.row_count):
                table.move_cursor(row=row)
                await pilot.press("enter")
                await poll(pilot)
                assert isinstance(app.screen, PortScreen)
                for tab in "123":
                    await pilot.press(tab)
                    await pilot.pause()
                    await assert_escaped(pilot)
                await pilot.press("escape")
                await pilot.pause()
            assert app.is_running
    finally:
        capture.close()


async def test_a_hostile_capture_from_another_host(tmp_path):
    data = _renamed(_capture(), "rxe0", "rxe\x1b[31m0\n[link=https:x]")
    data = _poisoned(data, lambda v: v + "\x1b[31mX\x07\r\x08\u202e[/]")
    data["comm"] = {pid: comm + COMM for pid, comm in data["comm"].items()}
    await _show_capture(data, tmp_path / "s.json", "rxe\x1b[31m0\n[link=https:x]/1")


# C0 and C1 controls, DEL, bidi overrides and isolates, zero-width, line and paragraph
# separators, and markup's brackets
ALPHABET = [chr(c) for c in (*range(1, 0x20), 0x7F, *range(0x80, 0xA0))]
ALPHABET += list("\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
ALPHABET += ["\u2028", "\u2029", "\ufeff", "[/]", "[", "]", "[b]", "[@click=app.quit]"]


def _noise(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        chars.insert(rng.randint(0, len(chars)), rng.choice(ALPHABET))
    return "".join(chars)


@pytest.mark.parametrize("seed", range(3))
async def test_random_control_characters_in_every_name_of_a_capture(tmp_path, seed):
    rng = random.Random(seed)
    device = _noise(rng, "rxe0").replace("/", "\x02")  # no '/' in a device's name
    data = _renamed(_capture(), "rxe0", device)
    data = _poisoned(data, lambda v: _noise(rng, v))
    data["comm"] = {pid: _noise(rng, comm) for pid, comm in data["comm"].items()}
    await _show_capture(data, tmp_path / "s.json", f"{device}/1")
