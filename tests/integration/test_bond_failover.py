"""RoCE failover on the live kernel: an rxe device on an active-backup bond, the active slave
loses its link while `ibtool ping` runs, the bond moves to the other slave, RC retransmission
carries the pings over; `ibtool port` names the slaves and the active one before and after.

Topology, made here and undone after (the guest's own stays as it is):

    rxebond on ibtbond (192.168.78.1, active-backup, miimon 50 ms)
        slaves ibta0 <-- veth --> ibta1 \\
               ibtb0 <-- veth --> ibtb1  }-- ibtbr bridge (192.168.78.2), rxebr on it

Policy routing (the guest's table 77, see tests/testbed/guest.sh) sends the traffic between the
two addresses out of the bond and the bridge rather than through lo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.faults import port_state, sh

pytestmark = pytest.mark.integration
PORT = 18640
BOND, BRIDGE = "ibtbond", "ibtbr"
SLAVES = ("ibta0", "ibtb0")
PEERS = ("ibta1", "ibtb1")
BOND_IP, BRIDGE_IP = "192.168.78.1", "192.168.78.2"
RXE_BOND, RXE_BRIDGE = "rxebond", "rxebr"


def ibtool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *args], capture_output=True, text=True, timeout=timeout
    )


def user_qps() -> list[dict]:
    out = sh("rdma", "-j", "res", "show", "qp")
    return [q for q in json.loads(out or "[]") if "pid" in q]


def _ipv4_gid(device: str, address: str) -> bool:
    suffix = "ffff:" + "".join(f"{int(b):02x}" for b in address.split(".")[:2]) + ":"
    suffix += "".join(f"{int(b):02x}" for b in address.split(".")[2:])
    gids = f"/sys/class/infiniband/{device}/ports/1/gids"
    try:
        names = os.listdir(gids)
    except OSError:
        return False
    for name in names:
        with open(f"{gids}/{name}") as f:
            if f.read().strip().endswith(suffix):
                return True
    return False


def _quietly(*cmd: str) -> None:
    subprocess.run(cmd, capture_output=True, timeout=60)


def _teardown() -> None:
    for rxe in (RXE_BOND, RXE_BRIDGE):
        _quietly("rdma", "link", "delete", rxe)
    for address, dev in ((BRIDGE_IP, BOND), (BOND_IP, BRIDGE)):
        _quietly("ip", "route", "del", address, "dev", dev, "table", "77")
    for link in (BOND, BRIDGE, *SLAVES):
        _quietly("ip", "link", "del", link)


@pytest.fixture
def bonded(wait_for):
    """The topology above, with both rxe devices ACTIVE and holding their IPv4 GIDs."""
    _teardown()  # what a killed earlier run may have left
    try:
        # max_bonds=0: loading the module must not make a bond0 of its own
        sh("modprobe", "bonding", "max_bonds=0")
        sh("ip", "link", "add", BOND, "type", "bond", "mode", "active-backup", "miimon", "50")
        sh("ip", "link", "add", BRIDGE, "type", "bridge", "forward_delay", "0")
        for slave, peer in zip(SLAVES, PEERS):
            sh("ip", "link", "add", slave, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", slave, "master", BOND)
            sh("ip", "link", "set", peer, "master", BRIDGE)
        for dev in (BOND, BRIDGE):
            sh("sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0")
            sh("sysctl", "-qw", f"net.ipv4.conf.{dev}.accept_local=1")
        sh("ip", "addr", "add", f"{BOND_IP}/24", "dev", BOND)
        sh("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
        for dev in (*SLAVES, *PEERS, BOND, BRIDGE):
            sh("ip", "link", "set", dev, "up")
        sh("ip", "route", "add", BRIDGE_IP, "dev", BOND, "src", BOND_IP, "table", "77")
        sh("ip", "route", "add", BOND_IP, "dev", BRIDGE, "src", BRIDGE_IP, "table", "77")
        sh("rdma", "link", "add", RXE_BOND, "type", "rxe", "netdev", BOND)
        sh("rdma", "link", "add", RXE_BRIDGE, "type", "rxe", "netdev", BRIDGE)
        for rxe, address in ((RXE_BOND, BOND_IP), (RXE_BRIDGE, BRIDGE_IP)):
            wait_for(
                lambda rxe=rxe, address=address: (
                    port_state(rxe) == "ACTIVE" and _ipv4_gid(rxe, address)
                ),
                f"{rxe} ACTIVE with the GID of {address}",
            )
        wait_for(lambda: _active_slave() == SLAVES[0], f"{SLAVES[0]} to be the active slave")
        yield
    finally:
        _teardown()


def _active_slave() -> str:
    with open(f"/sys/class/net/{BOND}/bonding/active_slave") as f:
        return f.read().strip()


def _bond_of(device: str) -> dict:
    proc = ibtool("-j", "port", device)
    assert proc.returncode == 0, proc.stderr
    (port,) = json.loads(proc.stdout)
    assert port["netdev"] == BOND
    return port["bond"]


def test_port_names_the_bond_slaves_and_the_active_one(bonded):
    proc = ibtool("port", RXE_BOND)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith(
        f"netdev {BOND} bond active-backup slaves {SLAVES[0]}(active),{SLAVES[1]}"
    ), proc.stdout
    bond = _bond_of(RXE_BOND)
    assert bond == {
        "mode": "active-backup",
        "active_slave": SLAVES[0],
        "slaves": [
            {"name": SLAVES[0], "state": "active", "mii_status": "up"},
            {"name": SLAVES[1], "state": "backup", "mii_status": "up"},
        ],
    }
    # The bridge is no bond.
    assert json.loads(ibtool("-j", "port", RXE_BRIDGE).stdout)[0]["bond"] is None


def test_ping_rides_the_failover_to_the_backup_slave(bonded, running, wait_for):
    server = running("ping", "--server", "--port", str(PORT), "--dev", RXE_BRIDGE)
    server.wait_for_lines(lambda lines: any(line.startswith("listening") for line in lines))
    # Pings back to back for 5 s: one of them is in flight when the link goes.
    client = running(
        "-j", "ping", "127.0.0.1", "--port", str(PORT), "--dev", RXE_BOND,
        "-i", "0.005", "-w", "5", "-W", "5",
    )  # fmt: skip
    wait_for(lambda: len(user_qps()) >= 2, "the client's and the server's QPs", timeout=60)
    time.sleep(1.5)  # replies over the first slave
    moved_at = time.monotonic()
    sh("ip", "link", "set", PEERS[0], "down")  # the first slave's cable, pulled at the far end
    wait_for(lambda: _active_slave() == SLAVES[1], f"the bond to fail over to {SLAVES[1]}")
    failover_s = time.monotonic() - moved_at
    assert port_state(RXE_BOND) == "ACTIVE", "the bond still has a link: the RDMA port stays up"
    bond = _bond_of(RXE_BOND)
    assert bond["active_slave"] == SLAVES[1]
    assert [s["mii_status"] for s in bond["slaves"]] == ["down", "up"]

    rc, out, err = client.finish(timeout=180)
    assert "Traceback" not in err, err
    report = json.loads(out)
    replies = report["replies"]
    rtts = [r["rtt_us"] for r in replies if "rtt_us" in r]
    # the last ping may be one the -w deadline cut short, not one the failover lost
    last = max(r["seq"] for r in replies)
    lost = [r for r in replies if "error" in r and r["seq"] != last]
    # RC retransmission (67 ms per try, 7 tries) carries the pings over; what the failover
    # cost shows, as one round trip far above the others or as pings lost (when the kernel
    # re-made the GID table under the bond, the QP fails and the client builds a new one:
    # the pings after that are answered again).
    assert report["sent"] > 50 and rc == 0, (rc, err)  # -w without -c: replies came back
    assert len(lost) <= 5, (report["sent"], err)
    after = [
        r
        for r in replies
        if r["seq"] > max((x["seq"] for x in lost), default=0)
        and not ("error" in r and r["seq"] == last)
    ]
    assert len(after) > 10 and all("rtt_us" in r for r in after), err
    slowest, typical = max(rtts), sorted(rtts)[len(rtts) // 2]
    assert lost or slowest > 20 * typical, (failover_s, sorted(rtts)[-3:], typical)
    print(
        f"failover {failover_s:.2f} s; {report['sent']} sent, {len(lost)} lost; "
        f"median {typical:.0f} us, slowest {slowest:.0f} us; {err.strip()}"
    )

    server.finish(signal.SIGINT, timeout=60)
    wait_for(lambda: not user_qps(), "every QP to be destroyed")
