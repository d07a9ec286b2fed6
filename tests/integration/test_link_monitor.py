"""`ibtool link add/delete` and `ibtool monitor` on the live kernel, checked against iproute2's
rdma and sysfs.

The testbed's rxe0 (veth0) and rxe1 (veth1) belong to the other tests: new devices go on a veth
pair of their own (ibt0/ibt1), which the fixture deletes afterwards with every device made on
it. The 6.1 rxe driver takes one device per netdev, so a second one on veth0 is refused.
"""

from __future__ import annotations

import errno
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from ibtool.cli import main
from ibtool.errors import ExitCode, IbtoolError
from ibtool.model.records import PhysState
from ibtool.sources.netlink import NldevClient
from tests.integration import faults

pytestmark = pytest.mark.integration

SPARE, SPARE_PEER = "ibt0", "ibt1"
NEW = "rxe9"
SYS = "/sys/class/infiniband"


def ibtool(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return int(code), out.getvalue(), err.getvalue()


def rdma_links() -> dict[str, dict]:
    links = json.loads(faults.sh("rdma", "-j", "link", "show"))
    return {f"{link['ifname']}/{link['port']}": link for link in links}


def delete_quietly(device: str) -> None:
    if os.path.isdir(f"{SYS}/{device}"):
        subprocess.run(["rdma", "link", "delete", device], capture_output=True, timeout=60)
        faults.wait_for(lambda: not os.path.isdir(f"{SYS}/{device}"), f"{device} deleted")


@pytest.fixture
def spare(testbed):
    """A veth pair of its own, both ends up; deleted afterwards with any rxe device on it."""
    faults.sh("ip", "link", "add", SPARE, "type", "veth", "peer", "name", SPARE_PEER)
    try:
        faults.sh("ip", "link", "set", SPARE, "up")
        faults.sh("ip", "link", "set", SPARE_PEER, "up")
        yield SPARE
    finally:
        delete_quietly(NEW)
        faults.sh("ip", "link", "del", SPARE)


def test_add_and_delete_as_rdma_and_sysfs_see_them(spare):
    assert ibtool("link", "add", NEW, "type", "rxe", "netdev", spare) == (0, "", "")
    assert rdma_links()[f"{NEW}/1"]["netdev"] == spare
    with open(f"{SYS}/{NEW}/parent") as f:
        assert f.read().strip() == spare
    code, out, _ = ibtool("link", NEW)
    assert code == 0 and out.startswith(f"{NEW}/1: state ") and f"netdev {spare}" in out

    assert ibtool("link", "delete", NEW) == (0, "", "")
    assert f"{NEW}/1" not in rdma_links()
    assert not os.path.exists(f"{SYS}/{NEW}")


def test_a_netdev_with_an_rxe_device_is_refused_as_rdma_refuses_it(testbed, spare):
    code, out, err = ibtool("link", "add", NEW, "type", "rxe", "netdev", testbed["netdev"])
    assert (code, out) == (ExitCode.FAILED, "")
    assert err.startswith(
        f"ibtool: error: {testbed['netdev']} has an rxe device already ({testbed['device']})"
    )
    rdma = subprocess.run(
        ["rdma", "link", "add", NEW, "type", "rxe", "netdev", testbed["netdev"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rdma.returncode != 0, "rdma created a second rxe device on one netdev"
    assert not os.path.exists(f"{SYS}/{NEW}")


def test_a_name_taken(testbed, spare):
    code, _, err = ibtool("link", "add", testbed["device"], "type", "rxe", "netdev", spare)
    assert code == ExitCode.FAILED
    assert err.startswith(f"ibtool: error: an RDMA device named {testbed['device']} exists")
    # What the kernel itself answers when asked anyway (ibtool asks first):
    with NldevClient() as nl, pytest.raises(IbtoolError) as raised:
        nl.new_link(testbed["device"], "rxe", spare)
    assert raised.value.errno == errno.ENFILE  # ib_register_device's answer to a name in use
    assert not any(_parent(d) == spare for d in os.listdir(SYS))


def _parent(device: str) -> str | None:
    try:
        with open(f"{SYS}/{device}/parent") as f:
            return f.read().strip()
    except OSError:
        return None


def test_an_unknown_netdev(testbed):
    code, _, err = ibtool("link", "add", NEW, "type", "rxe", "netdev", "nosuch0")
    assert code == ExitCode.NOT_FOUND
    assert err.startswith("ibtool: error: no netdev 'nosuch0' (hint: netdevs here: ")
    assert testbed["netdev"] in err


def test_siw_is_not_in_debians_kernel(testbed, spare):
    code, _, err = ibtool("link", "add", "siw0", "type", "siw", "netdev", spare)
    assert code == ExitCode.UNSUPPORTED
    assert err.startswith("ibtool: error: link type 'siw' is not available in this kernel")
    assert not os.path.exists(f"{SYS}/siw0")


def test_rxe_refuses_a_vlan_device(testbed):
    code, _, err = ibtool("link", "add", NEW, "type", "rxe", "netdev", testbed["vlan_netdev"])
    assert code == ExitCode.FAILED
    assert err.startswith(f"ibtool: error: the rxe driver refused {testbed['vlan_netdev']}")
    assert not os.path.exists(f"{SYS}/{NEW}")


def test_delete_of_an_unknown_device(testbed):
    code, _, err = ibtool("link", "delete", "rxe7")
    assert code == ExitCode.NOT_FOUND
    assert err.startswith("ibtool: error: unknown device 'rxe7' (hint: devices here: ")
    assert testbed["device"] in err


WITHOUT_NET_ADMIN = """
import io, json, sys
from ibtool.cli import main
for argv in (["link", "add", "rxe9", "type", "rxe", "netdev", "ibt0"], ["link", "delete", "rxe0"]):
    err = io.StringIO()
    code = main(argv, stdout=io.StringIO(), stderr=err)
    print(json.dumps([code, err.getvalue()]))
"""


def test_without_cap_net_admin(testbed, spare):
    # One Python start for both: it costs about ten seconds in the emulated guest.
    proc = subprocess.run(
        ["setpriv", "--inh-caps=-all", "--bounding-set=-net_admin"]
        + [sys.executable, "-c", WITHOUT_NET_ADMIN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    add, delete = (json.loads(line) for line in proc.stdout.splitlines())
    assert add[0] == delete[0] == ExitCode.PERMISSION, proc.stderr
    assert add[1].startswith("ibtool: error: RDMA_NLDEV_CMD_NEWLINK needs CAP_NET_ADMIN")
    assert delete[1].startswith("ibtool: error: RDMA_NLDEV_CMD_DELLINK needs CAP_NET_ADMIN")
    assert os.path.isdir(f"{SYS}/{testbed['device']}")


# -- monitor ------------------------------------------------------------------------------------


class Monitor:
    """`ibtool -j monitor` running: its JSON lines as they come, from a reader thread."""

    NOTE = "ibtool: warning: monitor events are not supported by this kernel (needs 6.12)"

    def __init__(self, *argv: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ibtool", "-j", "monitor", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def ready(self) -> str:
        """The note it gives on stderr once it has taken its first look (6.1: polling); an
        empty line if it died first."""
        note = self.proc.stderr.readline()
        assert note.startswith(self.NOTE), note
        return note

    def wait(self, what: str, predicate, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} event within {timeout} s; saw {self.seen}")
            try:
                event = json.loads(self.lines.get(timeout=left))
            except queue.Empty:
                continue
            self.seen.append(event)
            if predicate(event):
                return event

    def interrupt(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=60)
        return rc, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def monitor():
    running: list[Monitor] = []

    def start(*argv: str) -> Monitor:
        running.append(Monitor(*argv))
        return running[-1]

    yield start
    for m in running:
        m.kill()


def test_monitor_reports_port_and_device_changes_as_json_lines(testbed, spare, monitor):
    peer, peer_netdev = testbed["peer_device"], testbed["peer_netdev"]
    mon = monitor("--interval", "0.2")
    assert "polling every 0.2 s" in mon.ready()

    def port_state(device, state):
        return lambda e: (
            (e["event"], e["ifname"], e["port"], e["state"])
            == (
                "port_state",
                device,
                1,
                state,
            )
        )

    with faults.link_down(testbed, peer_netdev):
        down = mon.wait(f"{peer}/1 DOWN", port_state(peer, "DOWN"))
        assert down["old_state"] == "ACTIVE"
        with open(f"{SYS}/{peer}/ports/1/phys_state") as f:
            assert down["physical_state"] == PhysState(int(f.read().split(":")[0])).name
        assert down["source"] == "netlink"
    up = mon.wait(f"{peer}/1 ACTIVE", port_state(peer, "ACTIVE"))
    assert up["old_state"] == "DOWN"

    assert ibtool("link", "add", NEW, "type", "rxe", "netdev", spare)[0] == 0
    register = mon.wait(f"register {NEW}", lambda e: e["event"] == "register")
    assert (register["ifname"], register["port"]) == (NEW, None)
    attach = mon.wait(f"netdev_attach {NEW}", lambda e: e["event"] == "netdev_attach")
    assert (attach["ifname"], attach["port"], attach["netdev"]) == (NEW, 1, spare)

    assert ibtool("link", "delete", NEW)[0] == 0
    mon.wait(f"unregister {NEW}", lambda e: (e["event"], e["ifname"]) == ("unregister", NEW))

    rc, err = mon.interrupt()
    assert rc == ExitCode.INTERRUPTED
    assert "Traceback" not in err
    assert err.endswith("ibtool: interrupted\n")
    assert all({"time", "event", "ifname", "port", "source"} <= set(e) for e in mon.seen)
