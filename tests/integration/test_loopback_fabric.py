"""ibtool loopback's fabric operations on the live kernel (rxe): the Q_Key check, a multicast
group joined through rdma_cm (listed while it runs, left after, Ctrl-C included), path migration
refused on RoCE, service levels."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import traceback

import pytest

from tests.integration.test_loopback import ibtool, no_leaks, user_objects  # noqa: F401

pytestmark = pytest.mark.integration

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def results(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert proc.stdout, proc.stderr
    return {r["op"]: r for r in json.loads(proc.stdout)["results"]}


def test_a_wrong_qkey_is_dropped_and_the_port_counts_it(testbed, no_leaks):  # noqa: F811
    proc = ibtool("-j", "loopback", "--ops", "ud_qkey", "--iters", "20", "--size", "256")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = results(proc)["ud_qkey"]
    assert (r["status"], r["iters"], r["dropped"]) == ("PASS", 20, 21)
    assert (r["qkey"], r["wrong_qkey"]) == ("0x11111111", "0x11111110")
    # rxe counts each drop in the port's Q_Key violation counter (ibv_query_port).
    assert r["qkey_viol_cntr_delta"] >= 21, r


def test_a_controlled_qkey_works_for_root_and_is_refused_clearly_to_others(testbed):
    args = ["-m", "ibtool", "-j", "loopback", "--ops", "ud_send,ud_qkey", "--iters", "3"]
    args += ["--qkey", "0x80010000"]
    root = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert root.returncode == 0, root.stdout + root.stderr
    assert {op: r["status"] for op, r in results(root).items()} == {
        "ud_send": "PASS",
        "ud_qkey": "PASS",
    }
    other = subprocess.run(
        [*NOBODY, sys.executable, *args], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in other.stderr
    got = results(other)
    # Linux 6.4 and later (and stable kernels with the backport, as this 6.1) refuse a
    # controlled Q_Key to a process without CAP_NET_RAW, unless privileged-qkey is on.
    if other.returncode == 0:
        assert {r["status"] for r in got.values()} == {"PASS"}
    else:
        assert other.returncode == 1
        for r in got.values():
            assert r["status"] == "FAIL"
            assert r["error"].startswith(
                "Q_Key 0x80010000 is a controlled Q_Key (bit 31 set) and the kernel refused it "
            )
            assert "hint: run with CAP_NET_RAW (root)" in r["error"]


def cm_ids(pid: int) -> list[dict]:
    out = subprocess.run(
        ["rdma", "-j", "res", "show", "cm_id"], capture_output=True, text=True, check=True
    ).stdout
    return [c for c in json.loads(out or "[]") if c.get("pid") == pid]


def ip_groups(netdev: str) -> set[str]:
    """The IPv4 groups `netdev` is a member of (`ip maddress`: "inet  239.255.1.2")."""
    out = subprocess.run(
        ["ip", "maddress", "show", "dev", netdev], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[1] for line in out.splitlines() if line.split()[:1] == ["inet"]}


def test_multicast_members_are_listed_while_it_runs_and_gone_after_ctrl_c(
    testbed, running, wait_for
):
    proc = running("loopback", "--ops", "mcast", "--iters", "1000000", "--size", "64")
    pid = proc.proc.pid
    wait_for(lambda: len(cm_ids(pid)) == 2, "the two member ids in rdma res show cm_id", 120)
    ids = cm_ids(pid)
    assert {(c["ifname"], c["port"], c["ps"], c["src-addr"].rsplit(":", 1)[0]) for c in ids} == {
        (testbed["device"], 1, "UDP", testbed["ipv4"])
    }
    listed = ibtool("-j", "res", "cm_id", "pid", str(pid), timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 2
    high, low = divmod(pid & 0xFFFF, 256)
    group = f"239.255.{high}.{low}"  # the process's group (mcast.group_address)
    assert group in ip_groups(testbed["netdev"])  # rdma_cm joined the netdev to the IP group
    rc, out, err = proc.finish(signal.SIGINT, timeout=120)
    assert rc == 130, out + err
    assert "Traceback" not in err
    wait_for(lambda: not cm_ids(pid), "no rdma_cm id of the stopped loopback")
    assert not [o for o in user_objects("qp") if o.get("pid") == pid]
    assert group not in ip_groups(testbed["netdev"])  # and the group was left


def test_multicast_passes_and_says_what_group(testbed, no_leaks):  # noqa: F811
    proc = ibtool("-j", "loopback", "--ops", "mcast", "--iters", "10", "--size", "1024")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = results(proc)["mcast"]
    assert (r["status"], r["iters"], r["members"], r["mlid"]) == ("PASS", 10, 2, None)
    mgid = ipaddress.IPv6Address(r["mgid"])
    assert mgid.ipv4_mapped == ipaddress.IPv4Address(r["group"])  # RoCE: the IP group itself
    assert r["qkey"] == "0x01234567"  # RDMA_UDP_QKEY, the kernel's for RDMA_PS_UDP


def test_multicast_on_an_ipv6_gid_is_joined_or_reported_unsupported(testbed, no_leaks):  # noqa: F811
    gid = testbed["ipv6_gid_index"]
    proc = ibtool("-j", "loopback", "--ops", "mcast", "--iters", "3", "--gid-index", gid)
    r = results(proc)["mcast"]
    if r["status"] == "UNSUPPORTED":  # Linux 6.1 answers ENOTSUPP for an IPv6 group on RoCE v2
        assert proc.returncode == 0
        assert r["error"].startswith(f"the kernel does not join {r['group']} on ")
        assert r["error"].endswith(": try an IPv4 GID (--gid-index)")
    else:
        assert (proc.returncode, r["status"]) == (0, "PASS"), r


def test_path_migration_is_unsupported_on_roce_with_the_reason(testbed, no_leaks):  # noqa: F811
    proc = ibtool("-j", "loopback", "--ops", "apm", "--iters", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = results(proc)["apm"]
    assert (r["status"], r["auto_path_mig"]) == ("UNSUPPORTED", True)  # rxe reports the flag
    assert r["error"] == (
        f"the kernel refused an alternate path on {testbed['device']}/1, a RoCE port (EINVAL): "
        "Linux takes alternate paths on InfiniBand ports only, though the device reports "
        "AUTO_PATH_MIG"
    )


def test_every_operation_runs_on_a_service_level(testbed, no_leaks):  # noqa: F811
    proc = ibtool("loopback", "--iters", "3", "--sl", "3", "--ops", "send,read,ud_send,ud_qkey")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith(", 3 iterations, sl 3")
    assert lines[1].startswith("note: sl 3: on RoCE the SL has no field on the wire")
    assert [line.split()[1] for line in lines[3:7]] == ["PASS"] * 4


def mine(kind: str) -> list[dict]:
    """This process's objects of `kind` in `rdma res show` (the process lives on: what it
    holds is what it did not destroy, not what the kernel cleaned up at its exit)."""
    return [o for o in user_objects(kind) if o.get("pid") == os.getpid()]


HELD = ("qp", "cq", "mr", "pd", "cm_id")


def in_child(body) -> None:
    """Run `body` in a forked child of this test process, its failure this test's.

    librdmacm keeps a verbs context open on every RDMA device until its process ends, and rxe
    cannot take a context away from a process: had the test process itself used rdma_cm, a
    later test's `rdma link delete` would wait for it forever (the suite hung there)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without pytest's exit handlers
        os.close(r)
        try:
            body()
            said = b""
        except BaseException:
            said = traceback.format_exc().encode() or b"failed"
        os.write(w, said)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    if said:
        pytest.fail(said.decode(), pytrace=False)


