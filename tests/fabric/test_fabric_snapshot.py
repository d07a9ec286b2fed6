"""A fabric scan kept in a snapshot (`snapshot save FILE --fabric`), replayed (`--snapshot FILE
fabric ...`) and compared (`snapshot diff A B`, `fabric links --against FILE`), on a simulated
fabric; and a damaged or hostile saved fabric refused in one line."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.fabric.conftest import SMALL, need_the_simulator
from tests.fabric.ibsim import SimFabric
from tests.fabric.test_fabric import ibtool, said

HOST = "node003 mlx5_0"


@pytest.fixture
def fabric(tmp_path):
    need_the_simulator()
    with SimFabric(SMALL, tmp_path / "sim") as sim:
        yield sim


def save(sim, path, *extra) -> None:
    r = ibtool(sim, "snapshot", "save", str(path), "--fabric", *extra, host=HOST)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith(", a fabric of 10 nodes")


def replay(sim, path, *argv):
    return ibtool(sim, "--snapshot", str(path), *argv, host=HOST)


def test_a_saved_fabric_replays_as_the_live_one_answered(fabric, tmp_path):
    live = ibtool(fabric, "-j", "fabric", host=HOST)
    save(fabric, tmp_path / "a.json.gz")
    again = replay(fabric, tmp_path / "a.json.gz", "-j", "fabric")
    assert again.returncode == 0, again.stderr
    ours, theirs = json.loads(again.stdout), json.loads(live.stdout)
    assert ours["nodes"] == theirs["nodes"] and ours["links"] == theirs["links"]
    sm = replay(fabric, tmp_path / "a.json.gz", "fabric", "sm")
    assert sm.returncode == 0 and sm.stdout.splitlines()[-1] == (
        "one master, answering (its activity not watched)"
    )
    route = replay(fabric, tmp_path / "a.json.gz", "fabric", "route", "2", "8")
    assert route.returncode == 2
    assert "a snapshot's fabric scan does not hold them" in said(route)[-1]


def test_a_diff_names_the_link_that_went_down_and_the_errors_that_grew(fabric, tmp_path):
    save(fabric, tmp_path / "a.json.gz")
    fabric.console('Unlink "spine02"[1]')
    fabric.console('PerformanceSet "leaf01"[1] PortCounters.SymbolErrorCounter=500')
    save(fabric, tmp_path / "b.json.gz")
    r = ibtool(fabric, "-j", "snapshot", "diff", str(tmp_path / "a.json.gz"),
               str(tmp_path / "b.json.gz"), host=HOST)  # fmt: skip
    assert r.returncode == 0, r.stderr
    changes = {(c["kind"], c["what"]) for c in json.loads(r.stdout)["fabric"]}
    assert ("link_down", "link leaf01/5 <-> spine02/1 went down") in changes
    assert (
        "errors_grew", "leaf01/1 <-> node001 mlx5_0/1: SymbolErrorCounter +500 (0 -> 500)"
    ) in changes  # fmt: skip
    assert {k for k, _ in changes} <= {"link_down", "errors_grew"}
    r = ibtool(fabric, "fabric", "links", "--against", str(tmp_path / "a.json.gz"), host=HOST)
    assert r.returncode == 2  # CRITICAL: a link the saved fabric had up is down
    assert "CRITICAL link leaf01/5 <-> spine02/1 went down since the saved fabric" in (
        r.stdout.splitlines()
    )


def _rewrite(path, change) -> None:
    data = json.loads(gzip.decompress(path.read_bytes()))
    change(data["fabric"])
    path.write_bytes(gzip.compress(json.dumps(data).encode()))


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda f: f["nodes"][0].update(description="x" * 65), "description is not text"),
        (lambda f: f["nodes"][0].update(type="switch"), "type is 'switch'"),
        (lambda f: f["nodes"][0]["ports"][0].update(lid=1 << 20), "lid is '1048576'"),
        (lambda f: f.update(nodes=[{}] * 49152), "nodes is not a list of at most 49151"),
        (lambda f: f["counters"][0]["values"].update(Evil=1), "'Evil' is not a counter"),
        (lambda f: f["sms"]["sms"][0].update(node=12345), "a node the fabric does not hold"),
    ],
)
def test_a_damaged_saved_fabric_is_one_line_exit_7(fabric, tmp_path, change, named):
    path = tmp_path / "a.json.gz"
    save(fabric, path)
    _rewrite(path, change)
    scratch = tmp_path / "scratch"  # where the snapshot's tree is built (TMPDIR)
    scratch.mkdir()
    r = ibtool(fabric, "--snapshot", str(path), "fabric", host=HOST, env={"TMPDIR": str(scratch)})
    assert (r.returncode, r.stdout) == (7, "")
    assert list(scratch.iterdir()) == []  # its tree built, then removed on the refusal
    (line,) = [s for s in said(r) if "is damaged" in s]
    assert line.startswith(f"ibtool: error: {path} is damaged: its fabric ") and named in line


def test_a_snapshot_without_a_fabric_says_how_to_keep_one(fabric, tmp_path):
    path = tmp_path / "plain.json.gz"
    r = ibtool(fabric, "snapshot", "save", str(path), host=HOST)
    assert r.returncode == 0, r.stderr
    r = replay(fabric, path, "fabric")
    assert r.returncode == 2 and "snapshot save FILE --fabric" in said(r)[-1]
    r = ibtool(fabric, "fabric", "links", "--against", str(path), host=HOST)
    assert r.returncode == 7 and said(r)[-1].startswith(f"ibtool: error: {path} holds no fabric")
