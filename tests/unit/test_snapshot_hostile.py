"""A snapshot is untrusted input: whatever a file holds, replaying it writes, reads and leaves
nothing outside its own tree, within stated limits, and every failure is exit 7, not 70.

The property test builds random hostile snapshots (directory, text and link entries; links
inside, outside, absolute, through `..`, to directories, chained, duplicated paths) on top of
the captured testbed host and runs the read-only commands on each, with a canary directory
beside the replay's scratch directory: the canary never changes, no host file's content
appears in the output, no tree is left, the exit is a documented one."""

from __future__ import annotations

import builtins
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ibtool.errors import ExitCode
from ibtool.plugin import found
from ibtool.snapshot import save as snapshot
from tests.fixtures import captured_kernel
from tests.fixtures.peak import PEAK
from tests.fixtures.sysfs_trees import require_capture

REPO = Path(__file__).resolve().parents[2]
CAPTURED = captured_kernel.CAPTURED / "snapshot" / "host.json.gz"
DEVICE = "sys/devices/virtual/infiniband/rxe0"
SECRET = "canary-5f0d1c-do-not-show"
DOCUMENTED = {ExitCode.OK, ExitCode.FAILED, ExitCode.NO_DEVICES, ExitCode.NOT_FOUND}
DOCUMENTED |= {ExitCode.DATA_ERROR}
COMMANDS = (["dev", "-d"], ["port"], ["-j", "gids"], ["counters"], ["-d", "topo"])


def _base() -> dict:
    """The captured testbed host, rxe0 only and its first GID slots: ~100 sysfs entries."""
    with gzip.open(require_capture(CAPTURED)) as f:
        data = json.load(f)
    slot = re.compile(r"/(gids|types|ndevs)/(\d+)$")
    data["sysfs"] = [
        e
        for e in data["sysfs"]
        if "rxe1" not in e["path"] and not (slot.search(e["path"]) and int(e["path"][-1:]) > 3)
    ]
    return data


@pytest.fixture(scope="module")
def base() -> dict:
    return _base()


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A scratch directory for replayed trees (TMPDIR) with a canary directory beside it."""
    scratch = tmp_path / "scratch"
    canary = tmp_path / "canary"
    scratch.mkdir()
    (canary / "sub").mkdir(parents=True)
    (canary / "secret").write_text(SECRET + "\n")
    (canary / "sub" / "node_desc").write_text(SECRET + "\n")
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch, canary


def _checksum(directory: Path) -> dict[str, str]:
    sums = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(directory))
            if path.is_symlink():
                sums[rel] = "link " + os.readlink(path)
            elif path.is_file():
                sums[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                sums[rel] = "dir"
    return sums


def _write(path: Path, data: dict) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def _with(base: dict, *entries: dict) -> dict:
    return {**base, "sysfs": [*base["sysfs"], *entries]}


# -- the attacks found, one by one ------------------------------------------------------------

NODE_DESC = f"{DEVICE}/node_desc"


def _outside(canary: Path, at: str) -> str:
    """A link target from the entry `at` to the canary, relative: the tree sits at
    scratch/ibtool-snapshot-*/, two levels below the canary's parent."""
    return "../" * (at.count("/") + 2) + canary.name


