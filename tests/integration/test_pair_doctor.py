"""`ibtool doctor` between the two guests of `testbed pair`: a healthy pair passes, and each
cause the two hosts can really show is broken on purpose, named by doctor with its fix, then
repaired and seen to pass. Every break here is real (the kernel's own state on one guest);
what veth and rxe cannot produce (DCB replies, P_Key tables, PCIe width, NUMA) is proven on
captured and uapi-built fixtures in tests/unit/test_doctor_*.py and test_system_facts.py.

The runner saves each doctor output it shows to the results folder (doctor-*.txt), the text
ibtool-doctor(8) quotes."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.integration.faults import wait_for
from tests.integration.pair import Host, Pair

pytestmark = [pytest.mark.integration, pytest.mark.pair]

PORT = 18520  # the peer's ibtool ping --server: the default port, which doctor asks
# Under TCG the peer's server reads its facts in seconds (the Python start-up of a netfilter
# and route lookup); on a real host the answer takes milliseconds.
TIMEOUT = "30"


@pytest.fixture(autouse=True)
def rdma_stack(pair: Pair):
    """Both hosts as rdma-core's rdma-load-modules service leaves a RoCE host: rdma_ucm
    loaded (the testbed's guests load only what their set-up needs)."""
    for host in pair.hosts():
        proc = host.run(["modprobe", "rdma_ucm"], timeout=60)
        assert proc.returncode == 0, proc.stderr


@pytest.fixture
def server(pair: Pair):
    """`ibtool ping --server` on the peer, listening."""
    srv = pair.peer.start(pair.peer.ibtool("ping", "--server", "--port", str(PORT)))
    wait_for(lambda: not srv.running() or pair.peer.listening(PORT), "server listening", 180)
    assert srv.running(), srv.stop()
    yield srv
    srv.stop()


def doctor(host: Host, *args: str, prefix: tuple[str, ...] = (), timeout: float = 300):
    """`ibtool -j doctor ARGS` on `host`: (exit status, {check: (status, evidence, fix)},
    the JSON)."""
    proc = host.run([*prefix, *host.ibtool("-j", "doctor", *args, "--timeout", TIMEOUT)],
                    timeout=timeout)  # fmt: skip
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    got: dict[str, list] = {}
    for c in report["checks"]:
        got.setdefault(c["check"], []).append((c["status"], c["evidence"], c["fix"]))
    return proc.returncode, got, report


def keep(pair: Pair, name: str, *args: str, prefix: tuple[str, ...] = ()) -> str:
    """The text of `ibtool doctor ARGS` on the runner, saved to the results folder."""
    proc = pair.local.run([*prefix, *pair.local.ibtool("doctor", *args, "--timeout", TIMEOUT)],
                          timeout=300)  # fmt: skip
    out = pair.topology.get("out")
    if out and os.path.isdir(out):
        with open(os.path.join(out, f"doctor-{name}.txt"), "w") as f:
            f.write(f"$ ibtool doctor {' '.join(args)}\n{proc.stdout}{proc.stderr}")
            f.write(f"(exit {proc.returncode})\n")
    return proc.stdout


def only(got: dict, check: str) -> tuple:
    assert len(got[check]) == 1, got[check]
    return got[check][0]


def test_a_healthy_pair_passes(pair: Pair, server):
    before = pair.resources()
    t0 = time.monotonic()
    rc, got, report = doctor(pair.local, pair.peer.ipv4)
    took = time.monotonic() - t0
    bad = {k: v for k, v in got.items() if any(s in ("WARN", "FAIL") for s, _, _ in v)}
    assert (rc, bad) == (0, {}), got
    remote = report["remote"]
    assert remote["kernel"] == pair.peer.kernel and remote["device"] == pair.peer.device
    assert only(got, "peer")[1].startswith(f"{remote['hostname']} {pair.peer.device}/1, kernel ")
    assert only(got, "gid")[1] == (
        f"here: GID {pair.local.gid_index} {pair.local.ipv4} RoCE v2 on {pair.local.netdev}; "
        f"peer: GID {pair.peer.gid_index} {pair.peer.ipv4} RoCE v2 on {pair.peer.netdev}"
    )
    assert only(got, "route")[1] == (
        f"{pair.peer.ipv4} via {pair.local.netdev} from {pair.local.ipv4}"
    )
    # SEND and WRITE IMM of 64 bytes, then a SEND of the path MTU's full payload (1024)
    assert [s for s, _, _ in got["probe"]] == ["PASS", "PASS", "PASS"], got["probe"]
    assert got["probe"][2][1].startswith("RC SEND of 1024 bytes (the path MTU): 3/3 answered")
    keep(pair, "healthy", pair.peer.ipv4)
    print(f"doctor against the peer took {took:.1f} s under TCG")
    pair.wait_nothing_left(before)
    # the server answered the query and both probes, and built nothing for the query
    lines = server.wait_for_lines(lambda ls: any("doctor query answered" in x for x in ls), 60)
    assert any(x.rstrip().endswith(": doctor query answered") for x in lines), lines


def test_link_local_gids_only(pair: Pair):
    host, nic = pair.local, pair.local.netdev
    host.run(["ip", "-4", "addr", "flush", "dev", nic], timeout=60)
    host.run(["ip", "-6", "addr", "flush", "dev", nic, "scope", "global"], timeout=60)
    try:
        wait_for(lambda: doctor(host, "--no-probe")[1]["gid"][0][0] == "FAIL",
                   "link-local GIDs only", 120)  # fmt: skip
        rc, got, _ = doctor(host, "--no-probe")
        status, evidence, fix = only(got, "gid")
        # the GID rule falls back to the link-local GID: doctor says that is all there is
        assert rc == 2 and evidence.startswith("GID 0 fe80::"), evidence
        assert evidence.endswith(f"RoCE v2 on {nic}: link-local only, no IPv4 or global IPv6 "
                                 "address")  # fmt: skip
        assert fix == f"ip addr add ADDRESS/PREFIX dev {nic}"
        keep(pair, "link-local", "--no-probe")
    finally:
        host.run(["ip", "addr", "add", f"{host.ipv4}/24", "dev", nic], timeout=60)
        if host.ipv6:
            host.run(["ip", "-6", "addr", "add", f"{host.ipv6}/64", "dev", nic, "nodad"], 60)
    wait_for(lambda: only(doctor(host, "--no-probe")[1], "gid")[0] == "PASS",
               "the IPv4 GID back", 120)  # fmt: skip


def test_rdma_ucm_missing_on_the_peer(pair: Pair, server):
    peer = pair.peer
    assert peer.run(["modprobe", "-r", "rdma_ucm"], timeout=60).returncode == 0
    try:
        rc, got, _ = doctor(pair.local, peer.ipv4, "--no-probe")
        status, evidence, fix = only(got, "stack")
        assert (rc, status) == (2, "FAIL"), got
        assert "peer: rdma_ucm not loaded" in evidence and fix == "on the peer: modprobe rdma_ucm"
        keep(pair, "rdma-ucm", peer.ipv4, "--no-probe")
    finally:
        peer.run(["modprobe", "rdma_ucm"], timeout=60)
    rc, got, _ = doctor(pair.local, peer.ipv4, "--no-probe")
    assert only(got, "stack")[0] == "PASS", got["stack"]


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
def test_memlock_too_low_for_the_run(pair: Pair, server):
    # root has CAP_IPC_LOCK, which the limit does not bind: drop it as a job's user lacks it
    limited = ("setpriv", "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock",
               "prlimit", "--memlock=65536:65536")  # fmt: skip
    size = str(256 << 10)  # the probe registers more than 64 KiB: it fails for real
    rc, got, _ = doctor(pair.local, pair.peer.ipv4, "-c", "1", "--size", size, prefix=limited)
    status, evidence, fix = only(got, "memlock")
    assert (rc, status) == (2, "FAIL") and evidence.startswith("here: memlock 64 KiB"), got
    assert "prlimit --memlock=unlimited" in fix
    assert all(s == "FAIL" for s, _, _ in got["probe"]), got["probe"]
    keep(pair, "memlock", pair.peer.ipv4, "-c", "1", "--size", size, prefix=limited)
    rc, got, _ = doctor(pair.local, pair.peer.ipv4, "-c", "1", "--size", size)
    assert only(got, "memlock")[0] == "PASS"
    assert [s for s, _, _ in got["probe"]] == ["PASS", "PASS"], got["probe"]


def test_mtu_mismatch(pair: Pair, server):
    peer = pair.peer
    assert peer.run(["ip", "link", "set", "dev", peer.netdev, "mtu", "9000"], 60).returncode == 0
    try:
        wait_for(lambda: only(doctor(pair.local, peer.ipv4, "--no-probe")[1], "mtu")[0]
                   == "WARN", "the peer's active MTU at 4096", 180)  # fmt: skip
        rc, got, _ = doctor(pair.local, peer.ipv4, "-c", "1")
        status, evidence, fix = only(got, "mtu")
        assert rc == 1 and "peer: active MTU 4096 (netdev" in evidence and "9000)" in evidence
        assert "connections take the smaller, 1024" in evidence
        assert f"ip link set dev {pair.local.netdev} mtu 9000 here" in fix
        # ibtool's own ping agrees on the smaller MTU: its probes pass, the full-payload one
        # at 1024 too; an application hard-coding 4096 would not, hence the WARN
        assert [s for s, _, _ in got["probe"]] == ["PASS", "PASS", "PASS"], got["probe"]
        keep(pair, "mtu", peer.ipv4, "-c", "1")
    finally:
        peer.run(["ip", "link", "set", "dev", peer.netdev, "mtu", "1500"], timeout=60)
    wait_for(lambda: only(doctor(pair.local, peer.ipv4, "--no-probe")[1], "mtu")[0] == "PASS",
               "one MTU again", 180)  # fmt: skip


def test_a_smaller_mtu_on_the_path_fails_the_full_payload_probe(pair: Pair, server):
    """Both ends at MTU 9000 (active MTU 4096), and the peer dropping RoCE packets over 1,100
    bytes, as a switch port at 1500 would: the 64-byte probes pass, the 4096-byte one fails."""
    peer, local = pair.peer, pair.local
    if peer.run(["sh", "-c", "command -v nft"], timeout=60).returncode != 0:
        pytest.skip("the peer has no nft (nftables)")
    table = ("inet", "ibtool_doctor_mtu")
    for host in (local, peer):
        assert (
            host.run(["ip", "link", "set", "dev", host.netdev, "mtu", "9000"], 60).returncode == 0
        )
    setup = [["nft", "add", "table", *table],
             ["nft", "add", "chain", *table, "input",
              "{ type filter hook input priority 0; policy accept; }"],
             ["nft", "add", "rule", *table, "input", "udp", "dport", "4791", "meta", "length",
              "gt", "1100", "drop"]]  # fmt: skip
    try:
        wait_for(lambda: "here: active MTU 4096" in only(
            doctor(local, peer.ipv4, "--no-probe")[1], "mtu")[1], "both at 4096", 180)  # fmt: skip
        for argv in setup:
            proc = peer.run(argv, timeout=60)
            assert proc.returncode == 0, (argv, proc.stderr)
        rc, got, _ = doctor(local, peer.ipv4, "-c", "2", "--timeout", "3")
        assert only(got, "mtu")[0] == "PASS"
        assert [s for s, _, _ in got["probe"]] == ["PASS", "PASS", "FAIL"], got["probe"]
        _, evidence, fix = got["probe"][2]
        assert evidence.startswith("RC SEND of 4096 bytes (the path MTU): 0/2 answered")
        assert "RC SEND passed, so the path drops packets of 4096 bytes of payload" in evidence
        assert fix.startswith("find the smaller MTU on the path")
        assert rc == 2
        keep(pair, "path-mtu", peer.ipv4, "-c", "2", "--timeout", "3")
    finally:
        peer.run(["nft", "delete", "table", *table], timeout=60)
        for host in (local, peer):
            host.run(["ip", "link", "set", "dev", host.netdev, "mtu", "1500"], timeout=60)
    wait_for(lambda: only(doctor(local, peer.ipv4, "--no-probe")[1], "mtu")[1].startswith(
        "here: active MTU 1024"), "one MTU of 1024 again", 180)  # fmt: skip


def test_two_rxe_devices_in_one_subnet_with_strict_rp_filter(pair: Pair):
    host, nic = pair.local, pair.local.netdev
    keys = ["net.ipv4.conf.all.rp_filter", f"net.ipv4.conf.{nic}.rp_filter"]
    old = host.run(["sysctl", "-n", *keys], timeout=60).stdout.split()
    # A second NIC with an address in the runner's subnet (a /32: the routes stay on the
    # first), with its own rxe device, and strict reverse path filtering.
    host.run(["ip", "link", "add", "ibtdummy0", "type", "dummy"], timeout=60)
    try:
        for argv in (["ip", "addr", "add", "10.77.0.11/32", "dev", "ibtdummy0"],
                     ["ip", "link", "set", "ibtdummy0", "up"],
                     ["rdma", "link", "add", "rxedummy0", "type", "rxe", "netdev", "ibtdummy0"],
                     ["sysctl", "-qw", *(f"{k}=1" for k in keys)]):  # fmt: skip
            proc = host.run(argv, timeout=60)
            assert proc.returncode == 0, (argv, proc.stderr)
        rc, got, _ = doctor(host, "--no-probe", "--dev", f"{host.device}/1")
        status, evidence, fix = only(got, "arp")
        assert (rc, status) == (2, "FAIL"), got["arp"]
        assert f"{nic} shares its subnet with ibtdummy0 and rp_filter is strict (1)" in evidence
        assert f"net.ipv4.conf.{nic}.rp_filter=2" in fix
        keep(pair, "rp-filter", "--no-probe", "--dev", f"{host.device}/1")
        host.run(["sysctl", "-qw", *(f"{k}=2" for k in keys)], timeout=60)
        rc, got, _ = doctor(host, "--no-probe", "--dev", f"{host.device}/1")
        assert only(got, "arp")[0] == "WARN"  # loose: no drops, ARP flux remains
    finally:
        host.run(["rdma", "link", "delete", "rxedummy0"], timeout=60)
        host.run(["ip", "link", "delete", "ibtdummy0"], timeout=60)
        host.run(["sysctl", "-qw", *(f"{k}={v}" for k, v in zip(keys, old))], timeout=60)
    rc, got, _ = doctor(host, "--no-probe", "--dev", f"{host.device}/1")
    assert only(got, "arp")[0] == "PASS"


def test_udp_4791_dropped_on_the_peer(pair: Pair, server):
    peer = pair.peer
    if peer.run(["sh", "-c", "command -v nft"], timeout=60).returncode != 0:
        pytest.skip("the peer has no nft (nftables)")
    table = ("inet", "ibtool_doctor_test")
    setup = [["nft", "add", "table", *table],
             ["nft", "add", "chain", *table, "input",
              "{ type filter hook input priority 0; policy accept; }"],
             ["nft", "add", "rule", *table, "input", "udp", "dport", "4791", "drop"]]  # fmt: skip
    for argv in setup:
        proc = peer.run(argv, timeout=60)
        assert proc.returncode == 0, (argv, proc.stderr)
    try:
        rc, got, _ = doctor(pair.local, peer.ipv4, "-c", "1", "--timeout", "5")
        status, evidence, fix = only(got, "udp4791")
        assert (rc, status) == (2, "FAIL"), got
        assert "peer: 'nft inet ibtool_doctor_test input: " in evidence and "4791" in evidence
        assert "drops RoCE v2 (UDP 4791) on input" in evidence
        assert fix.startswith("on the peer: delete the rule")
        assert all(s == "FAIL" for s, _, _ in got["probe"]), got["probe"]
        keep(pair, "udp4791", peer.ipv4, "-c", "1", "--timeout", "5")
    finally:
        peer.run(["nft", "delete", "table", *table], timeout=60)
    rc, got, _ = doctor(pair.local, peer.ipv4, "-c", "1")
    assert only(got, "udp4791")[0] == "PASS"
    assert [s for s, _, _ in got["probe"]] == ["PASS", "PASS", "PASS"], got["probe"]


def test_a_stock_peer_is_checked_from_this_side(pair: Pair):
    """Against ibv_rc_pingpong: no facts are asked of it, the probe speaks its protocol."""
    peer = pair.peer
    srv = peer.start(
        ["ibv_rc_pingpong", "-d", peer.device, "-g", str(peer.gid_index), "-p", "18741", "-n", "3"]
    )  # fmt: skip  (-s 4096, doctor's default too)
    wait_for(lambda: not srv.running() or peer.listening(18741), "ibv_rc_pingpong", 120)
    rc, got, report = doctor(pair.local, peer.ipv4, "--compat", "rc_pingpong", "--port", "18741",
                             "-c", "3")  # fmt: skip
    assert report["remote"] is None
    assert only(got, "peer")[0] == "SKIP" and "runs a stock rc_pingpong" in only(got, "peer")[1]
    assert [s for s, _, _ in got["probe"]] == ["PASS"], got["probe"]
    srv.finish(timeout=60)
