"""`ibtool res` on the live kernel against iproute2's `rdma res show`, while ibtool's own QPs (a
long loopback), perftest's (ib_write_bw between two processes on rxe0), an idle holder of every
object type (tests/testbed/res_holder.py) and an rping server's CM ID are alive.

Once their objects are up, the traffic processes are stopped (SIGSTOP: under TCG their busy
polling left the commands under test a fraction of the 2 vCPUs) and resumed only to be ended.
Each ibtool listing is still taken between two rdma listings, in case the kernel moves
anything meanwhile: an object both rdma snapshots show must be in ibtool's, every field rdma saw
unchanged must be equal, a PSN that moved must lie between the two, and any other field that
changed must be one of the two values.

Snapshots too: `ibtool --snapshot` replays every read-only command as it ran live around the
moment of `snapshot save`, and `snapshot diff` shows the counter deltas `rdma statistic` shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.running import wait_listening

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
IDENTITY = {
    "qp": "lqpn",
    "cm_id": "cm-idn",
    "cq": "cqn",
    "mr": "mrn",
    "pd": "pdn",
    "ctx": "ctxn",
    "srq": "srqn",
}
PSNS = ("sq-psn", "rq-psn")
# iproute2 names enum ib_poll_context as it was before Linux 5.8 (reference, section 1.5).
RDMA_POLL_CTX = ["DIRECT", "SOFTIRQ", "WORKQUEUE", "UNBOUND_WORKQUEUE"]
KERNEL_POLL_CTX = ["SOFTIRQ", "WORKQUEUE", "UNBOUND_WORKQUEUE", "DIRECT"]


def rdma(*args: str) -> list[dict]:
    out = subprocess.run(
        ["rdma", "-j", "res", "show", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return json.loads(out) if out.strip() else []


def ibtool(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def ibtool_json(*args: str) -> list[dict]:
    return json.loads(ibtool("-j", "res", *args).stdout)


def _rdma_cq(obj: dict) -> dict:
    if "poll-ctx" in obj:
        obj = {**obj, "poll-ctx": KERNEL_POLL_CTX[RDMA_POLL_CTX.index(obj["poll-ctx"])]}
    return obj


def keyed(kind: str, objects: list[dict]) -> dict:
    if kind == "cq":
        objects = [_rdma_cq(o) for o in objects]
    return {(o["ifindex"], o[IDENTITY[kind]]): o for o in objects}


def _between(value: int, first: int, last: int) -> bool:
    # PSNs are 24-bit and wrap
    span = (last - first) % (1 << 24)
    return (value - first) % (1 << 24) <= span


def assert_same_moment(kind: str, before: list, ours: list, after: list) -> int:
    """ibtool's objects against the two rdma snapshots around it; the number compared."""
    before, after = keyed(kind, before), keyed(kind, after)
    ours_by_key = {(o["ifindex"], o[IDENTITY[kind]]): o for o in ours}
    assert len(ours_by_key) == len(ours), "an object listed twice"
    assert set(ours_by_key) <= set(before) | set(after), "objects rdma never saw"
    stable = set(before) & set(after)
    assert stable <= set(ours_by_key), "objects rdma saw before and after are missing"
    for key in stable:
        b, o, a = before[key], ours_by_key[key], after[key]
        if b == a:
            assert o == b, key
            continue
        assert set(o) <= set(b) | set(a), key
        for field in set(b) | set(a) | set(o):
            if b.get(field) == a.get(field):
                assert o.get(field) == b.get(field), (key, field)
            elif field in PSNS and None not in (b.get(field), a.get(field), o.get(field)):
                assert _between(o[field], b[field], a[field]), (key, field, b, o, a)
            else:
                assert o.get(field) in (b.get(field), a.get(field)), (key, field)
    return len(stable)