@pytest.mark.parametrize(
    "attack",
    [
        "link to a file outside, then a text entry of the same path",
        "link to a directory outside, then entries under it",
        "a host file read through a link",
        "an absolute link",
        "a chain of links inside that climbs out",
        "a path through ..",
        "a loop of links",
    ],
)
def test_a_hostile_snapshot_is_refused_before_anything_is_written(cli, base, place, attack):
    scratch, canary = place
    before = _checksum(canary.parent / "canary")
    at = f"{DEVICE}/evil"
    entries = {
        "link to a file outside, then a text entry of the same path": [
            {"path": at, "link": _outside(canary, at) + "/secret"},
            {"path": at, "text": "PWNED"},
        ],
        "link to a directory outside, then entries under it": [
            {"path": at, "link": _outside(canary, at)},
            {"path": f"{at}/new", "dir": True},
            {"path": f"{at}/secret", "text": "PWNED"},
        ],
        "a host file read through a link": [
            {"path": NODE_DESC + "x", "link": _outside(canary, NODE_DESC) + "/secret"},
        ],
        "an absolute link": [{"path": at, "link": str(canary / "secret")}],
        # Each link alone stays inside; followed as the kernel does, the second climbs out.
        "a chain of links inside that climbs out": [
            {"path": "sys/a/b/up", "link": ".."},
            {"path": "sys/m", "link": "a/b/up/../../../" + canary.name},
        ],
        "a path through ..": [{"path": f"{DEVICE}/../../../../../canary/x", "text": "PWNED"}],
        "a loop of links": [
            {"path": "sys/l1", "link": "l2/x"},
            {"path": "sys/l2", "link": "l1/y"},
        ],
    }[attack]
    path = _write(canary.parent / "s.json", _with(base, *entries))
    r = cli("--snapshot", path, "-d", "dev")
    assert r.code == ExitCode.DATA_ERROR, r
    assert r.err.count("\n") == 1 and "Traceback" not in r.err
    assert SECRET not in r.out + r.err
    assert _checksum(canary.parent / "canary") == before
    assert os.listdir(scratch) == []


def test_a_link_that_stays_inside_the_tree_is_followed_as_it_was(cli, base, place):
    """sysfs is made of relative links (class/infiniband/DEV -> ../../devices/...): a replay
    keeps them."""
    _, canary = place
    path = _write(canary.parent / "s.json", base)
    r = cli("--snapshot", path, "dev")
    assert r.code == 0 and r.out.startswith("rxe0: node_type ca"), r


def test_an_entry_given_twice_with_another_kind_is_refused(cli, base, place):
    _, canary = place
    twice = [{"path": NODE_DESC, "link": "node_guid"}]
    r = cli("--snapshot", _write(canary.parent / "s.json", _with(base, *twice)), "dev")
    assert r.code == ExitCode.DATA_ERROR and "is given twice" in r.err, r


@pytest.mark.parametrize(
    "change, said",
    [
        ({"features": [{"bogus": 1}]}, "its 'features' are malformed"),
        ({"sysfs": [{"path": "sys/x", "text": 5}]}, "has a malformed 'text'"),
        ({"sysfs": [{"path": 5, "dir": True}]}, "is not an object with a path"),
        ({"sysfs": [{"path": "sys/x", "bytes": "!!"}]}, "is not base64"),
        ({"sysfs": [{"path": "sys/x", "dir": True, "text": "x"}]}, "not a directory, a file"),
        ({"netlink": {"k": {"error": {"message": 5}}}}, "a netlink answer is malformed"),
        ({"comm": {"1": ["x"]}}, "the name of process"),
        ({"version": "1"}, "its format version is '1', not a number from 1"),
        ({"version": True}, "its format version is True"),
    ],
)
def test_an_entry_of_the_wrong_type_is_exit_7_and_leaves_nothing(cli, base, place, change, said):
    scratch, canary = place
    r = cli("--snapshot", _write(canary.parent / "s.json", {**base, **change}), "dev")
    assert r.code == ExitCode.DATA_ERROR and said in r.err, r
    assert os.listdir(scratch) == []


def test_an_answer_a_command_cannot_use_is_exit_7_not_70(cli, base, place):
    scratch, canary = place
    netlink = {k: {"value": {"not": "a list"}} for k in base["netlink"]}
    r = cli("--snapshot", _write(canary.parent / "s.json", {**base, "netlink": netlink}), "res")
    assert r.code == ExitCode.DATA_ERROR and "holds an answer ibtool cannot use" in r.err, r
    assert os.listdir(scratch) == []


