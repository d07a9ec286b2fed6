"""`ibtool monitor`: the kernel's monitor events decoded from messages built with ibtool's own
encoder (no 6.12 kernel here to capture from), what polling reports between two snapshots, the
command against stand-in kernels with and without events, and a real process that Ctrl-C and
SIGTERM stop with exit status 130 and 143."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibtool.errors import DataError, ExitCode, PermissionDeniedError
from ibtool.model.events import Event, Seen, diff
from ibtool.model.records import PhysState, Port, PortState
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import events, messages
from ibtool.sources.netlink.events import EventListener
from ibtool.sources.netlink.monitor import kernel_event
from ibtool.views.events import event_json, event_line
from tests.fixtures import captured_kernel, sysfs_trees
from tests.fixtures.netlink import FakeKernel, ack, client_on, done, reply, string, u8, u32

# -- kernel events ------------------------------------------------------------------------------


def event_message(**attributes) -> bytes:
    """An RDMA_NLDEV_CMD_MONITOR message as the kernel multicasts it: flags 0, sequence 0."""
    named = {f"RDMA_NLDEV_ATTR_{k.upper()}": v for k, v in attributes.items()}
    return messages.encode(A.RDMA_NLDEV_CMD_MONITOR, named, flags=0, seq=0)


def listen(*datagrams: bytes) -> list[dict]:
    """What an EventListener reads when the kernel has sent `datagrams`."""
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with EventListener(sock=ours) as listener:
        for d in datagrams:
            kernel.send(d)
        got = listener.read()
        assert listener.read() == []  # nothing left, and no blocking
    kernel.close()
    return got


KERNEL_EVENTS = [
    (
        dict(dev_index=3, dev_name="rxe9", event_type=0),
        "register rxe9",
        {"event": "register", "ifname": "rxe9", "port": None, "dev_index": 3, "event_type": 0},
    ),
    (
        dict(dev_index=3, dev_name="rxe9", event_type=1),
        "unregister rxe9",
        {"event": "unregister", "ifname": "rxe9", "port": None, "dev_index": 3, "event_type": 1},
    ),
    (
        dict(dev_index=3, dev_name="rxe9", port_index=1, ndev_index=9, ndev_name="veth2",
             event_type=2),
        "netdev_attach rxe9/1 netdev veth2 ifindex 9",
        {"event": "netdev_attach", "ifname": "rxe9", "port": 1, "dev_index": 3,
         "netdev": "veth2", "netdev_index": 9, "event_type": 2},
    ),
    (
        # a detach leaves the port without a netdev: the kernel sends none
        dict(dev_index=3, dev_name="rxe9", port_index=1, event_type=3),
        "netdev_detach rxe9/1",
        {"event": "netdev_detach", "ifname": "rxe9", "port": 1, "dev_index": 3, "event_type": 3},
    ),
    (
        dict(dev_index=3, dev_name="rxe10", event_type=4),
        "rename rxe10",
        {"event": "rename", "ifname": "rxe10", "port": None, "dev_index": 3, "event_type": 4},
    ),
    (
        # NETDEV_RENAME names the netdev only
        dict(ndev_index=9, ndev_name="eth9", event_type=5),
        "netdev_rename - netdev eth9 ifindex 9",
        {"event": "netdev_rename", "ifname": None, "port": None, "netdev": "eth9",
         "netdev_index": 9, "event_type": 5},
    ),
    (
        dict(dev_index=3, dev_name="rxe9", event_type=42),
        "unknown rxe9 event_type 42",
        {"event": "unknown", "ifname": "rxe9", "port": None, "dev_index": 3, "event_type": 42},
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("attributes", "line", "fields"), KERNEL_EVENTS, ids=[e[2]["event"] for e in KERNEL_EVENTS]
)
def test_each_kernel_event_type_decodes_to_a_line_and_a_json_object(attributes, line, fields):
    (decoded,) = listen(event_message(**attributes))
    e = kernel_event(decoded)
    assert event_line(e) == f"- {line}"
    assert event_json(e) == {"time": None, **fields, "source": "kernel"}


def test_several_events_in_one_datagram_and_other_messages_skipped():
    noise = reply(A.RDMA_NLDEV_CMD_GET, u32(1, 0))
    got = listen(
        event_message(dev_index=0, dev_name="rxe0", event_type=1)
        + noise
        + event_message(dev_index=4, dev_name="rxe0", event_type=0),
        event_message(dev_index=4, dev_name="rxe0", port_index=1, event_type=2),
    )
    assert [(g["RDMA_NLDEV_ATTR_EVENT_TYPE"], g["RDMA_NLDEV_ATTR_DEV_INDEX"]) for g in got] == [
        (1, 0),
        (0, 4),
        (2, 4),
    ]


def test_an_event_without_its_type_is_malformed_not_a_crash():
    with pytest.raises(DataError, match="without RDMA_NLDEV_ATTR_EVENT_TYPE"):
        listen(event_message(dev_index=0, dev_name="rxe0"))


def test_a_truncated_event_is_malformed():
    with pytest.raises(DataError, match="truncated"):
        listen(event_message(dev_index=0, dev_name="rxe0", event_type=0)[:-6])


def test_the_latest_poll_names_what_rename_events_leave_out():
    last = snap({("rxe9", 1): view(netdev="veth2", netdev_index=9)}, {"rxe9": 3})
    rename = kernel_event(
        {"RDMA_NLDEV_ATTR_EVENT_TYPE": 4, "RDMA_NLDEV_ATTR_DEV_INDEX": 3,
         "RDMA_NLDEV_ATTR_DEV_NAME": "rxe10"},
        last,
    )  # fmt: skip
    assert event_line(rename) == "- rename rxe10 (was rxe9)"
    assert event_json(rename)["old_ifname"] == "rxe9"
    netdev = kernel_event(
        {"RDMA_NLDEV_ATTR_EVENT_TYPE": 5, "RDMA_NLDEV_ATTR_NDEV_INDEX": 9,
         "RDMA_NLDEV_ATTR_NDEV_NAME": "eth9"},
        last,
    )  # fmt: skip
    assert event_line(netdev) == "- netdev_rename rxe9/1 netdev eth9 (was veth2) ifindex 9"
    assert (event_json(netdev)["netdev"], event_json(netdev)["old_netdev"]) == ("eth9", "veth2")


# -- polling ------------------------------------------------------------------------------------


def view(state: str | None = None, physical_state: str | None = None, **fields) -> dict:
    """A port's fields as a poll sees them; snap() puts it at its device and port."""
    return dict(
        state=PortState[state] if state else None,
        physical_state=PhysState[physical_state] if physical_state else None,
        **fields,
    )


