"""`ibtool snapshot`: a snapshot of the captured testbed host (rxe0 and rxe1: their sysfs tree,
the kernel's netlink answers, the processes holding their objects) replays every read-only
command with the output it had live; damaged and newer files are one error; `snapshot diff`
says what changed."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ibtool.errors import ExitCode, IbtoolError
from ibtool.host import Host
from ibtool.snapshot import replay
from ibtool.snapshot import save as snapshot
from ibtool.sources.netlink import NldevClient
from ibtool.sources.sysfs.infiniband import SysfsSource
from tests.fixtures import captured_kernel
from tests.fixtures.netlink import FakeKernel
from tests.fixtures.sysfs_trees import require_capture
from tests.unit.conftest import Result, run_cli

RELEASE = "6.1.0-28-amd64"


def no_verbs():
    raise IbtoolError("pyverbs is not installed", "apt install python3-pyverbs")


def captured_netlink() -> NldevClient:
    return NldevClient(sock=FakeKernel(captured_kernel.answer))


class Captured:
    """The captured host as the running one, its sysfs a copy at `where`/tree: `ibtool(ARGV)`
    runs a command on it (or on a --snapshot given), `save(NAME)` snapshots it into `where`."""

    def __init__(self, where: Path):
        self.where = where
        self.tree = where / "tree"
        shutil.copytree(captured_kernel.TREE, self.tree, symlinks=True)

    def host(self, inv) -> Host:
        """cli.main's host_factory: the running host's sources are the capture's."""
        return Host(
            warn=inv.warn,
            details=inv.details,
            sysfs=SysfsSource(str(self.tree), inv.warn),
            netlink=captured_netlink,
            verbs=no_verbs,
            release=RELEASE,
            comm=captured_kernel.COMM.get,
        )

    def ibtool(self, *argv: str) -> Result:
        return run_cli(list(argv), host_factory=self.host)

    def save(self, name: str = "host.json") -> str:
        path = str(self.where / name)
        snapshot.save(
            path,
            lambda message: None,
            "test",
            root=str(self.tree),
            open_netlink=captured_netlink,
            open_verbs=no_verbs,
            release=RELEASE,
            comm=captured_kernel.COMM.get,
        )
        return path


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Captured:
    """One capture for the module's tests that only read it and its snapshot."""
    return Captured(tmp_path_factory.mktemp("captured"))


@pytest.fixture(scope="module")
def saved(captured) -> str:
    """The module's one snapshot of the captured host."""
    return captured.save()


@pytest.fixture
def live(tmp_path) -> Captured:
    """A capture of the test's own, for a test that changes its tree."""
    return Captured(tmp_path)


READ_ONLY = [
    ["dev"],
    ["-j", "dev"],
    ["-d", "dev"],
    ["-d", "-j", "port"],
    ["port", "rxe1/1"],
    ["gids"],
    ["-j", "gids", "--best"],
    ["counters"],
    ["-j", "counters", "rxe0"],
    ["-j", "counters", "--errors"],
    ["res"],
    ["-j", "res"],
    ["res", "qp"],
    ["-j", "res", "qp", "rxe1", "lqpn", "1-100"],
    ["-d", "-j", "res", "qp"],
    ["res", "cm_id"],
    ["-j", "res", "cq"],
    ["res", "mr", "rxe0"],
    ["-j", "res", "pd"],
    ["res", "ctx"],
    ["-j", "res", "srq"],
    ["res", "qp", "comm", "python3"],
    ["system"],
    ["-j", "system"],
    ["-d", "system"],
    ["counters", "optional"],
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=[" ".join(a) for a in READ_ONLY])
def test_every_read_only_command_says_on_the_snapshot_what_it_said_live(captured, saved, argv):
    was = captured.ibtool(*argv)
    assert was.code in (0, ExitCode.UNSUPPORTED), was  # the captured kernel answers it
    now = captured.ibtool("--snapshot", saved, *argv)
    assert (now.code, now.out, now.err) == (was.code, was.out, was.err)