@pytest.mark.parametrize("name", ["/dev/zero", "fifo", "directory"])
def test_a_file_that_is_not_regular_is_refused_at_once(cli, tmp_path, name):
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "f"), "directory": str(tmp_path)}
    if name == "fifo":
        os.mkfifo(path[name])  # no writer: a plain open() would wait for ever
    r = cli("--snapshot", path[name], "port")
    assert r.code == ExitCode.DATA_ERROR, r
    assert ("is a directory" if name == "directory" else "is not a regular file") in r.err


# -- limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limit, setting, said",
    [
        ("size", "size=1K", "is larger than the limit of 1,024 bytes"),
        ("expanded", "expanded=1K", "expands past the limit of 1,024 bytes"),
        ("entries", "entries=50", "holds more than the limit of 50 JSON objects"),
        ("path", "path=40", "is longer than the limit of 40 bytes"),
        ("depth", "depth=5", "is deeper than the limit of 5 directory levels"),
    ],
)
def test_over_a_limit_is_exit_7_naming_it_and_the_flag_raises_it(
    cli, base, place, limit, setting, said
):
    _, canary = place
    path = canary.parent / "s.json.gz"
    path.write_bytes(gzip.compress(json.dumps(base).encode()))
    r = cli("--snapshot-limit", setting, "--snapshot", str(path), "dev")
    assert r.code == ExitCode.DATA_ERROR and said in r.err, r
    assert f"--snapshot-limit {limit}=N raises the limit" in r.err
    assert cli("--snapshot", str(path), "dev").code == 0


def test_the_defaults_hold_the_largest_host_measured():
    """500 SR-IOV VFs: 116 KB compressed, 3.4 MB of JSON, 28,348 entries, 115-byte paths."""
    limits = snapshot.DEFAULT
    assert limits.size > 100 * 119_000 and limits.expanded > 10 * 3_400_000
    assert limits.entries > 10 * 28_348 and limits.depth >= 2 * 12 and limits.path >= 4096


def test_a_bad_limit_setting_is_a_usage_error(cli):
    r = cli("--snapshot-limit", "bogus=1", "--snapshot", "x", "dev")
    assert r.code == ExitCode.USAGE and "size, expanded, entries, path, depth" in r.err


def _bomb(path: Path, gigabytes: int = 1) -> None:
    """A gzip file of ~1 MB holding 1 GB: one member of 1 MiB of spaces, repeated (gzip(1)
    reads concatenated members as one stream)."""
    member = gzip.compress(b" " * (1 << 20), compresslevel=9)
    with open(path, "wb") as f:
        for _ in range(1024 * gigabytes):
            f.write(member)


# Resident memory a refused bomb may cost, interpreter included. Measured: 26.9 MB peak for the
# 1 GB bomb (ibtool refusing a missing --root: 19.6 MB); ibtool at 1cdb6c5 took 2.1 GB.
BOMB_MEMORY = 64 << 20