UP = view("ACTIVE", "LINK_UP", netdev="veth0", netdev_index=4)
DOWN = view("DOWN", "DISABLED", netdev="veth0", netdev_index=4)


def snap(ports: dict, devices: dict | None = None) -> Seen:
    if devices is None:
        devices = {d: i for i, d in enumerate(dict.fromkeys(d for d, _ in ports))}
    return Seen.of(devices, [Port(d, n, **fields) for (d, n), fields in ports.items()])


def lines(events: list[Event]) -> list[str]:
    return [event_line(e).removeprefix("- ") for e in events]


def test_a_port_going_down_and_up():
    before, after = snap({("rxe1", 1): UP}), snap({("rxe1", 1): DOWN})
    assert lines(diff(before, after, "netlink")) == [
        "port_state rxe1/1 state DOWN (was ACTIVE) physical_state DISABLED (was LINK_UP)"
    ]
    (e,) = diff(after, before, "netlink")
    assert event_json(e) == {
        "time": None,
        "event": "port_state",
        "ifname": "rxe1",
        "port": 1,
        "state": "ACTIVE",
        "old_state": "DOWN",
        "physical_state": "LINK_UP",
        "old_physical_state": "DISABLED",
        "source": "netlink",
    }


def test_only_the_physical_state_changing():
    training = view("DOWN", "PORT_CONFIGURATION_TRAINING")
    polling = view("DOWN", "POLLING")
    assert lines(diff(snap({("mlx5_0", 1): polling}), snap({("mlx5_0", 1): training}), "x")) == [
        "port_state mlx5_0/1 state DOWN physical_state PORT_CONFIGURATION_TRAINING (was POLLING)"
    ]


def test_an_sm_assigning_a_lid():
    before = view("INIT", "LINK_UP", lid=0, sm_lid=0, lmc=0)
    after = view("INIT", "LINK_UP", lid=28, sm_lid=1, lmc=0)
    (e,) = diff(snap({("mlx5_0", 1): before}), snap({("mlx5_0", 1): after}), "sysfs")
    assert event_line(e) == "- lid mlx5_0/1 lid 28 (was 0) sm_lid 1 (was 0)"
    assert {k: v for k, v in event_json(e).items() if "lid" in k or "lmc" in k} == {
        "lid": 28,
        "old_lid": 0,
        "sm_lid": 1,
        "old_sm_lid": 0,
    }


