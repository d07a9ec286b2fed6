"""`ibtool health` on the real kernel: the rxe pair healthy, a port down and back, a flap between
two runs, retransmissions from netem loss, a device re-created, overlapping runs, and the
textfile promtool reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.integration import faults
from tests.integration.running import wait_listening

pytestmark = pytest.mark.integration


class Health:
    """`ibtool health` as cron runs it on this host, with a state file of its own."""

    def __init__(self, tmp_path):
        self.state = tmp_path / "health.json"
        self.config = tmp_path / "health.toml"
        self.config.write_text("")

    def command(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ibtool",
            "health",
            "--state",
            str(self.state),
            "--config",
            str(self.config),
            *args,
        ]

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def health(tmp_path, testbed):
    return Health(tmp_path)


def lines(r: subprocess.CompletedProcess) -> list[str]:
    return r.stdout.splitlines()


def test_the_healthy_testbed_is_ok(health, testbed):
    r = health()
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("IBTOOL OK - all OK: counters ")
    out = lines(r)
    for device, netdev in ((testbed["device"], testbed["netdev"]),):
        assert f"[OK] port {device}/1: ACTIVE 10 Gb/s 1X netdev {netdev}" in out
    assert any(line.startswith("[OK] system 2 RDMA devices; uverbs ABI ") for line in out), out


def test_a_down_port_is_critical_then_ok_once_back(health, testbed):
    assert health().returncode == 0
    with faults.link_down(testbed):
        r = health()
        assert r.returncode == 2, r.stdout
        first = lines(r)[0]
        assert first.startswith(f"IBTOOL CRITICAL - {testbed['device']}/1: state DOWN"), first
    r = health()
    assert r.returncode == 0, r.stdout
    assert (
        f"[OK] port {testbed['device']}/1: ACTIVE 10 Gb/s 1X netdev {testbed['netdev']}; up "
        "again (was DOWN at the last run)" in lines(r)
    )


def test_a_flap_between_two_runs_is_caught(health, testbed):
    assert health().returncode == 0
    with faults.link_down(testbed):
        pass  # down, then up again before the next run
    r = health()
    assert r.returncode == 1, r.stdout
    device, netdev = testbed["device"], testbed["netdev"]
    out = lines(r)
    assert f"[WARNING] counters {device}/1: link went down once since the last run (flap)" in out
    assert any(
        line.startswith(f"[WARNING] port {device}/1: link flapped: {netdev} carrier changed ")
        for line in out
    ), out


def perftest_across_the_pair(testbed, iters: int = 60) -> None:
    """ib_write_bw from rxe0 to rxe1: traffic that crosses the veth pair (and its netem)."""
    server = subprocess.Popen(
        ["ib_write_bw", "-d", testbed["peer_device"], "-x", testbed["peer_ipv4_gid_index"],
         "-s", "65536", "-n", str(iters), "-p", "18777"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_listening(server, 18777)  # before the client connects
        client = subprocess.run(
            ["ib_write_bw", "-d", testbed["device"], "-x", testbed["ipv4_gid_index"],
             "-s", "65536", "-n", str(iters), "-p", "18777", testbed["peer_ipv4"]],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert client.returncode == 0, client.stdout + client.stderr
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_retransmissions_from_netem_loss_warn_naming_the_counters(health, testbed, netem):
    assert health().returncode == 0
    netem("loss 5%")
    perftest_across_the_pair(testbed)
    r = health("--check", "counters")
    assert r.returncode == 1, r.stdout + r.stderr
    warned = [line for line in lines(r) if line.startswith("[WARNING] counters ")]
    assert warned, r.stdout
    assert all("since the last run (warning 100)" in line for line in warned), warned
    named = {line.split(": ", 1)[1].split(" +")[0] for line in warned}
    # rxe counts a retransmitted request its responder saw out of order, and the NAKs for it
    assert named & {"out_of_seq_request", "rcvd_seq_err", "duplicate_request"}, warned


def test_a_recreated_device_is_no_alarm(health, testbed, netem):
    netem("loss 5%")
    perftest_across_the_pair(testbed, iters=30)  # error counters away from 0 first
    health()
    before = json.loads(health.state.read_text())
    with faults.rxe_deleted(testbed):
        pass  # deleted, then re-created on its netdev: every counter starts at 0 again
    r = health()
    assert r.returncode == 0, r.stdout + r.stderr
    device = testbed["device"]
    assert f"[OK] counters {device}/1: device re-created since the last run: new baseline" in (
        lines(r)
    )
    after = json.loads(health.state.read_text())
    incarnation = lambda state: state["checks"]["counters"]["data"]["devices"][device]  # noqa: E731
    assert incarnation(before)["incarnation"] != incarnation(after)["incarnation"]


def test_overlapping_runs_wait_for_each_other_and_the_state_stays_whole(health, testbed):
    # (a lock held past --lock-wait is UNKNOWN: tests/unit/test_health.py, with a real flock)
    runs = [
        subprocess.Popen(health.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    codes = [p.wait(timeout=180) for p in runs]
    assert codes == [0, 0, 0], [p.stdout.read() for p in runs]
    state = json.loads(health.state.read_text())
    assert set(state["checks"]) == {"counters", "port"}  # what the checks keep
    assert [n for n in os.listdir(health.state.parent) if n.endswith(".tmp")] == []


def test_the_textfile_passes_promtool(health, testbed, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is not installed"
    path = tmp_path / "ibtool.prom"
    r = health("--textfile", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    with open(path) as f:
        check = subprocess.run(
            [promtool, "check", "metrics"], stdin=f, capture_output=True, text=True, timeout=60
        )
    assert check.returncode == 0, check.stdout + check.stderr
    text = path.read_text()
    assert "ibtool_health_status 0.0\n" in text
    device = testbed["device"]
    assert f'ibtool_hw_statistic_total{{device="{device}",name="sent_pkts",port="1"}}' in text
    assert f'ibtool_port_state_id{{device="{device}",port="1"}} 4.0' in text


def test_the_data_path_moves_data_on_every_active_port(health, testbed):
    health.config.write_text("[datapath]\nbudget = 300\n")  # pyverbs and QPs under emulation
    r = health("--datapath", "--check", "datapath", timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    for device in (testbed["device"], testbed["peer_device"]):
        assert any(
            line.startswith(f"[OK] datapath {device}/1: data path: send, write, read PASS (")
            for line in lines(r)
        ), r.stdout
    assert f"'{testbed['device']}/1 send p50'=" in lines(r)[0]
    assert user_qps() == []  # every QP the check made is gone with it


def user_qps() -> list[dict]:
    out = subprocess.run(
        ["rdma", "-j", "res", "show", "qp"], capture_output=True, text=True, check=True
    ).stdout
    return [q for q in json.loads(out or "[]") if "pid" in q]


def test_configured_peers_answer_an_rdma_ping(health, testbed, wait_for):
    import socket

    server = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "ping", "--server", "--dev", testbed["peer_device"]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def listening() -> bool:
            assert server.poll() is None, server.stderr.read()
            with socket.socket() as s:
                return s.connect_ex((testbed["peer_ipv4"], 18520)) == 0

        wait_for(listening, "the ping server to listen", timeout=120)
        peer = testbed["peer_ipv4"]
        health.config.write_text(f'[datapath]\nbudget = 300\npeers = ["{peer}", "192.0.2.1"]\n')
        r = health("--datapath", "--check", "peers", timeout=400)
    finally:
        server.terminate()
        server.wait(timeout=30)
    out = lines(r)
    assert r.returncode == 2, r.stdout + r.stderr  # 192.0.2.1 (TEST-NET-1) has no server
    assert any(line.startswith(f"[OK] peers {peer}: RDMA ping from ") for line in out), out
    assert any(
        line.startswith("[CRITICAL] peers 192.0.2.1: RDMA ping: cannot reach the ping server")
        for line in out
    ), out


def test_the_exporter_serves_what_promtool_and_an_http_client_read(testbed, tmp_path):
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "exporter", "--listen", "127.0.0.1:0", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), line
        url = line.split()[1]
        body, deadline = "", time.monotonic() + 120
        while "ibtool_exporter_poll_duration_seconds" not in body:
            assert time.monotonic() < deadline, "no poll within 120 s"
            with urllib.request.urlopen(url, timeout=30) as reply:
                body = reply.read().decode()
            time.sleep(0.2)
    finally:
        proc.terminate()
        assert proc.wait(30) == 143
    device = testbed["device"]
    assert "\nibtool_health_status 0.0\n" in body
    assert f'ibtool_port_state_id{{device="{device}",port="1"}} 4.0' in body
    check = subprocess.run(
        [shutil.which("promtool") or "promtool", "check", "metrics"],
        input=body,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
