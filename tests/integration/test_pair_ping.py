"""Every ping mode between the two guests of `testbed pair`, each its own kernel (and, with
--release/--peer-release, its own rdma-core), both directions: ibtool's own ping (TCP
exchange), --cm (rdma_cm), --compat rc_pingpong against rdma-core's ibv_rc_pingpong and
--compat rping against librdmacm's rping, with ibtool on either end. Each waits for its server
to listen, checks that the pings were answered, and that neither host keeps a QP or rdma_cm id
it did not have before."""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.faults import wait_for
from tests.integration.pair import Host, Pair

pytestmark = [pytest.mark.integration, pytest.mark.pair]

DIRECTIONS = ["runner-to-peer", "peer-to-runner"]


def ends(pair: Pair, direction: str) -> tuple[Host, Host]:
    """(client, server) of a direction: the client pings the server's host."""
    return (pair.local, pair.peer) if direction == "runner-to-peer" else (pair.peer, pair.local)


def served(server, what: str, port: int) -> None:
    """Until `server` (a Process) listens on TCP `port` of its host."""
    wait_for(lambda: not server.running() or server.host.listening(port), f"{what} listening", 120)
    assert server.running(), server.stop()


def first_line(server, prefix: str) -> None:
    lines = server.wait_for_lines(lambda lines: lines, timeout=120)
    assert lines[0].startswith(prefix), lines


def iters(stdout: str) -> int:
    """N of ibv_rc_pingpong's "N iters in S seconds = U usec/iter"."""
    found = re.search(r"^(\d+) iters in [\d.]+ seconds = [\d.]+ usec/iter$", stdout, re.M)
    assert found, stdout
    return int(found.group(1))


