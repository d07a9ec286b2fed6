"""A snapshot's tree read from memory answers as the same tree built on disk: every operation of
the files layer, on every entry and on paths around them (through links, dangling ones, files
used as directories, ".."), on the captured host and on random trees that Tree accepts. The
disk is the oracle: Tree.build lays the tree out and ibtool.sources.sysfs.fs.DISK reads it."""

from __future__ import annotations

import gzip
import json
import os
import random

import pytest

from ibtool.snapshot.memory import Memory
from ibtool.snapshot.replay import SnapshotError
from ibtool.snapshot.tree import Tree
from ibtool.sources.sysfs.fs import DISK
from tests.fixtures.captured_kernel import CAPTURED
from tests.fixtures.sysfs_trees import require_capture

HOST = CAPTURED / "snapshot" / "host.json.gz"


def _answer(call, *args):
    try:
        return ("ok", call(*args))
    except OSError as e:
        return ("error", e.errno)


def _each(texts: list) -> list:
    return [("error", t.errno) if isinstance(t, OSError) else t for t in texts]


def _entries(fs, path: str):
    return sorted((e.name, _answer(e.is_dir), e.is_symlink()) for e in fs.scandir(path))


def _same(tree: Tree, disk_root: str, paths) -> int:
    """Asks both layers the same of each path; returns how many paths were compared."""
    memory = Memory(tree, "/snapshots/host.json.gz")
    roots = {DISK: disk_root, memory: memory.root}
    compared = 0
    for rel in paths:
        d, m = f"{disk_root}/{rel}" if rel else disk_root, f"{memory.root}/{rel}"
        real = os.path.realpath(d)
        if os.path.commonpath([real, disk_root]) != disk_root:
            continue  # a walk above the tree: no command asks it (links never lead there)
        for name, ask in (
            ("read", lambda fs, p: fs.read(p, 8192)),
            ("read nofollow", lambda fs, p: fs.read(p, 8192, follow=False)),
            ("read 3", lambda fs, p: fs.read(p, 3)),
            ("text", lambda fs, p: fs.text(p, 8192)),
            ("text 2", lambda fs, p: fs.text(p, 2)),
            ("texts", lambda fs, p: _each(fs.texts(p, ["a", "b", "x", "0", "."], 8192))),
            ("listdir", lambda fs, p: sorted(fs.listdir(p))),
            ("scandir", _entries),
            ("readlink", lambda fs, p: fs.readlink(p)),
            ("realpath", lambda fs, p: os.path.relpath(fs.realpath(p), roots[fs])),
            ("islink", lambda fs, p: fs.islink(p)),
            ("lexists", lambda fs, p: fs.lexists(p)),
            ("exists", lambda fs, p: fs.exists(p)),
            ("isdir", lambda fs, p: fs.isdir(p)),
        ):
            on_disk = _answer(ask, DISK, d)
            in_memory = _answer(ask, memory, m)
            assert in_memory == on_disk, (name, rel)
        compared += 1
    return compared


def _around(tree: Tree, rng: random.Random) -> list[str]:
    """Every entry, and paths around them a reader might ask."""
    paths = [p for p in tree.kind if p]
    extra = []
    for p in paths:
        extra.append(f"{p}/x")
        if rng.random() < 0.3:
            extra += [f"{p}/..", f"{p}/.", f"{p}/", f"{p}/x/y"]
        if tree.kind[p] == "link":
            extra.append(os.path.normpath(os.path.join(os.path.dirname(p), tree.content[p])))
    return paths + extra + ["", "missing", "sys/missing/deeper"]


def _one_by_one(entries) -> Tree:
    """The tree laid out entry by entry, never all at once."""
    return Tree(entries, at_once=False)


def _laid_out(tree: Tree) -> tuple:
    return tree.kind, tree.children, tree.content


def test_the_captured_host_reads_the_same_from_memory_as_from_disk(tmp_path):
    with gzip.open(require_capture(HOST)) as f:
        entries = json.load(f)["sysfs"]
    tree = Tree(entries)
    assert _laid_out(tree) == _laid_out(_one_by_one(entries))
    tree.build(str(tmp_path))
    paths = _around(tree, random.Random(7))
    assert _same(tree, str(tmp_path), paths) > 12_000


def _random_entries(rng: random.Random) -> list[dict]:
    names = ["a", "b", "c", "d"]
    entries: list[dict] = []
    made: list[str] = []
    kinds: dict[str, str] = {}
    for _ in range(rng.randint(3, 25)):
        depth = rng.randint(1, 4)
        path = "/".join(rng.choice(names) for _ in range(depth))
        kind = rng.choice(["dir", "text", "bytes", "link", "link", "link", "unreadable"])
        parts = path.split("/")
        above = ["/".join(parts[:i]) for i in range(1, depth)]
        if path in kinds or any(kinds.get(p, "dir") != "dir" for p in above):
            continue  # given twice, or under a file: refused (test_snapshot_hostile's)
        if kind != "dir" and any(p.startswith(path + "/") for p in kinds):
            continue
        kinds.update({p: "dir" for p in above}, **{path: kind})
        if kind == "link":
            up = rng.randint(0, depth - 1) if rng.random() < 0.9 else depth
            target = "/".join([".."] * up + [rng.choice(names) for _ in range(rng.randint(0, 3))])
            if made and rng.random() < 0.4:
                target = os.path.relpath(rng.choice(made), os.path.dirname(path) or ".")
            entries.append({"path": path, "link": target or "."})
        elif kind == "text":
            entries.append({"path": path, "text": rng.choice(["1\n", "", "x" * 10, "é\n"])})
        elif kind == "bytes":
            entries.append({"path": path, "bytes": "/w=="})
        elif kind == "dir":
            entries.append({"path": path, "dir": True})
        else:
            entries.append({"path": path, "unreadable": 13})
        made.append(path)
    return entries


@pytest.mark.parametrize("seed", range(30))
def test_random_trees_read_the_same_from_memory_as_from_disk(tmp_path, seed):
    rng = random.Random(seed)
    accepted = 0
    for case in range(25):
        entries = _random_entries(rng)
        try:
            tree = Tree(entries)
        except SnapshotError as e:
            with pytest.raises(SnapshotError) as slow:
                _one_by_one(entries)
            assert str(slow.value) == str(e)
            continue  # refused before anything is read: test_snapshot_hostile's
        assert _laid_out(tree) == _laid_out(_one_by_one(entries))
        root = tmp_path / str(case)
        root.mkdir()
        tree.build(str(root))
        _same(tree, str(root), _around(tree, rng))
        accepted += 1
    assert accepted >= 5
