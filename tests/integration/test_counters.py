"""ibtool counters on the live kernel: agree with sysfs and `rdma statistic`, move with traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration


def ibtool(*args: str, timeout: float = 120):
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def hw(device: str = "rxe0") -> dict[str, int]:
    rows = json.loads(ibtool("-j", "counters", f"{device}/1").stdout)
    return {r["counter"]: r["value"] for r in rows if r["source"] == "hw"}


def rdma_statistic(device: str = "rxe0") -> dict[str, int]:
    out = subprocess.run(
        ["rdma", "-j", "statistic", "show", "link", f"{device}/1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (entry,) = json.loads(out)
    counters = entry.get("counters", entry)  # newer iproute2 nests them
    return {k: v for k, v in counters.items() if isinstance(v, int) and k != "port"}


def test_counters_agree_with_sysfs_and_rdma_statistic():
    ours = hw()
    sysfs_dir = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
    names = {n for n in os.listdir(sysfs_dir) if n != "lifespan"}
    assert set(ours) == names
    theirs = rdma_statistic()
    assert set(ours) <= set(theirs)
    for name in ("duplicate_request", "send_err", "retry_exceeded_err"):
        assert ours[name] == theirs[name]


def test_counters_move_under_traffic():
    before = hw()
    ibtool("loopback", "--ops", "write,send", "--iters", "20", "--size", "4096")
    after = hw()
    assert after["sent_pkts"] > before["sent_pkts"]
    assert after["rcvd_pkts"] > before["rcvd_pkts"]


def test_rate_sees_traffic_while_it_flows():
    load = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "loopback", "--ops", "send", "--iters", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(8)  # interpreter start and QP setup under emulation
        rows = json.loads(ibtool("-j", "counters", "rxe0/1", "--rate", "--interval", "2").stdout)
    finally:
        load.terminate()
        load.wait(timeout=60)
    rates = {r["counter"]: r["rate_per_sec"] for r in rows}
    assert rates["sent_pkts"] > 0 and rates["rcvd_pkts"] > 0