def test_every_operation_destroys_what_it_made_before_the_process_ends(testbed):
    in_child(lambda: _every_operation(testbed))


def _every_operation(testbed) -> None:
    from ibtool.rdma.loopback import selftest
    from ibtool.rdma.loopback.results import OPS

    got = selftest.run(
        testbed["device"], 1, int(testbed["ipv4_gid_index"]), OPS, 512, 3, 5.0,
        mcast_source=testbed["ipv4"],
    )  # fmt: skip
    assert {r.op: r.status.value for r in got if r.status.value != "PASS"} == {"apm": "UNSUPPORTED"}
    assert {kind: mine(kind) for kind in HELD} == {kind: [] for kind in HELD}


def test_ctrl_c_in_a_multicast_round_leaves_the_group_before_the_process_ends(testbed, monkeypatch):
    in_child(lambda: _ctrl_c_in_a_round(testbed, monkeypatch))


def _ctrl_c_in_a_round(testbed, monkeypatch) -> None:
    from ibtool.rdma.loopback import mcast, selftest

    rounds: list[list[dict]] = []
    real_round = mcast.Group.round

    def interrupted(self, *args):
        rounds.append(mine("cm_id"))
        if len(rounds) == 3:
            raise KeyboardInterrupt
        return real_round(self, *args)

    monkeypatch.setattr(mcast.Group, "round", interrupted)
    group = mcast.group_address(testbed["ipv4"])
    with pytest.raises(KeyboardInterrupt):
        selftest.run(
            testbed["device"], 1, int(testbed["ipv4_gid_index"]), ["send", "mcast"], 256, 10,
            5.0, mcast_source=testbed["ipv4"],
        )  # fmt: skip
    assert [len(ids) for ids in rounds] == [2, 2, 2]  # the members, while it ran
    assert {kind: mine(kind) for kind in HELD} == {kind: [] for kind in HELD}
    assert group not in ip_groups(testbed["netdev"])