def test_a_decompression_bomb_is_refused_within_a_stated_memory_bound(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    _bomb(bomb)
    assert bomb.stat().st_size < 2 << 20
    r = subprocess.run(
        [sys.executable, "-c", PEAK, "--snapshot", str(bomb), "port"],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == ExitCode.DATA_ERROR, r.stderr
    said, peak = r.stderr.splitlines()
    assert "expands past the limit of 64 MiB" in said
    assert int(peak.split()[1]) * 1024 < BOMB_MEMORY, peak
    assert sorted(os.listdir(tmp_path)) == ["bomb.json.gz"]


# -- saving ---------------------------------------------------------------------------------


def test_save_writes_nothing_through_a_planted_link(tmp_path, monkeypatch):
    """The old temporary name was PATH.tmp<pid>: a link planted there was followed."""
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    out = tmp_path / "s.json"
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        os.symlink(target, f"{out}.tmp{pid}")
    snapshot.write(str(out), {"format": snapshot.FORMAT})
    assert target.read_text() == "keep me\n"
    assert json.loads(out.read_text()) == {"format": snapshot.FORMAT}
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        ["victim", "s.json", *(f"s.json.tmp{p}" for p in range(os.getpid() - 2, os.getpid() + 3))]
    )


def test_save_that_fails_leaves_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "s.json.gz"

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(snapshot.IbtoolError, match="No space left on device"):
        snapshot.write(str(out), {"format": snapshot.FORMAT})
    assert list(tmp_path.iterdir()) == []


def test_save_to_a_directory_is_a_usage_error(cli, tmp_path):
    r = cli("snapshot", "save", str(tmp_path))
    assert r.code == ExitCode.USAGE and "a directory" in r.err, r


# -- what a file is, and what it shows ------------------------------------------------------


def test_show_says_what_a_file_is_without_building_it(cli, place):
    scratch, _ = place
    path = str(require_capture(CAPTURED))
    r = cli("snapshot", "show", path)
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert lines[0] == f"{path}: ibtool snapshot format 1, saved by ibtool 0.1.0"
    assert lines[1:] == [
        "host: virtme-ng",
        f"time: {lines[2][6:]}",
        "kernel: 6.1.0-56-amd64",
        "devices: 2 (rxe0, rxe1)",
        "sysfs entries: 6328",
        "netlink answers: 45",
        "verbs answers: 4",
        "processes: 5",
        "size: 23,360 bytes, 660,499 expanded",
    ]
    j = cli("-j", "snapshot", "show", path).json
    assert (j["host"], j["devices"], j["sysfs_entries"]) == ("virtme-ng", ["rxe0", "rxe1"], 6328)
    assert os.listdir(scratch) == []


def test_show_escapes_what_a_terminal_would_obey(cli, base, place):
    _, canary = place
    hostile = {**base, "host": "evil\x1b]0;owned\x07", "kernel": "6.1\r\nfake line"}
    r = cli("snapshot", "show", _write(canary.parent / "s.json", hostile))
    assert "\x1b" not in r.out and "\r" not in r.out
    assert "host: evil\\x1b]0;owned\\x07" in r.out and "kernel: 6.1\\r\\nfake line" in r.out


def test_no_devices_names_the_snapshot_not_its_temporary_tree(cli, base, place):
    _, canary = place
    empty = {**base, "sysfs": [{"path": "sys/class/infiniband", "dir": True}]}
    path = _write(canary.parent / "s.json", empty)
    r = cli("--snapshot", path, "port")
    assert r.code == ExitCode.NO_DEVICES, r
    assert (
        r.err == f"ibtool: error: no RDMA devices (empty snapshot {path}: sys/class/infiniband)\n"
    )


def test_a_port_s_objects_are_the_device_dump_s_objects_of_that_port(cli):
    path = str(require_capture(CAPTURED))
    device = cli("-j", "--snapshot", path, "res", "qp", "rxe0").json
    port = cli("-j", "--snapshot", path, "res", "qp", "rxe0/1").json
    assert port == [q for q in device if q.get("port") == 1] and len(port) == 7


EVERY_READ = (["dev", "-d"], ["port", "-d"], ["-j", "gids"], ["counters"], ["res"],
              ["system"], ["health"], ["doctor", "--no-probe"], ["topo"],
              ["-j", "topo", "--nccl"])  # fmt: skip


def test_a_replay_asks_the_disk_nothing_of_its_tree_and_writes_nothing(cli, place, monkeypatch):
    """Every file of the tree is read from memory: no call reaches the disk for a path under
    the snapshot's root (the file's own path), and no file or directory is made."""
    scratch, canary = place
    path = str(shutil.copy(require_capture(CAPTURED), canary.parent / "host.json.gz"))
    under = f"{path}/"
    cache = found.cache_path(os.environ)  # the plugins' cache, ibtool's own and not the replay's
    cache = cache and os.path.dirname(cache)
    asked: list[tuple[str, str]] = []
    made: list[tuple[str, str]] = []

    def watched(module, name: str, writes: bool = False):
        real = getattr(module, name)

        def call(target, *args, **kwargs):
            if isinstance(target, (str, bytes, os.PathLike)):
                said = os.fsdecode(target)
                if said.startswith(under):
                    asked.append((name, said))
                if writes and not (cache and said.startswith(cache)):
                    made.append((name, said))
            return real(target, *args, **kwargs)

        monkeypatch.setattr(module, name, call)

    for name in ("open", "listdir", "scandir", "stat", "lstat", "readlink", "access"):
        watched(os, name)
    for name in ("mkdir", "symlink", "makedirs", "mkfifo"):
        watched(os, name, writes=True)
    watched(builtins, "open")
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(("mkdtemp", "")))
    for argv in EVERY_READ:
        r = cli("--snapshot", path, *argv)
        assert r.code in DOCUMENTED, (argv, r)
        assert "Traceback" not in r.err, r
    assert asked == [] and made == [], (asked, made)
    assert os.listdir(scratch) == []


