"""The last mesh from the dashboard: `m` opens it (the file handed to the app, as a command
would), the head, the folded heat map and the verdicts; none yet, or a malformed file, said
in one line; Escape closes."""

from __future__ import annotations

import pytest

from ibtool.mesh import last
from ibtool.tui.screens.mesh import NONE_YET, MeshScreen
from tests.fixtures import meshes
from tests.tui.conftest import settle

N = "node{:02d}/mlx5_0/1".format


def faulty():
    """6 nodes x 2 rails: node02's rail 0 down, node05's rail 1 slow, a lossy path, node06 with
    no agent."""
    return meshes.faulty_six()


@pytest.fixture
def mesh_file(tmp_path):
    path = tmp_path / "mesh.json"
    last.save(faulty(), str(path))
    return str(path)


async def open_mesh(pilot) -> MeshScreen:
    await settle(pilot)
    await pilot.press("m")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, MeshScreen)
    return screen


@pytest.mark.asyncio
async def test_m_shows_the_last_mesh(node, mesh_file):
    app = node().app(mesh=mesh_file)
    async with app.run_test(size=(120, 50)) as pilot:
        screen = await open_mesh(pilot)
        text = screen.text
        assert "2026-09-21 14:13:20 UTC, 12.3 s through clustershell" in text
        assert "12 endpoints on 6 nodes" in text
        assert "heat map of 12 endpoints" in text
        assert "FAIL endpoint node02/mlx5_0/1: port DOWN" in text
        assert "next: on node01: ibtool ping --server --dev mlx5_0/1" in text
        assert "WARN endpoint node05/mlx5_1/1" in text
        assert "unreachable (no agent): node06" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, MeshScreen)


@pytest.mark.asyncio
async def test_the_map_is_coloured_by_health(node, mesh_file):
    app = node().app(mesh=mesh_file)
    async with app.run_test(size=(120, 50)) as pilot:
        screen = await open_mesh(pilot)
        from ibtool.tui.screens.mesh import map_text

        styles = {str(span.style) for span in map_text(screen.mesh, 100).spans}
        assert {"bold red", "green", "yellow", "magenta", "dim"} <= styles


@pytest.mark.asyncio
async def test_none_yet(node, tmp_path):
    app = node().app(mesh=str(tmp_path / "none.json"))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_mesh(pilot)
        assert screen.text.strip() == NONE_YET


@pytest.mark.parametrize(
    "content, said",
    [
        (b"{", "not JSON"),
        (b'{"format": "ibtool-mesh-last", "version": 1}', "settings: not an object"),
        (b"\x1b[2J" * 10, "not JSON"),
    ],
)
@pytest.mark.asyncio
async def test_a_malformed_file_is_one_line(node, tmp_path, content, said):
    path = tmp_path / "mesh.json"
    path.write_bytes(content)
    app = node().app(mesh=str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_mesh(pilot)
        text = screen.text.strip()
        assert said in text and "\n" not in text and "Traceback" not in text
        assert text.startswith(f"last mesh {path}")


@pytest.mark.asyncio
async def test_the_default_path(node, tmp_path, monkeypatch):
    monkeypatch.setattr(last, "default_path", lambda env=None: str(tmp_path / "x" / "mesh.json"))
    app = node().app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_mesh(pilot)
        assert screen.path == str(tmp_path / "x" / "mesh.json")


@pytest.mark.asyncio
async def test_m_is_in_the_help(node):
    app = node().app()
    async with app.run_test(size=(80, 40)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        shown = "\n".join(str(w.render()) for w in app.screen.query("Static"))
        assert "Mesh: the last ibtool mesh run here" in shown


@pytest.mark.asyncio
async def test_a_big_mesh_folds_to_the_screen(node, tmp_path):
    path = tmp_path / "mesh.json"
    last.save(meshes.big(1024, 8, rounds=4), str(path))
    app = node().app(mesh=str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_mesh(pilot)
        rendered = str(screen.query_one("#mesh-map").render())
        assert max(len(line) for line in rendered.splitlines()) <= 80
        assert "each cell:" in rendered
