"""`ibtool mesh --local` in the single-guest testbed, against its kernel: rxe0 (veth0) and rxe1
(veth1) are two endpoints of this host, and with --all-rails they ping each other through the
veth pair, as the rails of one node do through their switches. Each endpoint's agent serves
pings in a child process and reads its port's retransmission counters; after the mesh no
agent, no server and no RDMA object is left. (Between hosts: test_mesh.py, `make mesh`.)"""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.test_loopback import ibtool, no_leaks  # noqa: F401

pytestmark = pytest.mark.integration


def _ibtool_processes() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        line = " ".join(argv)
        if "-m ibtool" in line and ("mesh --agent" in line or "ping --server" in line):
            found.append(f"{pid} {line}")
    return found


def test_the_rails_of_this_host_ping_each_other(testbed, no_leaks):  # noqa: F811
    before = set(_ibtool_processes())  # another test's server may be running: not the mesh's
    proc = ibtool("-j", "mesh", "--local", "--all-rails", "-c", "10", "--no-save", timeout=600)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdicts"]) == (0, []), proc.stderr
    assert report["settings"]["engine"] == "local"
    names = {e["device"]: e for e in report["endpoints"]}
    assert {"rxe0", "rxe1"} <= set(names)
    assert names["rxe0"]["address"] == testbed["ipv4"]
    probed = [p for p in report["pairs"] if p["state"] == "PROBED"]
    ends = {(p["src"].split("/")[1], p["dst"].split("/")[1]) for p in probed}
    assert {("rxe0", "rxe1"), ("rxe1", "rxe0")} <= ends
    assert all(p["received"] == p["sent"] == 10 and p["health"] == "OK" for p in probed)
    assert set(_ibtool_processes()) - before == set()


def test_rails_pair_by_rank_and_a_lone_rail_pings_nobody(testbed, no_leaks):  # noqa: F811
    """Without --all-rails rail k pings rail k of the other nodes: on one host there are none,
    and the mesh says so without a verdict, UNKNOWN (exit 3): it tested nothing, so it is not
    'healthy'."""
    before = set(_ibtool_processes())
    proc = ibtool("-j", "mesh", "--local", "-c", "3", "--no-save", timeout=600)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["pairs"], report["verdicts"]) == (3, [], []), proc.stderr
    assert report["exit_code"] == 3  # the text's summary line: tests/unit/test_mesh.py
    assert set(_ibtool_processes()) - before == set()


def test_two_ports_in_one_subnet_without_policy_routing_are_one_verdict(testbed, no_leaks):  # noqa: F811
    """rxe0 (192.168.77.1 on veth0) and rxe1 (192.168.77.2 on veth1) share a subnet: without
    the testbed's rule sending this host's own traffic to table 77 (before the local table),
    the kernel routes each address to the other through lo, and RoCE between them never
    leaves the host. The mesh does not probe those pairs: one FAIL for this node naming the
    cause and the fix, no path blamed."""
    from tests.integration.faults import sh

    sh("ip", "rule", "del", "pref", "50")
    try:
        proc = ibtool("-j", "mesh", "--local", "--all-rails", "-c", "3", "--no-save",
                      timeout=600)  # fmt: skip
    finally:
        sh("ip", "rule", "add", "pref", "50", "iif", "lo", "lookup", "77")
    report = json.loads(proc.stdout)
    node = [v for v in report["verdicts"] if v["culprit"] == "node"]
    assert len(node) == 1, (report["verdicts"], proc.stderr)
    assert node[0]["why"].startswith("its ports share a subnet and the kernel routes each one's "
                                     "address through lo"), node[0]  # fmt: skip
    assert "accept_local=1" in node[0]["next"][0]
    assert not [v for v in report["verdicts"] if v["culprit"] == "path"]
    looped = [p for p in report["pairs"] if (p["error"] or "").startswith(
        "not probed: the kernel routes")]  # fmt: skip
    assert {(p["src"].split("/")[1], p["dst"].split("/")[1]) for p in looped} >= {
        ("rxe0", "rxe1"), ("rxe1", "rxe0")}  # fmt: skip
    assert proc.returncode == 2