def test_a_device_appearing_and_leaving():
    empty = Seen({}, {})
    rxe9 = snap({("rxe9", 1): view("DOWN", "DISABLED", netdev="veth2", netdev_index=9)})
    assert lines(diff(empty, rxe9, "netlink")) == [
        "register rxe9",
        "netdev_attach rxe9/1 netdev veth2 ifindex 9",
    ]
    assert lines(diff(rxe9, empty, "netlink")) == ["unregister rxe9"]


def test_a_rename_is_known_by_the_device_index():
    old = snap({("rxe9", 1): UP}, {"rxe9": 3})
    new = snap({("rxe10", 1): DOWN}, {"rxe10": 3})
    assert lines(diff(old, new, "netlink")) == [
        "rename rxe10 (was rxe9)",
        "port_state rxe10/1 state DOWN (was ACTIVE) physical_state DISABLED (was LINK_UP)",
    ]
    # sysfs has no index: a device left, another came
    old, new = snap({("rxe9", 1): UP}, {"rxe9": None}), snap({("rxe10", 1): UP}, {"rxe10": None})
    assert lines(diff(old, new, "sysfs")) == [
        "unregister rxe9",
        "register rxe10",
        "netdev_attach rxe10/1 netdev veth0 ifindex 4",
    ]


def test_netdev_changes():
    renamed = view("ACTIVE", "LINK_UP", netdev="eth0", netdev_index=4)
    other = view("ACTIVE", "LINK_UP", netdev="veth5", netdev_index=12)
    none = view("ACTIVE", "LINK_UP")
    assert lines(diff(snap({("r", 1): UP}), snap({("r", 1): renamed}), "netlink")) == [
        "netdev_rename r/1 netdev eth0 (was veth0) ifindex 4"
    ]
    assert lines(diff(snap({("r", 1): UP}), snap({("r", 1): other}), "netlink")) == [
        "netdev_detach r/1 netdev veth0 ifindex 4",
        "netdev_attach r/1 netdev veth5 ifindex 12",
    ]
    assert lines(diff(snap({("r", 1): UP}), snap({("r", 1): none}), "netlink")) == [
        "netdev_detach r/1 netdev veth0 ifindex 4"
    ]


def test_with_kernel_events_polls_report_only_what_the_kernel_does_not():
    old = snap({("rxe0", 1): UP, ("rxe1", 1): UP})
    new = snap({("rxe0", 1): DOWN, ("rxe2", 1): UP}, {"rxe0": 0, "rxe2": 2})
    assert lines(diff(old, new, "netlink", devices=False)) == [
        "port_state rxe0/1 state DOWN (was ACTIVE) physical_state DISABLED (was LINK_UP)"
    ]


def test_devices_sort_naturally():
    old = Seen({}, {})
    new = snap({("mlx5_10", 1): view(), ("mlx5_2", 1): view()})
    assert lines(diff(old, new, "sysfs")) == ["register mlx5_2", "register mlx5_10"]


# -- the command against stand-in kernels --------------------------------------------------------


def port_dump(index: int, name: str, netdev: str, states, seq: int) -> list[bytes]:
    state, phys = states
    part = reply(
        A.RDMA_NLDEV_CMD_PORT_GET,
        u32(1, index),
        string(2, name),
        u32(3, 1),
        u8(12, state),
        u8(13, phys),
        u32(50, 4 + index),
        string(51, netdev),
        flags=A.NLM_F_MULTI,
        seq=seq,
    )
    return [part, done(seq)]


class Kernel:
    """rxe0 on veth0 whose port goes DOWN at the second poll; SYS_GET with `monitor_mode`."""

    def __init__(self, monitor_mode: int | None):
        self.monitor_mode = monitor_mode
        self.polls = 0

    def answer(self, request: bytes, seq: int) -> list[bytes]:
        command = A.command_of(int.from_bytes(request[4:6], sys.byteorder))
        if command == A.RDMA_NLDEV_CMD_SYS_GET:
            attrs = (u8(66, 1),) + ((u8(103, self.monitor_mode),) if self.monitor_mode else ())
            return [reply(command, *attrs, seq=seq), ack(request)]
        if command == A.RDMA_NLDEV_CMD_GET:
            self.polls += 1
            dev = reply(command, u32(1, 0), string(2, "rxe0"), flags=A.NLM_F_MULTI, seq=seq)
            return [dev, done(seq)]
        states = (4, 5) if self.polls < 2 else (1, 3)
        return port_dump(0, "rxe0", "veth0", states, seq)


