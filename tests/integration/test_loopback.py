"""ibtool loopback on the live kernel: every operation passes with verified data, nothing leaks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration


def ibtool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=timeout
    )


def user_objects(kind: str) -> list[dict]:
    """`rdma res show KIND` entries owned by a process (kernel objects have no pid)."""
    out = subprocess.run(
        ["rdma", "-j", "res", "show", kind], capture_output=True, text=True, check=True
    ).stdout
    return [o for o in json.loads(out or "[]") if "pid" in o]


@pytest.fixture
def no_leaks():
    before = {k: len(user_objects(k)) for k in ("qp", "mr", "cq", "pd")}
    yield
    after = {k: len(user_objects(k)) for k in ("qp", "mr", "cq", "pd")}
    assert after == before, f"objects left behind: {before} -> {after}"


@pytest.mark.parametrize("size", [1, 4096, 65536])
def test_every_operation_passes_with_verified_data(size, no_leaks):
    proc = ibtool("-j", "loopback", "--iters", "10", "--size", str(size))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    statuses = {r["op"]: r["status"] for r in report["results"]}
    passing = ("send", "write", "write_imm", "read", "fetch_add", "cmp_swap", "ud_send")
    passing += ("ud_qkey", "mcast")
    # Path migration: Linux takes alternate paths on InfiniBand ports only.
    assert statuses == {**{op: "PASS" for op in passing}, "apm": "UNSUPPORTED"}
    for r in report["results"]:
        if r["status"] == "PASS":
            assert r["iters"] == 10 and r["lat_p50_us"] > 0
        if r["op"] in ("send", "write", "read"):
            assert r["bw_MBps"] > 0


def test_gid_index_defaults_to_the_best_rule():
    best = ibtool("gids", "--best", timeout=60)
    report = json.loads(ibtool("-j", "loopback", "--iters", "2", "--ops", "write").stdout)
    assert str(report["gid_index"]) == best.stdout.strip()


def test_sigterm_mid_run_leaves_nothing_behind(no_leaks):
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "loopback", "--iters", "1000000", "--ops", "send"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not user_objects("qp"):
        assert time.monotonic() < deadline and proc.poll() is None, "loopback never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.endswith("ibtool: terminated\n"), err


def test_link_down_is_an_error_naming_the_port_state(link_down):
    proc = ibtool("loopback", "--iters", "1", "--ops", "write", timeout=60)
    assert proc.returncode == 1
    assert "is DOWN" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_operation_is_a_usage_error():
    proc = ibtool("loopback", "--ops", "teleport", timeout=60)
    assert proc.returncode == 2 and "unknown operation 'teleport'" in proc.stderr


def sysfs_pkeys(device: str, port: int = 1) -> dict[int, int]:
    """The port's P_Key table as the kernel prints it: slot -> value ("0x%04x")."""
    import os

    table = f"/sys/class/infiniband/{device}/ports/{port}/pkeys"
    return {int(i): int(open(f"{table}/{i}").read(), 16) for i in os.listdir(table)}


def test_pkey_index_0_is_the_tables_first_slot_and_every_op_passes(testbed, no_leaks):
    pkeys = sysfs_pkeys(testbed["device"])
    proc = ibtool("-j", "loopback", f"{testbed['device']}/1", "--iters", "3", "--pkey-index", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert (report["pkey_index"], report["pkey"]) == (0, f"0x{pkeys[0]:04x}")
    status = {r["op"]: r["status"] for r in report["results"]}
    assert status.pop("apm") == "UNSUPPORTED"  # RoCE: no alternate paths (its own test)
    assert set(status.values()) == {"PASS"}, status  # RC and UD QPs, multicast alike
    text = ibtool("loopback", "--iters", "2", "--ops", "send", "--pkey-index", "0").stdout
    header = text.splitlines()[0]
    assert header.startswith(f"loopback on {testbed['device']}/1 gid "), text
    assert f", pkey 0x{pkeys[0]:04x} (index 0), " in header, text


def test_a_pkey_index_outside_the_table_is_one_error_naming_it(testbed, no_leaks):
    device = testbed["device"]
    pkeys = sysfs_pkeys(device)
    index = len(pkeys)  # rxe's table has one slot
    proc = ibtool("loopback", "--ops", "send", "--pkey-index", str(index))
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    table = f"/sys/class/infiniband/{device}/ports/1/pkeys"
    assert proc.stderr == (
        f"ibtool: error: {device}/1 has no P_Key index {index}: {table} has {len(pkeys)} "
        f"slot{'s' * (len(pkeys) != 1)} (0..{len(pkeys) - 1}) "
        f"(hint: populated: {populated(pkeys)})\n"
    )


def populated(pkeys: dict[int, int]) -> str:
    return ", ".join(f"index {i} (0x{v:04x})" for i, v in sorted(pkeys.items()) if v)