def test_the_pair(pair):
    """Each side is what the topology says, the peer runs commands and background processes."""
    assert pair.local.ipv4 == "10.77.0.1" and pair.peer.ipv4 == "10.77.0.2"
    assert pair.topology["peer_host"] == pair.peer.ipv4
    uname = pair.peer.run(["uname", "-r"], timeout=60)
    assert (uname.returncode, uname.stdout.strip()) == (0, pair.peer.kernel), uname.stderr
    assert pair.local.run(["uname", "-r"]).stdout.strip() == pair.local.kernel
    failed = pair.peer.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60)
    assert (failed.returncode, failed.stdout, failed.stderr) == (3, "out\n", "err\n")
    env = pair.peer.run(["sh", "-c", "echo $IBTOOL_TB_IPV4 $IBTOOL_TB_PEER_HOST"], timeout=60)
    assert env.stdout.split() == [pair.peer.ipv4, pair.local.ipv4]
    sleeper = pair.peer.start(["sleep", "600"])
    assert pair.peer.run(["kill", "-0", str(sleeper.pid)], timeout=60).returncode == 0
    rc, _, _ = sleeper.stop()
    assert not sleeper.running()
    assert pair.peer.run(["kill", "-0", str(sleeper.pid)], timeout=60).returncode != 0
    for host in pair.hosts():
        port = host.run(["rdma", "link", "show", f"{host.device}/1"], timeout=60)
        assert "state ACTIVE" in port.stdout and f"netdev {host.netdev}" in port.stdout


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ibtool_ping(pair, direction):
    client, server = ends(pair, direction)
    port = 18701 if direction == DIRECTIONS[0] else 18702
    before = pair.resources()
    srv = server.start(server.ibtool("ping", "--server", "--port", str(port), "--max-clients", "1"))
    served(srv, "ibtool ping --server", port)
    proc = client.run(
        client.ibtool("-j", "ping", server.ipv4, "--port", str(port), "-c", "5", "-i", "0"),
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"]) == (5, 5)
    assert [r["seq"] for r in report["replies"]] == [1, 2, 3, 4, 5]
    assert report["rtt_us"]["min"] > 0
    rc, out, err = srv.finish(timeout=60)
    assert rc == 0, err
    assert " done: 5 pings answered" in out, out
    pair.wait_nothing_left(before)


# ibtool ping --cm sends its parameters as rdma_cm private data, which pyverbs has from
# rdma-core 42 (ibtool/rdma/ping/cmping.py); before that it refuses, exit 6, with a hint.
CM_REFUSED = "ibtool ping --cm needs rdma_cm connection private data, which this pyverbs lacks"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ibtool_ping_cm(pair, direction):
    client, server = ends(pair, direction)
    port = 18711 if direction == DIRECTIONS[0] else 18712
    old = [h for h in (server, client) if h.rdma_core_major() < 42]
    if old:  # the first ibtool started there says so, and nothing else is tried
        args = ["ping", "--server", "--cm", "--bind", old[0].ipv4, "--port", str(port)]
        if old[0] is client:
            args = ["ping", "--cm", server.ipv4, "--port", str(port), "-c", "1"]
        refused = old[0].run(old[0].ibtool(*args), timeout=120)
        assert (refused.returncode, refused.stdout) == (6, ""), refused.stderr
        assert CM_REFUSED in refused.stderr
        pytest.skip(f"--cm refused on the {old[0].name}: rdma-core {old[0].rdma_core} < 42")
    before = pair.resources()
    srv = server.start(
        server.ibtool(
            "ping", "--server", "--cm", "--bind", server.ipv4, "--port", str(port),
            "--max-clients", "1",
        )
    )  # fmt: skip
    first_line(srv, f"listening on {server.ipv4}:{port} (rdma_cm), ")
    proc = client.run(
        client.ibtool("-j", "ping", "--cm", server.ipv4, "--port", str(port), "-c", "5", "-i", "0"),
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"]) == (5, 5)
    assert report["rtt_us"]["min"] > 0
    rc, out, err = srv.finish(timeout=60)
    assert (rc, err) == (0, ""), out
    assert out.splitlines()[1].startswith(f"client 1 connected on {server.device}/1: "), out
    assert out.splitlines()[-1] == "client 1 done: 5 pings answered", out
    pair.wait_nothing_left(before)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ibtool_pings_a_stock_rc_pingpong(pair, direction):
    client, server = ends(pair, direction)
    port = 18721 if direction == DIRECTIONS[0] else 18722
    before = pair.resources()
    stock = server.start(
        ["ibv_rc_pingpong", "-d", server.device, "-g", str(server.gid_index), "-p", str(port),
         "-s", "64", "-n", "20"]
    )  # fmt: skip
    served(stock, "ibv_rc_pingpong", port)
    proc = client.run(
        client.ibtool(
            "-j", "ping", "--compat", "rc_pingpong", server.ipv4, "--port", str(port),
            "-s", "64", "-c", "20",
        ),
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"], report["compat"]) == (20, 20, "rc_pingpong")
    rc, out, err = stock.finish(timeout=60)
    assert rc == 0, err
    assert iters(out) == 20
    pair.wait_nothing_left(before)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_stock_rc_pingpong_pings_ibtool(pair, direction):
    client, server = ends(pair, direction)
    port = 18731 if direction == DIRECTIONS[0] else 18732
    before = pair.resources()
    srv = server.start(
        server.ibtool(
            "ping", "--server", "--compat", "rc_pingpong", "--port", str(port),
            "--max-clients", "1",
        )
    )  # fmt: skip
    served(srv, "ibtool ping --server --compat rc_pingpong", port)
    proc = client.run(
        ["ibv_rc_pingpong", "-d", client.device, "-g", str(client.gid_index), "-p", str(port),
         "-s", "512", "-n", "20", "-c", server.ipv4],
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert iters(proc.stdout) == 20
    assert "invalid data" not in proc.stdout  # -c: its bytes came back
    rc, out, err = srv.finish(timeout=60)
    assert rc == 0, err
    assert " done: 20 pings of 512 bytes answered" in out, out
    pair.wait_nothing_left(before)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ibtool_pings_a_stock_rping(pair, direction):
    client, server = ends(pair, direction)
    port = 18741 if direction == DIRECTIONS[0] else 18742
    before = pair.resources()
    stock = server.start(
        ["rping", "-s", "-a", server.ipv4, "-p", str(port), "-C", "5", "-S", "100", "-v"]
    )
    wait_for(
        lambda: not stock.running() or server.cm_listening(stock.pid), "rping -s listening", 120
    )
    assert stock.running(), stock.stop()
    proc = client.run(
        client.ibtool(
            "-j", "ping", "--compat", "rping", server.ipv4, "--port", str(port),
            "-c", "5", "-i", "0", "-s", "100",
        ),
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["sent"], report["received"]) == (5, 5)
    rc, out, err = stock.finish(timeout=60)
    assert rc == 0, err
    pings = re.findall(r"^server ping data: rdma-ping-(\d+): ", out, re.M)
    assert [int(n) for n in pings] == [0, 1, 2, 3, 4], out
    pair.wait_nothing_left(before)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_stock_rping_pings_ibtool(pair, direction):
    client, server = ends(pair, direction)
    port = 18751 if direction == DIRECTIONS[0] else 18752
    before = pair.resources()
    srv = server.start(
        server.ibtool(
            "ping", "--server", "--compat", "rping", "--bind", server.ipv4, "--port", str(port),
            "--max-clients", "1",
        )
    )  # fmt: skip
    first_line(srv, f"listening on {server.ipv4}:{port} (rdma_cm, rping), ")
    proc = client.run(
        ["rping", "-c", "-a", server.ipv4, "-p", str(port), "-C", "6", "-S", "200", "-V", "-v"],
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr  # -V: "data mismatch!" would be an exit 255
    pings = re.findall(r"^ping data: rdma-ping-(\d+): ", proc.stdout, re.M)
    assert [int(n) for n in pings] == [0, 1, 2, 3, 4, 5], proc.stdout
    rc, out, err = srv.finish(timeout=60)
    assert (rc, err) == (0, ""), out
    assert out.splitlines()[-1] == "client 1 done: 6 pings answered", out
    pair.wait_nothing_left(before)