@pytest.fixture
def cli(on_host):
    """ibtool on the running host, its RDMA netlink the stand-in kernel's once one is given."""
    return on_host


@pytest.fixture
def stand_in(on_host, monkeypatch):
    def install(monitor_mode, *event_datagrams):
        kernel = Kernel(monitor_mode)
        on_host.seams["netlink"] = client_on(lambda: FakeKernel(kernel.answer))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for d in event_datagrams:
            theirs.send(d)
        monkeypatch.setattr(events, "EventListener", lambda: EventListener(sock=ours))
        return kernel

    return install


def test_a_kernel_without_monitor_events_is_polled_and_says_so_once(cli, stand_in):
    stand_in(None)
    result = cli("-j", "monitor", "--interval", "0.01", "--count", "1", "--timeout", "5")
    assert result.code == 0
    assert result.err == (
        "ibtool: warning: monitor events are not supported by this kernel (needs 6.12); "
        "polling every 0.01 s\n"
    )
    (line,) = result.out.splitlines()
    event = json.loads(line)
    assert (event["event"], event["ifname"], event["state"], event["source"]) == (
        "port_state",
        "rxe0",
        "DOWN",
        "netlink",
    )


def test_a_kernel_with_monitor_events_is_listened_to(cli, stand_in):
    stand_in(
        1,
        event_message(dev_index=3, dev_name="rxe9", event_type=0),
        event_message(dev_index=3, dev_name="rxe9", port_index=1, ndev_index=9,
                      ndev_name="veth2", event_type=2),
    )  # fmt: skip
    result = cli("-j", "monitor", "--interval", "0.01", "--count", "3", "--timeout", "5")
    assert (result.code, result.err) == (0, "")
    got = [json.loads(line) for line in result.out.splitlines()]
    assert [(e["event"], e["ifname"], e["source"]) for e in got] == [
        ("register", "rxe9", "kernel"),
        ("netdev_attach", "rxe9", "kernel"),
        ("port_state", "rxe0", "netlink"),  # no kernel event for that: polled
    ]
    assert all(e["time"] for e in got)


def test_without_cap_net_admin_to_join_the_group_it_polls_and_says_why(cli, stand_in, monkeypatch):
    stand_in(1)

    def refused():
        raise PermissionDeniedError(
            "joining the RDMA monitor group needs CAP_NET_ADMIN", "run as root"
        )

    monkeypatch.setattr(events, "EventListener", refused)
    result = cli("monitor", "--interval", "0.01", "--count", "1", "--timeout", "5")
    assert result.code == 0
    assert result.err == (
        "ibtool: warning: no monitor events: joining the RDMA monitor group needs CAP_NET_ADMIN "
        "(run as root); polling every 0.01 s\n"
    )
    assert " port_state rxe0/1 state DOWN (was ACTIVE) " in result.out


class Overrun:
    """A monitor socket whose receive buffer overflowed once."""

    def __init__(self):
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.overrun = True

    def recvmsg(self, size):
        if self.overrun:
            self.overrun = False
            raise OSError(errno.ENOBUFS, "No buffer space available")
        return self.ours.recvmsg(size)

    def __getattr__(self, name):
        return getattr(self.ours, name)


def test_lost_events_are_warned_about_and_the_next_poll_resyncs(cli, stand_in, monkeypatch):
    stand_in(1)
    overrun = Overrun()
    overrun.kernel.send(b"wake")  # readable, so the listener reads and meets the overrun
    monkeypatch.setattr(events, "EventListener", lambda: EventListener(sock=overrun))
    monkeypatch.setattr(events, "decode", lambda data: [])
    result = cli("monitor", "--interval", "0.01", "--count", "1", "--timeout", "5")
    assert result.code == 0
    assert result.err == (
        "ibtool: warning: the kernel dropped RDMA monitor events (receive buffer full): "
        "the next poll reports device changes too\n"
    )
    assert " port_state rxe0/1 " in result.out


def test_timeout_ends_a_quiet_watch_with_status_0(captured_rxe):
    started = time.monotonic()
    result = captured_rxe("monitor", "--interval", "0.02", "--timeout", "0.2")
    assert (result.code, result.out, result.err) == (0, "", "")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval", "0"],
        ["--interval", "-1"],
        ["--interval", "nan"],
        ["--interval", "often"],
        ["--count", "0"],
        ["--count", "1.5"],
        ["--timeout", "0"],
        ["rxe0"],
    ],
    ids=" ".join,
)
def test_bad_options_are_usage_errors(cli, argv):
    result = cli("monitor", *argv)
    assert result.code == ExitCode.USAGE
    assert "Traceback" not in result.err


