"""The last mesh kept for the dashboard: written atomically and bounded, read as untrusted (a
hostile or broken file is one DataError line, never a traceback nor a hang)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ibtool.errors import DataError, ExitCode
from ibtool.mesh import last
from ibtool.model import mesh as mesh_model
from ibtool.model.mesh import Culprit, Health, Level
from ibtool.views import mesh as view
from tests.fixtures import meshes

N = "node{:02d}/mlx5_0/1".format


@pytest.fixture(scope="module")
def faulty():
    return meshes.faulty_six()


@pytest.fixture
def saved(tmp_path, faulty):
    path = tmp_path / "state" / "ibtool" / "mesh.json"
    last.save(faulty, str(path))
    return path


def test_default_path(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert last.default_path({}) == "/var/lib/ibtool/mesh.json"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert last.default_path({"XDG_STATE_HOME": "/x"}) == "/x/ibtool/mesh.json"
    assert last.default_path({}).endswith("/.local/state/ibtool/mesh.json")


def test_round_trip(saved, faulty):
    assert stat.S_IMODE(saved.stat().st_mode) == 0o644
    assert stat.S_IMODE(saved.parent.stat().st_mode) & 0o777 == 0o755 & ~_umask()
    got = last.load(str(saved))
    assert got.path == str(saved)
    assert got.started == meshes.STARTED and got.elapsed == pytest.approx(12.34)
    assert got.settings == faulty.settings
    assert len(got.endpoints) == got.endpoints_total == 12
    assert got.endpoints[2].name == N(2) and got.endpoints[2].state == "DOWN"
    assert got.nodes == 6 and got.rounds == faulty.rounds
    assert got.pairs == view.counts(faulty)[0] and got.probed == view.counts(faulty)[1]
    assert [b.group for b in got.baselines] == ["rail 0", "rail 1"]
    assert got.verdicts_total == len(faulty.verdicts) == len(got.verdicts)
    assert [v.subject for v in got.verdicts] == [
        v.subject for v in view.worst_first(faulty.verdicts)
    ]
    assert got.verdicts[0].level == Level.FAIL and got.verdicts[-1].level == Level.WARN
    assert got.verdicts[0].next
    assert got.unreachable == (("node06", "ssh: connect to host: No route to host"),)
    assert got.worst == Level.FAIL
    assert got.map.rows() == mesh_model.fold(faulty, 64).rows()
    assert got.map.labels[0] == "node01/mlx5_0"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bounded_for_the_biggest_mesh(tmp_path):
    huge = meshes.big(1024, 8, rounds=4)
    path = tmp_path / "mesh.json"
    last.save(huge, str(path))
    assert path.stat().st_size < last.MAX_BYTES
    got = last.load(str(path))
    assert got.endpoints_total == 8192 and len(got.endpoints) == 8192
    assert len(got.map.labels) <= 64 and got.map.unit == "nodes" and got.map.per_cell == 16
    assert got.map.cells[0][0] == Health.FAILED  # gpu0006 in the first bin


def test_save_replaces_a_symlink_instead_of_writing_through_it(tmp_path, faulty):
    target = tmp_path / "precious"
    target.write_text("keep me")
    link = tmp_path / "mesh.json"
    link.symlink_to(target)
    last.save(faulty, str(link))
    assert target.read_text() == "keep me"
    assert not link.is_symlink() and last.load(str(link)).endpoints_total == 12
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mesh.")] == []


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        last.load(str(tmp_path / "none.json"))


def test_load_follows_a_symlink(tmp_path, saved):
    link = tmp_path / "link.json"
    link.symlink_to(saved)
    assert last.load(str(link)).endpoints_total == 12


def _bad(tmp_path, content, match):
    path = tmp_path / "mesh.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    with pytest.raises(DataError, match=match) as e:
        last.load(str(path))
    assert e.value.exit_code == ExitCode.DATA_ERROR
    assert "\n" not in e.value.message and len(e.value.message) < 400
    return e.value


def _good(saved) -> dict:
    return json.loads(saved.read_text())


def test_huge_file(tmp_path):
    _bad(tmp_path, b" " * (last.MAX_BYTES + 10), "larger than 4 MiB")


def test_not_json(tmp_path):
    _bad(tmp_path, b"\xff\xfe garbage", "not JSON")
    _bad(tmp_path, b'{"started": NaN}', "not JSON")
    _bad(tmp_path, b"1" * 5000, "not JSON|not an object")  # past 3.11+ digits limit, or an int


def test_deeply_nested(tmp_path):
    _bad(tmp_path, b"[" * 200_000 + b"]" * 200_000, "not JSON|nested")
    _bad(tmp_path, b'{"format": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not JSON|malformed")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d.update(format="ibtool-health-state"), "not an ibtool mesh summary"),
        (lambda d: d.update(version=2), "format version"),
        (lambda d: d.update(started="yesterday"), "started: not a number"),
        (lambda d: d.update(started=True), "started: not a number"),
        (lambda d: d["settings"].update(count=-1), r"settings.count"),
        (lambda d: d["settings"].update(all_rails="yes"), r"settings.all_rails"),
        (lambda d: d.update(endpoints={"a": 1}), "endpoints: not a list"),
        (lambda d: d["endpoints"][0].update(node=7), r"endpoints\[0\].node: not a string"),
        (lambda d: d["endpoints"][0].update(port=1.5), r"endpoints\[0\].port"),
        (lambda d: d["endpoints"][0].update(node="a" * 1000), "longer than"),
        (lambda d: d["endpoints"][0].update(node="x\x1b[2Jy"), "control characters"),
        (lambda d: d["endpoints"][0].update(device="mlx5\u202e0"), "control characters"),
        (lambda d: d["verdicts"][0].update(why="a\nFAIL forged"), "control characters"),
        (lambda d: d["verdicts"][0].update(culprit="god"), "culprit"),
        (lambda d: d["verdicts"][0].update(level="PANIC"), "level"),
        (lambda d: d["verdicts"][0].update(next="rm -rf /"), "next: not a list"),
        (lambda d: d["verdicts"][0].update(next=["x"] * 50), "more than"),
        (lambda d: d.update(verdicts_total=0), "verdicts_total"),
        (lambda d: d.update(endpoints_total=1), "endpoints_total"),
        (lambda d: d.update(unreachable=[["a"]]), "unreachable"),
        (lambda d: d.update(unreachable=[["a", "b", "c"]]), "unreachable"),
        (lambda d: d["map"].update(unit="galaxy"), "map.unit"),
        (lambda d: d["map"]["rows"].__setitem__(0, "?" * len(d["map"]["labels"])), "glyph"),
        (lambda d: d["map"]["rows"].__setitem__(0, "."), "one glyph a label"),
        (lambda d: d["map"].update(labels=["a"] * 65), "more than 64"),
        (lambda d: d["map"].update(rows=[]), "not one a label"),
        (
            lambda d: d.update(baselines=[{"group": "rail 0", "pairs": 1, "median_us": "1"}]),
            "median",
        ),
        (lambda d: d.update(map=None), "map: not an object"),
        (lambda d: d.pop("settings"), "settings: not an object"),
    ],
)
def test_hostile_fields(tmp_path, saved, change, match):
    d = _good(saved)
    change(d)
    _bad(tmp_path, d, match)


def test_not_an_object(tmp_path):
    _bad(tmp_path, [1, 2], "not an object")
    _bad(tmp_path, "mesh", "not an object")


def test_a_fifo_does_not_hang(tmp_path):
    path = tmp_path / "mesh.json"
    os.mkfifo(path)
    with pytest.raises(DataError, match="not a regular file"):
        last.load(str(path))


def test_a_directory(tmp_path):
    (tmp_path / "mesh.json").mkdir()
    with pytest.raises(DataError):
        last.load(str(tmp_path / "mesh.json"))


def test_unreadable(tmp_path, saved):
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    saved.chmod(0)
    with pytest.raises(DataError, match="Permission denied"):
        last.load(str(saved))


def test_save_makes_peer_text_printable(tmp_path):
    r = meshes.build(3, 1, unreachable=("node03",))
    r.unreachable["node03"] = "bad\x1b[31m\nthing"
    path = tmp_path / "m.json"
    last.save(r, str(path))
    got = last.load(str(path))
    assert got.unreachable[0][1] == "bad\\x1b[31m\\nthing"
    assert all(v.culprit != Culprit.NODE or v.subject == "node03" for v in got.verdicts)


def test_caps(tmp_path, monkeypatch):
    monkeypatch.setattr(last, "MAX_VERDICTS", 2)
    r = meshes.build(8, 1, down=(N(2), N(4), N(6)))
    path = tmp_path / "m.json"
    last.save(r, str(path))
    d = json.loads(path.read_text())
    assert len(d["verdicts"]) == 2 and d["verdicts_total"] == 3