# -- the property: random hostile snapshots --------------------------------------------------

CASES = 60


def _hostile(rng: random.Random, base: dict, canary: Path) -> list[dict]:
    existing = [e["path"] for e in base["sysfs"]]
    made: list[str] = []

    def a_path() -> str:
        choice = rng.random()
        if choice < 0.3:
            return f"{DEVICE}/" + rng.choice(["n1", "n2", "ports/1/n3", "n4/n5"])
        if choice < 0.45 or not made:
            return rng.choice(existing)
        if choice < 0.6:
            return rng.choice(made) + rng.choice(["", "/x", "/secret", "/sub/node_desc"])
        if choice < 0.7:
            return rng.choice(existing) + "/" + "../" * rng.randint(1, 12) + "canary/secret"
        if choice < 0.75:
            return str(canary / "secret")
        return f"{DEVICE}/" + rng.choice(["node_desc", "fw_ver", "ports/1/state", "new/deep"])

    def a_target(at: str) -> str:
        choice = rng.random()
        if choice < 0.2:
            return "../" * rng.randint(0, at.count("/") + 4) + rng.choice(
                ["canary", "canary/secret", "canary/sub", "canary/sub/node_desc", ""]
            )
        if choice < 0.3:
            return str(canary / rng.choice(["secret", "sub", "sub/node_desc"]))
        if choice < 0.6 and made:
            other = rng.choice(made)
            return os.path.relpath(other, os.path.dirname(at) or ".") + rng.choice(
                ["", "/..", "/../.."]
            )
        if choice < 0.8:
            return os.path.relpath(rng.choice(existing), os.path.dirname(at) or ".")
        return rng.choice([".", "..", "../..", "/", "/etc/passwd", "node_desc"])

    out = []
    for _ in range(rng.randint(1, 4)):
        at = a_path()
        kind = rng.choice(["link", "link", "text", "dir", "bytes"])
        if kind == "link":
            out.append({"path": at, "link": a_target(at)})
            made.append(at)
        elif kind == "text":
            out.append({"path": at, "text": "PWNED " + SECRET[::-1]})
        elif kind == "bytes":
            out.append({"path": at, "bytes": "UFdORUQ="})
        else:
            out.append({"path": at, "dir": True})
    return out