# -- what it watches ------------------------------------------------------------------------------


def test_a_snapshot_is_refused_as_it_never_changes(cli):
    """A watch of one moment would wait forever (until --timeout) for nothing."""
    path = sysfs_trees.require_capture(captured_kernel.CAPTURED / "snapshot" / "host.json.gz")
    result = cli("--snapshot", str(path), "monitor", "--timeout", "2")
    assert (result.code, result.out) == (ExitCode.USAGE, "")
    assert result.err == (
        "ibtool: error: ibtool monitor watches for changes, and a snapshot never changes "
        "(hint: ibtool snapshot diff A B shows what changed between two snapshots)\n"
    )


# -- a real process --------------------------------------------------------------------------------


def start(root: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ibtool",
            "--root",
            str(root),
            "-j",
            "monitor",
            "--interval",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_event_after(proc: subprocess.Popen, change) -> dict:
    """Make `change` until the monitor reports an event (it may not have polled yet)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        change()
        if sel.select(timeout=0.5):
            return json.loads(proc.stdout.readline())
    raise AssertionError("no event within 30 s")


@pytest.mark.parametrize(
    "sig, code, said",
    [
        (signal.SIGINT, ExitCode.INTERRUPTED, "ibtool: interrupted\n"),
        (signal.SIGTERM, ExitCode.TERMINATED, "ibtool: terminated\n"),
    ],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_ends_it_with_its_code_and_no_traceback(tmp_path, sig, code, said):
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)
    state = (root / "sys/class/infiniband/mlx5_0/ports/1/state").resolve()
    proc = start(root)
    try:
        flips = iter(["1: DOWN", "4: ACTIVE"] * 100)

        def flip() -> None:
            # Whole values only, as sysfs shows them: write_text truncates first, and a poll
            # that read the empty file in between warned "malformed value ''" (seen in CI).
            tmp = state.with_name("state.new")
            tmp.write_text(next(flips) + "\n")
            os.replace(tmp, state)

        event = first_event_after(proc, flip)
        assert (event["event"], event["ifname"], event["port"]) == ("port_state", "mlx5_0", 1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code
    assert err == said
    assert all(json.loads(line)["event"] == "port_state" for line in out.splitlines())


def test_on_this_host_without_rdma_netlink_it_polls_sysfs():
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, A.NETLINK_RDMA).close()
    except OSError:
        pass
    else:
        pytest.skip("this kernel has RDMA netlink")
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "monitor", "--interval", "0.05", "--timeout", "0.3"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert (proc.returncode, proc.stdout) == (0, "")
    assert proc.stderr == (
        "ibtool: warning: monitor events are not supported by this kernel (no RDMA netlink in "
        "this kernel); polling sysfs every 0.05 s\n"
    )


# -- the sysfs poll, through a Host of its own ---------------------------------------------------


def test_the_sysfs_poll_reads_through_the_engine_and_a_device_removed_while_read_is_no_news(
    tmp_path,
):
    from ibtool.host import Host
    from ibtool.live.engine import Engine, Hosts
    from ibtool.live.watch import Poll

    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    link = root / "sys/class/infiniband/mlx5_0"
    state = link / "ports/1/state"
    warned: list[str] = []
    said: list[str] = []
    removing = []
    opened = []

    class Vanishing(Host):
        def port_numbers(self, device):
            numbers = super().port_numbers(device)
            self.warn(f"{device}: cannot read a file")
            if removing:
                link.rename(link.with_name("gone"))  # unregistered half-way through the read
            return numbers

    def make():
        opened.append(1)
        return Vanishing(root=str(root), warn=said.append)

    engine = Engine(Hosts(make, live=True), ports=False, counters=False)
    poll = Poll(engine, "sysfs", said, warned.append)
    first = poll()
    assert list(first.devices) == ["mlx5_0"]
    assert warned == ["mlx5_0: cannot read a file"]  # a device still there: its warnings given
    state.write_text("1: DOWN\n")
    events = diff(first, poll(), poll.source)
    assert [(e.event, e.device, e.source) for e in events] == [("port_state", "mlx5_0", "sysfs")]
    removing.append(True)
    warned.clear()
    assert poll().devices == {}
    assert warned == []  # what the removed device could not give is not warned about
    assert len(opened) == 3  # the running host: anew at every poll, as the Engine opens it
