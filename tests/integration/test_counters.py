"""ibtool counters on the live kernel: agree with sysfs and `rdma statistic`, move with traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.running import wait_listening

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


def test_counters_move_under_perftest_traffic():
    # ib_write_bw (perftest) on rxe0's IPv4 GID, server and client in this guest: every 64 KiB
    # write is at least 16 packets whatever the path MTU (at most 4096), each way acked.
    iters, size = 200, 65536
    args = [
        "ib_write_bw",
        "-d",
        "rxe0",
        "-x",
        "1",
        "-s",
        str(size),
        "-n",
        str(iters),
        "-p",
        "18999",
    ]
    before = hw()
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(server, 18999)  # before the client connects
        client = subprocess.run([*args, "127.0.0.1"], capture_output=True, text=True, timeout=180)
        assert client.returncode == 0, client.stdout + client.stderr
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    after = hw()
    wire = iters * (size // 4096)
    assert after["sent_pkts"] - before["sent_pkts"] >= wire
    assert after["rcvd_pkts"] - before["rcvd_pkts"] >= wire


def test_rate_sees_traffic_while_it_flows():
    load = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "loopback", "--ops", "send", "--iters", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sent = "/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts"

    def packets() -> int:
        with open(sent) as f:
            return int(f.read())

    try:
        # Measure once the load moves packets (interpreter start and QP set-up take 5-30 s
        # under emulation, longer when the host is busy), not after a fixed sleep.
        before = packets()
        deadline = time.monotonic() + 120
        while packets() - before < 1000 and time.monotonic() < deadline:
            assert load.poll() is None, "the loopback load ended early"
            time.sleep(0.5)
        rows = json.loads(ibtool("-j", "counters", "rxe0/1", "--rate", "--interval", "2").stdout)
    finally:
        load.terminate()
        load.wait(timeout=60)
    rates = {r["counter"]: r["rate_per_sec"] for r in rows}
    assert rates["sent_pkts"] > 0 and rates["rcvd_pkts"] > 0


def run_ibtool(*args: str):
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=120
    )


def test_details_say_every_counter_came_from_sysfs_and_netlink_adds_nothing_on_rxe():
    # rxe has no optional counters: netlink STAT_GET lists exactly its sysfs hw_counters
    rows = json.loads(ibtool("-d", "-j", "counters", "rxe0/1").stdout)
    assert rows and {r["via"] for r in rows} == {"sysfs"}
    assert {r["source"] for r in rows} == {"hw"}


def test_optional_counters_on_rxe_are_none_like_rdma_statistic_mode_supported():
    proc = run_ibtool("-j", "counters", "optional", "rxe0/1")
    assert (proc.returncode, json.loads(proc.stdout)) == (0, [])
    assert proc.stderr == "ibtool: warning: no optional counters on rxe0/1\n"
    rdma = subprocess.run(
        ["rdma", "-j", "statistic", "mode", "supported", "link", "rxe0/1"],
        capture_output=True,
        text=True,
    )
    assert rdma.returncode == 0, rdma.stderr
    # iproute2 prints [] (or entries without optional-counters) for a port without any
    assert not any(e.get("optional-counters") for e in json.loads(rdma.stdout or "[]"))


def test_enabling_a_counter_rxe_does_not_have_names_none():
    proc = run_ibtool("counters", "enable", "rxe0/1", "rdma_tx_bytes")
    assert proc.returncode == 4
    assert proc.stderr == (
        "ibtool: error: rxe0/1 has no optional counter 'rdma_tx_bytes' "
        "(hint: optional counters of rxe0/1: none (ibtool counters optional))\n"
    )


def test_disable_all_is_what_rdma_statistic_unset_does():
    ours = run_ibtool("counters", "disable", "rxe0/1", "all")
    theirs = subprocess.run(
        ["rdma", "statistic", "unset", "link", "rxe0/1", "optional-counters"],
        capture_output=True,
        text=True,
    )
    assert (ours.returncode == 0) == (theirs.returncode == 0), (ours.stderr, theirs.stderr)
    assert "Traceback" not in ours.stderr