def test_a_compressed_snapshot_is_the_same(captured):
    path = captured.save("host.json.gz")
    with open(path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    replayed = captured.ibtool("--snapshot", path, "-j", "res", "qp").out
    assert replayed == captured.ibtool("-j", "res", "qp").out


def test_the_file_holds_what_it_says(saved):
    with open(saved) as f:
        data = json.load(f)
    assert (data["format"], data["version"], data["kernel"]) == ("ibtool-snapshot", 1, RELEASE)
    assert {"host", "time", "ibtool", "sysfs", "netlink", "verbs", "comm"} <= set(data)
    paths = {e["path"] for e in data["sysfs"]}
    assert "sys/class/infiniband/rxe0" in paths
    assert "proc/net/vlan/config" in paths


@pytest.mark.parametrize(
    "argv",
    [
        ["link", "add", "rxe9", "type", "rxe", "netdev", "veth0"],
        ["link", "delete", "rxe0"],
        ["system", "set", "netns", "shared"],
        ["counters", "enable", "rxe0/1", "x"],
        ["loopback"],
        ["ping", "--server"],
        ["snapshot", "save", "/dev/null"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_what_needs_the_running_kernel_is_refused_on_a_snapshot(captured, saved, argv):
    r = captured.ibtool("--snapshot", saved, *argv)
    assert r.code == ExitCode.USAGE, r
    assert r.err.count("\n") == 1 and r.err.startswith("ibtool: error: ")


def damaged(tmp_path, text: bytes) -> str:
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    return str(path)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{"format": "ibtool-snapshot", "version": 1, "sysfs": [', "damaged"),
        (gzip.compress(b"{}")[:-4], "damaged"),
        (b'{"format": "something else"}', "is not an ibtool snapshot"),
        (b"[1, 2]", "is not an ibtool snapshot"),
        (b'{"format": "ibtool-snapshot", "version": 1}', "is damaged: its 'sysfs'"),
        (
            b'{"format": "ibtool-snapshot", "version": 1, "sysfs": [{"path": "../../etc/x",'
            b' "text": ""}], "netlink": {}, "verbs": {}, "comm": {}}',
            "outside its tree",
        ),
    ],
    ids=["truncated", "truncated-gzip", "other-format", "not-an-object", "no-tree", "escape"],
)
def test_a_damaged_snapshot_is_one_line_and_exit_7(cli, tmp_path, content, said):
    r = cli("--snapshot", damaged(tmp_path, content), "dev")
    assert r.code == ExitCode.DATA_ERROR, r
    assert r.err.count("\n") == 1 and said in r.err, r.err


def test_a_snapshot_of_a_newer_format_says_which_ibtool_reads_it(cli, tmp_path):
    newer = b'{"format": "ibtool-snapshot", "version": 99, "ibtool": "9.0"}'
    r = cli("--snapshot", damaged(tmp_path, newer), "dev")
    assert r.code == ExitCode.DATA_ERROR
    assert r.err == (
        f"ibtool: error: {tmp_path}/bad.json is a snapshot of format 99; this ibtool reads "
        "format 1 and older (hint: read it with the ibtool that saved it (9.0) or newer)\n"
    )


def test_a_missing_snapshot_is_not_found(cli, tmp_path):
    r = cli("--snapshot", str(tmp_path / "none.json"), "dev")
    assert (r.code, r.err.count("\n")) == (ExitCode.NOT_FOUND, 1)


def test_root_and_snapshot_together_are_a_usage_error(cli, saved, tmp_path):
    r = cli("--root", str(tmp_path), "--snapshot", saved, "dev")
    assert r.code == ExitCode.USAGE and "--root and --snapshot" in r.err


# -- diff ---------------------------------------------------------------------------------------


def test_diff_of_a_snapshot_with_itself_says_nothing_changed(cli, saved):
    a = saved
    r = cli("snapshot", "diff", a, a)
    assert r.code == 0, r
    assert r.out.splitlines()[1:] == []
    j = cli("-j", "snapshot", "diff", a, a).json
    assert (j["events"], j["counters"], j["objects"], j["gids_added"]) == ([], [], [], [])


def test_diff_shows_counter_deltas_resets_and_gids(cli, live):
    a = live.save("a.json")
    port = live.tree / "sys/devices/virtual/infiniband/rxe0/ports/1"
    before = {s["counter"]: s["value"] for s in live.ibtool("-j", "counters", "rxe0/1").json}
    (port / "hw_counters/rcvd_pkts").write_text(f"{before['rcvd_pkts'] + 500}\n")
    (port / "hw_counters/sent_pkts").write_text("0\n")  # a driver reload: it starts over
    gid = port / "gids/1"
    old_gid = gid.read_text().strip()
    gid.write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    b = live.save("b.json")
    j = cli("-j", "snapshot", "diff", a, b).json
    counters = {c["counter"]: c for c in j["counters"]}
    assert (counters["rcvd_pkts"]["delta"], counters["rcvd_pkts"]["note"]) == (500, None)
    assert counters["rcvd_pkts"]["before"] == before["rcvd_pkts"]
    if before["sent_pkts"]:
        assert (counters["sent_pkts"]["delta"], counters["sent_pkts"]["note"]) == (None, "reset")
    assert set(counters) <= {"rcvd_pkts", "sent_pkts"}
    assert [(g["ifname"], g["port"], g["index"], g["gid"]) for g in j["gids_removed"]] == [
        ("rxe0", 1, 1, old_gid)
    ]
    assert j["gids_added"] == [] and j["events"] == []
    text = cli("snapshot", "diff", a, b)
    assert text.code == 0, text
    assert f"gid - rxe0/1 1 {old_gid} " in text.out
    assert any(
        line.startswith("rxe0") and "rcvd_pkts" in line and " 500 " in line
        for line in text.out.splitlines()
    ), text.out


def test_a_recorded_answer_keeps_its_key_order_through_the_file(tmp_path):
    calls = {}
    caps = {"vendor_id": "0xffffff", "max_qp": 7, "atomic_caps": "HCA"}
    replay.Recorder(type("V", (), {"device_caps": lambda self, name: caps})(), calls).device_caps(
        "rxe0"
    )
    snapshot.write(str(tmp_path / "s.json"), {"calls": calls})
    with open(tmp_path / "s.json") as f:
        again = json.load(f)["calls"]
    replayed = replay.Replay(again, "verbs", "s.json").device_caps("rxe0")
    assert list(replayed.items()) == list(caps.items())


def test_a_dump_asked_for_on_one_port_is_the_recorded_device_dump_of_that_port():
    calls = {}
    dump = [
        {"RDMA_NLDEV_ATTR_RES_LQPN": 1},  # not bound to a port yet: left out
        {"RDMA_NLDEV_ATTR_RES_LQPN": 17, "RDMA_NLDEV_ATTR_PORT_INDEX": 1},
        {"RDMA_NLDEV_ATTR_RES_LQPN": 18, "RDMA_NLDEV_ATTR_PORT_INDEX": 2},
    ]
    recorder = replay.Recorder(type("K", (), {"resource_dump": lambda *a, **k: dump})(), calls)
    recorder.resource_dump("qp", 3, None, driver_details=False)
    replayed = replay.Replay(calls, "RDMA netlink", "x.json")
    assert replayed.resource_dump("qp", 3, 2, driver_details=False) == [dump[2]]
    with pytest.raises(
        replay.SnapshotError,
        match=r"holds no RDMA netlink answer to "
        r"resource_dump\('qp', 4, None, driver_details=False\)",
    ):
        replayed.resource_dump("qp", 4, None, driver_details=False)


def test_snapshot_save_and_diff_usage(cli):
    for argv in (["snapshot"], ["snapshot", "save"], ["snapshot", "diff", "a"]):
        r = cli(*argv)
        assert r.code == ExitCode.USAGE and r.err.count("\n") == 1, (argv, r)


# -- a snapshot saved in the testbed, read on this host (no RDMA device here) -------------------

TESTBED = captured_kernel.CAPTURED / "snapshot"


def test_a_testbed_snapshot_replays_here_as_the_commands_ran_there(cli):
    """tests/fixtures/captured/snapshot: saved by the integration suite (test_res.py) while the
    resource holder and perftest held objects, with what each command printed live just before
    and just after it. Read here, where no RDMA device exists."""
    path = require_capture(TESTBED / "host.json.gz")
    with open(require_capture(TESTBED / "live.json")) as f:
        shown = json.load(f)
    assert len(shown) >= 10
    for command in shown:
        _replays(cli, str(path), command)


def _replays(cli, path: str, shown: dict) -> None:
    got = cli("--snapshot", path, *shown["argv"])
    before, after = tuple(shown["before"]), tuple(shown["after"])
    if shown["argv"] == ["-j", "counters"]:
        assert (got.code, got.err) == (before[0], before[2])

        def values(text: str) -> dict:
            return {
                (r["ifname"], r.get("port"), r["counter"]): r["value"] for r in json.loads(text)
            }

        low, mine, high = values(before[1]), values(got.out), values(after[1])
        assert set(mine) == set(low) == set(high)
        for key, value in mine.items():
            assert value == low[key] is None or low[key] <= value <= high[key], key
        return
    assert (got.code, got.out, got.err) in (before, after), shown["argv"]
