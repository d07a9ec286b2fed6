"""`ibtool ping --cm`: ibtool's own ping connected through rdma_cm between two ibtool processes
on the testbed's rxe0, both modes; a refused and an unreachable address told apart; Ctrl-C of
either side; no QP or rdma_cm id left behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from tests.integration.running import Running
from tests.integration.test_ping import roce_v2_packets, user_objects

pytestmark = pytest.mark.integration


def nothing_left() -> bool:
    return not user_objects("qp") and not user_objects("cm_id")


def cm_server(running, addr: str, port: int, *extra: str) -> Running:
    server = running("ping", "--server", "--cm", "--bind", addr, "--port", str(port), *extra)
    server.wait_for_lines(lambda lines: lines, timeout=90)
    assert server.lines[0].startswith(f"listening on {addr}:{port} (rdma_cm), "), server.lines
    return server


def ibtool(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("mode", ["send", "write-imm"])
def test_ping_over_rdma_cm_both_modes(testbed, running, wait_for, mode):
    addr = testbed["ipv4"]
    server = cm_server(running, addr, 18621, "--max-clients", "1")
    proc = ibtool(
        "-j", "ping", "--cm", addr, "--port", "18621", "-c", "5", "-i", "0", "-s", "100",
        "--mode", mode,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"], report["mode"]) == (5, 5, mode)
    assert [r["seq"] for r in report["replies"]] == [1, 2, 3, 4, 5]
    assert report["rtt_us"]["min"] > 0
    rc, out, err = server.finish(timeout=60)
    assert (rc, err) == (0, ""), out
    assert out.splitlines()[1:] == [
        f"client 1 connected on {testbed['device']}/1: mode {mode} size 100, mtu 1024, sl 0, "
        "tclass 0",
        "client 1 done: 5 pings answered",
    ]
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_sl_tclass_and_mtu_asked_of_rdma_cm_are_the_connections_on_both_sides(
    testbed, running, wait_for
):
    # The server on rxe1's address, the client on rxe0: the packets cross the veth pair, each
    # side's on its own end.
    peer, here = testbed["peer_ipv4"], testbed["ipv4"]
    server = cm_server(running, peer, 18623, "--max-clients", "1", "--tclass", "72")
    done, ours, theirs = threading.Event(), [], []
    sniffers = [
        threading.Thread(
            target=lambda into=into, netdev=netdev, source=source: into.extend(
                roce_v2_packets(netdev, source, done)
            )
        )
        for into, netdev, source in (
            (ours, testbed["netdev"], here),
            (theirs, testbed["peer_netdev"], peer),
        )
    ]
    for sniffer in sniffers:
        sniffer.start()
    try:
        proc = ibtool(
            "ping", "--cm", peer, "--port", "18623", "-c", "3", "-i", "0", "-s", "600",
            "--sl", "2", "--tclass", "104", "--mtu", "256", "-j",
        )  # fmt: skip
    finally:
        done.set()
        for sniffer in sniffers:
            sniffer.join(10)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["received"], report["sl"], report["tclass"], report["mtu"]) == (3, 2, 104, 256)
    # The connection's own packets, not the CM's MADs (UD, on QP1: rdma_cm's TOS, 0).
    ours, theirs = ([p for p in seen if p.opcode < 0x20] for seen in (ours, theirs))
    assert {p.tos for p in ours} == {104}, ours  # DSCP 26 on every packet of the client's
    sends = [p for p in ours if p.payload > 0]
    assert len(sends) >= 9 and max(p.payload for p in sends) == 256, ours  # 600 = 256+256+88
    assert {p.tos for p in theirs} == {72}, theirs  # the server's answers: DSCP 18
    # The server kept rdma_cm's MTU, rxe's 1024 on a 1500-byte netdev: one packet an answer.
    assert max(p.payload for p in theirs) == 600, theirs
    rc, out, err = server.finish(timeout=60)
    assert (rc, err) == (0, ""), out
    assert out.splitlines()[1] == (
        f"client 1 connected on {testbed['peer_device']}/1: mode send size 600, "
        "mtu 1024, sl 0, tclass 72 (DSCP 18)"
    )
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_a_port_where_nothing_listens_is_refused_by_the_remote_stack(testbed, wait_for):
    addr = testbed["ipv4"]
    proc = ibtool("ping", "--cm", addr, "--port", "18699", "-c", "1")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"ibtool: error: {addr}:18699 refused the connection (RDMA_CM_EVENT_REJECTED): its RDMA "
        "stack answered, but no ibtool ping server listens on port 18699 (hint: start `ibtool "
        "ping --server --cm --bind ADDR` there, or give the --port it listens on)\n"
    )
    wait_for(nothing_left, "no QP or rdma_cm id of the client")


def test_an_address_nobody_has_is_unreachable(testbed, wait_for):
    addr = testbed["ipv4"].rsplit(".", 1)[0] + ".99"  # on veth0's subnet: ARP gets no answer
    proc = ibtool("ping", "--cm", addr, "-c", "1")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith(f"ibtool: error: {addr}:18520 is unreachable: "), proc.stderr
    assert proc.stderr.count("\n") == 1
    wait_for(nothing_left, "no QP or rdma_cm id of the client")


def test_sigint_to_the_client_prints_the_statistics_and_the_server_goes_on(
    testbed, running, wait_for
):
    addr = testbed["ipv4"]
    server = cm_server(running, addr, 18622)
    client = running("ping", "--cm", addr, "--port", "18622", "-i", "0.2", "--mode", "write-imm")
    client.wait_for_lines(lambda lines: sum(" bytes from " in line for line in lines) >= 3, 120)
    rc, out, err = client.finish(signal.SIGINT)
    assert (rc, err) == (0, ""), out  # Ctrl-C after replies: 0, as ping(8)
    lines = out.splitlines()
    # The client's device is rdma_cm's pick for the route to addr (rxe1 here, not rxe0).
    assert re.fullmatch(
        rf"PING {addr}:18622 over rdma_cm \(rxe\d/1\): 64 bytes, mode write-imm, mtu 1024, "
        r"sl 0, tclass 0",
        lines[0],
    )
    assert lines[-3] == f"--- {addr} ibtool ping statistics ---", out
    m = re.fullmatch(r"(\d+) sent, (\d+) received, \d+% loss, time \d+ ms", lines[-2])
    assert m and int(m[2]) >= 3 and int(m[1]) - int(m[2]) in (0, 1)
    server.wait_for_lines(lambda lines: any("client 1 done: " in line for line in lines), 60)
    wait_for(lambda: not user_objects("qp"), "the client's and the session's QPs destroyed")
    again = ibtool("-j", "ping", "--cm", addr, "--port", "18622", "-c", "2", "-i", "0")
    assert json.loads(again.stdout)["received"] == 2, again.stderr
    rc, out, err = server.finish(signal.SIGINT, timeout=60)
    assert (rc, err) == (130, "ibtool: interrupted\n"), out
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_sigint_to_the_server_mid_run_ends_the_client_with_a_reason(testbed, running, wait_for):
    addr = testbed["ipv4"]
    server = cm_server(running, addr, 18623)
    client = running("ping", "--cm", addr, "--port", "18623", "-i", "0.2", "-W", "1")
    client.wait_for_lines(lambda lines: sum(" bytes from " in line for line in lines) >= 2, 120)
    rc, out, err = server.finish(signal.SIGINT, timeout=60)
    assert (rc, err) == (130, "ibtool: interrupted\n"), out
    assert out.splitlines()[-1] == "server stopped"
    rc, out, err = client.finish(timeout=60)
    assert rc == 1, out
    assert f"--- {addr} ibtool ping statistics ---" in out
    assert err.splitlines()[-1].startswith(
        f"ibtool: error: the ping server at {addr}:18623 disconnected"
    ), err
    wait_for(nothing_left, "no QP or rdma_cm id of either side")


def test_hw_timestamps_over_rdma_cm_ask_the_device_rdma_cm_chose(testbed, running, wait_for):
    # The HCA's clock is that of the device the address resolved to: rxe has none, so the
    # client refuses once that is known, before any connection request reaches the server.
    peer = testbed["peer_ipv4"]
    server = cm_server(running, peer, 18625)
    proc = ibtool("ping", "--cm", peer, "--port", "18625", "-c", "1", "--hw-timestamps")
    assert (proc.returncode, proc.stdout) == (6, ""), proc.stderr
    assert proc.stderr.startswith(
        f"ibtool: error: {testbed['device']}/1 does not timestamp its completions "
        "(completion_timestamp_mask 0x0, hca_core_clock 0 kHz) (hint: completion timestamps "
        "are an mlx5"
    ), proc.stderr
    assert proc.stderr.count("\n") == 1
    assert not user_objects("qp")  # the client's (and no server side of a connection)
    assert {c["pid"] for c in user_objects("cm_id")} == {server.proc.pid}  # its listener
    rc, out, err = server.finish(signal.SIGINT, timeout=60)
    assert out.splitlines()[1:] == ["server stopped"], out  # no client came
    wait_for(nothing_left, "no QP or rdma_cm id of either side")
