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