def test_no_hostile_snapshot_writes_reads_or_leaves_anything_outside_its_tree(cli, base, place):
    scratch, canary = place
    root = canary.parent
    before = _checksum(root / "canary")
    rng = random.Random(25)
    codes: dict[int, int] = {}
    for case in range(CASES):
        entries = _hostile(rng, base, canary)
        mixed = list(base["sysfs"])
        for e in entries:
            mixed.insert(rng.randint(0, len(mixed)), e)
        path = _write(root / "s.json", {**base, "sysfs": mixed})
        for argv in COMMANDS[case % 2 :: 2]:
            r = cli("--snapshot", path, *argv)
            codes[r.code] = codes.get(r.code, 0) + 1
            assert r.code in DOCUMENTED, (case, entries, argv, r)
            assert SECRET not in r.out + r.err and "root:x:0:0" not in r.out, (case, entries)
            assert "Traceback" not in r.err
            assert os.listdir(scratch) == [], (case, entries)
        assert _checksum(root / "canary") == before, (case, entries)
    print(codes)
    # Both ends were reached: files refused, and files replayed.
    assert codes.get(ExitCode.DATA_ERROR, 0) > 15 and codes.get(ExitCode.OK, 0) > 15, codes


# -- interrupted replays ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vf500(tmp_path_factory, sriov_500_vfs) -> str:
    """The largest host measured: an mlx5 PF with 500 RoCE VFs (28,348 sysfs entries), the
    session's tree (tests/unit/conftest.py), saved once."""
    from ibtool.errors import IbtoolError

    def no_kernel():
        raise IbtoolError("no kernel here")

    path = str(tmp_path_factory.mktemp("vf500") / "vf500.json.gz")
    snapshot.save(
        path,
        lambda m: None,
        "test",
        root=str(sriov_500_vfs.root),
        open_netlink=no_kernel,
        open_verbs=no_kernel,
    )
    return path


TRIES = 8


def _without_importlibs_own(err: bytes) -> bytes:
    """stderr without what CPython itself prints when a Ctrl-C lands in its import lock's
    clean-up (importlib._bootstrap _get_module_lock's weakref callback: "Exception ignored
    in: ... KeyboardInterrupt"), which no program can catch; the process still exits 130."""
    import re

    return re.sub(
        rb"Exception ignored in: <function _get_module_lock\.<locals>\.cb at 0x[0-9a-f]+>\n"
        rb"Traceback \(most recent call last\):\n(?:  .*\n)*KeyboardInterrupt: ?\n",
        b"",
        err,
    )


def test_ctrl_c_or_sigterm_at_any_moment_of_a_replay_leaves_nothing(tmp_path, vf500):
    import signal
    import time

    rng = random.Random(143)
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    # The window the signals fall in is measured on this machine first, as it is loaded now:
    # from the bare interpreter's start (a signal before it lands in CPython's own start-up,
    # which ibtool has no part in) to the end of a whole replay.
    def took(*argv: str) -> float:
        started = time.monotonic()
        subprocess.run([sys.executable, *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                       check=True, timeout=120)  # fmt: skip
        return time.monotonic() - started

    interpreter = took("-c", "pass")
    window = max(took("-m", "ibtool", "--snapshot", vf500, "-j", "gids"), interpreter)
    seen = []
    for attempt in range(TRIES):
        sig = (signal.SIGINT, signal.SIGTERM)[attempt % 2]
        child = subprocess.Popen(
            [sys.executable, "-m", "ibtool", "--snapshot", vf500, "-j", "gids"],
            cwd=REPO,
            env={**os.environ, "TMPDIR": str(scratch)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # SIGINT as a terminal delivers it, not ignored
        )
        # The random delay is what is under test: a signal at a moment nothing announces
        # (loading, parsing, checking the tree, reading it, printing).
        time.sleep(rng.uniform(interpreter, window))
        child.send_signal(sig)
        _, err = child.communicate(timeout=120)
        seen.append(child.returncode)
        assert child.returncode in (0, 128 + sig, -sig), (sig, child.returncode, err)
        assert b"Traceback" not in _without_importlibs_own(err), err
        assert os.listdir(scratch) == [], (attempt, sig, child.returncode)
    assert any(code in (130, 143) for code in seen), seen  # some signals landed mid-replay