def _wait(condition, what: str, procs, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for p in procs:
            assert p.poll() is None, f"{p.args[0]} exited early while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def live(testbed):
    """The processes holding objects, and the holder's pid and QP numbers."""
    device, ip = testbed["device"], testbed["ipv4"]
    gid = testbed["ipv4_gid_index"]
    with contextlib.ExitStack() as stack:
        procs: list[subprocess.Popen] = []

        def start(*cmd: str, **kw) -> subprocess.Popen:
            kw.setdefault("stdout", subprocess.DEVNULL)
            proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, **kw)
            procs.append(proc)
            stack.callback(_stop, proc)
            return proc

        holder = start(
            sys.executable,
            str(REPO / "tests/testbed/res_holder.py"),
            device,
            "--rc",
            "3",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        info = json.loads(holder.stdout.readline())
        start("rping", "-s", "-a", ip, "-p", "7472")
        start(
            sys.executable, "-m", "ibtool", "loopback", device, "--iters", "1000000", "--ops",
            "send",
        )  # fmt: skip
        server = start("ib_write_bw", "-d", device, "-x", gid, "-D", "120", "-p", "18515")
        wait_listening(server, 18515)  # before its client connects
        start("ib_write_bw", "-d", device, "-x", gid, "-D", "120", "-p", "18515", ip)
        procs_alive = list(procs)

        def holders() -> set:
            return {q.get("comm") for q in rdma("qp")}

        _wait(lambda: "ib_write_bw" in holders(), "perftest QPs", procs_alive)
        _wait(lambda: len([q for q in rdma("qp") if q.get("pid") not in (None, info["pid"])
                           and q.get("comm") != "ib_write_bw"]) >= 1,
              "ibtool loopback QPs", procs_alive)  # fmt: skip
        _wait(lambda: any(c["state"] == "LISTEN" for c in rdma("cm_id")), "rping", procs_alive)
        # Their objects are up: stop the busy-polling traffic (SIGSTOP) so that the 2 vCPUs of
        # the TCG guest go to the commands under test (each took ~10 s while they spun). The
        # kernel objects stay; _stop sends SIGCONT before terminating them.
        for proc in procs_alive[2:]:
            proc.send_signal(signal.SIGSTOP)
        yield info


def _stop(proc: subprocess.Popen) -> None:
    if proc.stdin:
        proc.stdin.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("kind", ["qp", "cq", "mr", "pd", "ctx", "cm_id", "srq"])
def test_every_object_is_what_rdma_shows(live, kind):
    before, ours, after = rdma(kind), ibtool_json(kind), rdma(kind)
    compared = assert_same_moment(kind, before, ours, after)
    assert compared >= {"qp": 8, "cq": 3, "mr": 2, "pd": 4, "ctx": 3, "cm_id": 1, "srq": 1}[kind]
    if kind == "qp":
        holders = {q.get("comm") for q in ours}
        assert {"ib_write_bw", "ib_core"} <= holders, holders
        perftest = [q for q in ours if q.get("comm") == "ib_write_bw"]
        assert len(perftest) == 2 and {q["state"] for q in perftest} <= {"RTS", "RTR"}
        assert any(q.get("pid") == live["pid"] for q in ours)


def test_the_kernels_qps_are_shown_as_rdma_shows_them(live):
    ours = ibtool_json("qp")
    gsi = [q for q in ours if q["type"] == "GSI"]
    assert gsi and all("pid" not in q and q["comm"] == "ib_core" for q in gsi)
    text = ibtool("res", "qp", "comm", "ib_core").stdout
    assert "[ib_core]" in text and "ib_write_bw" not in text


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("qp", ["type", "RC", "state", "RESET"]),
        ("qp", ["lqpn", "{rc_init}"]),
        ("qp", ["pid", "{pid}"]),
        ("qp", ["link", "{device}/1", "pid", "{pid}"]),
        ("qp", ["state", "INIT,RTS", "pid", "{pid}"]),
        ("cq", ["pid", "{pid}"]),
        ("mr", ["pid", "{pid}"]),
        ("pd", ["pid", "{pid}"]),
        ("ctx", ["pid", "{pid}"]),
        ("srq", ["pid", "{pid}"]),
        ("srq", ["lqpn", "{rc_srq}"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_filters_agree_with_rdmas(live, testbed, kind, words):
    values = {"pid": live["pid"], "device": testbed["device"], **live["lqpns"]}
    words = [w.format(**values) for w in words]
    # Only the idle holder's objects (or RESET QPs) match: nothing moves between the reads.
    theirs, ours = rdma(kind, *words), ibtool_json(kind, *words)
    if kind == "cq":
        theirs = [_rdma_cq(o) for o in theirs]
    assert ours == theirs
    assert ours, "the filter matched nothing: the comparison proves little"


def test_comm_filter_is_rdmas_list_by_name(live):
    theirs = [q for q in rdma("pd") if q.get("comm") == "ib_core"]
    assert theirs and ibtool_json("pd", "comm", "ib_core") == theirs


def test_summary_counts_are_rdmas(live):
    before, ours, after = rdma(), ibtool_json(), rdma()
    assert len(before) == len(ours) == len(after)
    for b, o, a in zip(before, ours, after):
        for key in set(b) | set(a):
            assert o.get(key) in (b.get(key), a.get(key)), key


def test_a_device_and_port_narrow_the_listing(live, testbed):
    peer = testbed["peer_device"]
    assert {q["ifname"] for q in ibtool_json("qp", peer)} == {peer}
    assert ibtool_json("qp", f"{peer}/1") == rdma("qp", "link", f"{peer}/1")
    proc = ibtool("res", "qp", f"{peer}/9", check=False)
    assert proc.returncode == 4 and "has no port 9" in proc.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv to drop root")
def test_without_cap_net_admin_keys_are_left_out_like_rdma(live):
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {**os.environ, "HOME": "/tmp"}

    def as_nobody(*cmd: str) -> list[dict]:
        out = subprocess.run(
            [*nobody, *cmd], capture_output=True, text=True, check=True, timeout=120, env=env
        ).stdout
        return json.loads(out)

    ours = as_nobody(sys.executable, "-m", "ibtool", "-j", "res", "mr", "pid", str(live["pid"]))
    theirs = as_nobody("rdma", "-j", "res", "show", "mr", "pid", str(live["pid"]))
    assert ours == theirs and ours
    assert all("rkey" not in m and "lkey" not in m for m in ours)


# -- snapshots: replayed against the live host at the same moment ------------------------------

SNAPSHOT_COMMANDS = [  # each run in-process two or three times: ~3 s a run under TCG
    ["-d", "-j", "dev"],
    ["-d", "-j", "port"],
    ["-j", "gids"],
    ["-j", "res"],
    ["-j", "res", "qp"],
    ["-j", "res", "qp", "rxe0/1"],  # the kernel's per-port dump, replayed from the device's
    ["-d", "-j", "res", "qp"],
    ["res", "cm_id"],
    ["-j", "res", "cq"],
    ["-j", "res", "mr"],
    ["-d", "-j", "system"],
    ["-j", "counters"],
]


def in_process(*argv: str) -> tuple[int, str, str]:
    """ibtool's main() in this process: the fresh-process floor under TCG is ~4 s a command."""
    import io

    from ibtool.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return int(code), out.getvalue(), err.getvalue()


def _counters_between(before: str, replayed: str, after: str) -> None:
    """Each counter of the snapshot lies between its live values before and after it."""
    key = lambda row: (row["ifname"], row.get("port"), row["source"], row["counter"])  # noqa: E731
    b, r, a = ({key(x): x for x in json.loads(t)} for t in (before, replayed, after))
    assert set(r) == set(b) == set(a)
    for k, row in r.items():
        lo, hi = b[k]["value"], a[k]["value"]
        assert lo is None and row["value"] is None or lo <= row["value"] <= hi, (k, lo, row, hi)


def test_a_snapshot_replays_what_every_read_only_command_showed_live(live, tmp_path):
    before = {tuple(c): in_process(*c) for c in SNAPSHOT_COMMANDS}
    path = str(tmp_path / "host.json.gz")
    code, out, err = in_process("snapshot", "save", path)
    assert (code, err) == (0, ""), err
    code, out, err = in_process("-j", "snapshot", "show", path)
    shown = json.loads(out)
    assert (shown["host"], shown["kernel"]) == (socket.gethostname(), platform.release()), out
    assert "rxe0" in shown["devices"] and shown["bytes"] == os.path.getsize(path)
    replayed = {tuple(c): in_process("--snapshot", path, *c) for c in SNAPSHOT_COMMANDS}
    after = {}  # asked again only where the replay is not what was shown before the save
    for command, got in replayed.items():
        if command == ("-j", "counters"):
            after[command] = in_process(*command)
            assert got[0] == before[command][0] == 0 and got[2] == before[command][2]
            _counters_between(before[command][1], got[1], after[command][1])
            continue
        if got != before[command]:
            after[command] = in_process(*command)
            assert got == after[command], command
    # For the host-side replay test: the snapshot and what the host showed around it.
    keep = os.environ.get("IBTOOL_TB_OUT")
    if keep:
        os.makedirs(os.path.join(keep, "snapshot"), exist_ok=True)
        shutil.copy(path, os.path.join(keep, "snapshot", "host.json.gz"))
        shown = [
            {"argv": list(c), "before": before[c], "after": after.get(c, before[c])} for c in before
        ]
        with open(os.path.join(keep, "snapshot", "live.json"), "w") as f:
            json.dump(shown, f, indent=1)


def _statistic(device: str) -> dict[str, int]:
    out = subprocess.run(
        ["rdma", "-j", "statistic", "show", "link", f"{device}/1"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    (entry,) = json.loads(out)
    counters = entry.get("counters", entry)  # newer iproute2 nests them
    return {
        k: v for k, v in counters.items() if isinstance(v, int) and k not in ("port", "ifindex")
    }


def test_snapshot_diff_shows_the_deltas_rdma_statistic_shows(testbed, tmp_path):
    device = testbed["device"]
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    first = _statistic(device)
    assert in_process("snapshot", "save", a)[0] == 0
    again = _statistic(device)
    subprocess.run(
        [sys.executable, "-m", "ibtool", "loopback", device, "--iters", "2000", "--ops", "write"],
        capture_output=True, timeout=300, check=True,
    )  # fmt: skip
    second = _statistic(device)
    assert in_process("snapshot", "save", b)[0] == 0
    last = _statistic(device)
    code, out, err = in_process("-j", "snapshot", "diff", a, b)
    assert code == 0, err
    deltas = {
        c["counter"]: c["delta"]
        for c in json.loads(out)["counters"]
        if c["ifname"] == device and c["port"] == 1 and c["source"] == "hw"
    }
    steady = [k for k in second if first.get(k) == again.get(k) and second[k] == last.get(k)]
    moved = {k: second[k] - first[k] for k in steady if second[k] != first[k]}
    assert moved, "the traffic moved no counter: the comparison proves nothing"
    assert {k: deltas.get(k) for k in moved} == moved
    assert all(deltas.get(k, 0) == 0 for k in steady if k not in moved)
