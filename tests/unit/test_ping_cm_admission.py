"""The rdma_cm servers' limits (`ibtool ping --server --cm`, `--compat rping`): each connection
request's source as the kernel tells it (cm.request_source), and hostile clients refused with a
REJ and a line naming them, before anything is built for them.

The servers run as they are (cm.Listener, cm.Connection, cmping.Gate, the serial loop) on a
stand-in rdma_cm: a World that queues connection requests, makes each a child id when its event
is read, and lists every id the way RDMA_NLDEV_CMD_RES_CM_ID_GET does (the requests still
queued included, numbered in arrival order, as the kernel numbers them). What a request gets
built (CQ, QP, MR, Session) is counted, so a refusal that builds anything shows.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import select
from collections import deque
from types import SimpleNamespace

import pytest

from ibtool.errors import UnsupportedError
from ibtool.model.records import CmIdResource, CmState, Owner, PortSpace
from ibtool.rdma import cm, wire
from ibtool.rdma.ping import cmping, rping
from ibtool.rdma.ping.admission import Admission, Limits, Refused, parse_network
from ibtool.rdma.ping.options import ServeOptions

SERVER, PORT = "192.168.77.1", 18520
EVENTS = {
    name: n
    for n, name in enumerate(
        (
            "RDMA_CM_EVENT_CONNECT_REQUEST",
            "RDMA_CM_EVENT_ESTABLISHED",
            "RDMA_CM_EVENT_DISCONNECTED",
            "RDMA_CM_EVENT_REJECTED",
            "RDMA_CM_EVENT_MULTICAST_JOIN",
        )
    )
}
ASK = wire.encode_cm(wire.CmMessage.REQUEST, wire.CmOffer(wire.Mode.SEND, 64))


def told(data: bytes) -> str:
    return wire.decode_cm(data, wire.CmMessage.REFUSE, 0)


@dataclasses.dataclass
class Request:
    """A client's connection request: its address and port, its private data, and the GID its
    packets come from (on RoCE its address; another one: a client lying in its CM header)."""

    address: str
    port: int = 40000
    data: bytes = ASK
    gid: str | None = None
    idn: int = 0  # the kernel's RES_CM_IDN, given on arrival
    child: object = None  # its id, once its event was read
    lqpn: int | None = None  # accepted


class World:
    """The kernel and librdmacm of one test."""

    def __init__(self):
        self.channels: list[Channel] = []
        self.arrived: list[Request] = []  # in the kernel: requests whose ids are not destroyed
        self.next_idn = 5
        self.built = {"cq": 0, "qp": 0, "mr": 0, "session": 0}
        self.alive = {"cq": set(), "qp": set(), "mr": set(), "session": set()}
        self.rejected: list[tuple[str, bytes]] = []
        # What reaches the channel once a client is accepted: requests and event names; a
        # list of such lists: one for each accept, in turn.
        self.on_accept: list = []
        self.netlink = True
        self.link_layer = 2  # Ethernet (RoCE); 1: InfiniBand
        self.listener: FakeCMID | None = None

    def connect(self, *requests: Request) -> None:
        """Requests arriving: ids in the kernel at once, their events queued."""
        for r in requests:
            r.idn, self.next_idn = self.next_idn, self.next_idn + 1
            self.arrived.append(r)
            self.listener.channel.push(Event(EVENTS["RDMA_CM_EVENT_CONNECT_REQUEST"], r))

    def event(self, name: str) -> Event:
        return Event(EVENTS[name])

    def build(self, kind: str) -> object:
        token = object()
        self.built[kind] += 1
        self.alive[kind].add(token)
        return token

    def destroy(self, kind: str, token) -> None:
        self.alive[kind].discard(token)

    def cm_ids(self, device: str | None) -> list[CmIdResource]:
        if not self.netlink:
            raise UnsupportedError("no RDMA netlink in this kernel")
        me, common = os.getpid(), dict(device="rxe0", device_index=1)
        entries = [
            CmIdResource(state=CmState.LISTEN, ps=PortSpace.TCP, cm_idn=1,
                         src_addr=f"{SERVER}:{PORT}", dst_addr="0.0.0.0:0",
                         owner=Owner(pid=me), **common),
            # another process's: a client's own id, and another server's request
            CmIdResource(state=CmState.CONNECT, ps=PortSpace.TCP, cm_idn=2, lqpn=0x11,
                         src_addr="192.168.77.1:47232", dst_addr=f"{SERVER}:{PORT}",
                         owner=Owner(pid=me + 1), **common),
            CmIdResource(state=CmState.CONNECT, ps=PortSpace.TCP, cm_idn=3,
                         src_addr=f"{SERVER}:{PORT}", dst_addr="10.66.66.66:1",
                         owner=Owner(pid=me + 1), **common),
        ]  # fmt: skip
        for r in reversed(self.arrived):  # any order: the kernel's is not relied upon
            entries.append(
                CmIdResource(state=CmState.CONNECT, ps=PortSpace.TCP, cm_idn=r.idn,
                             lqpn=r.lqpn, src_addr=f"{SERVER}:{PORT}",
                             dst_addr=f"{r.address}:{r.port}", owner=Owner(pid=me), **common)
            )  # fmt: skip
        return entries

    def clean(self) -> bool:
        """Nothing of any request left: no id, CQ, QP, MR or Session."""
        return not self.arrived and not any(self.alive.values())


class Event:
    private_data = b""

    def __init__(self, kind: int, request: Request | None = None):
        self.event_type, self.request = kind, request
        if request is not None:
            self.private_data = request.data

    def event_str(self) -> str:
        return next(k for k, v in EVENTS.items() if v == self.event_type)

    def ack_cm_event(self) -> None:
        pass


class Channel:
    """An event channel whose descriptor (a pipe's) is readable while events are queued."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.events: deque = deque()
        WORLD.channels.append(self)

    def push(self, event: Event) -> None:
        self.events.append(event)
        os.write(self.w, b"e")

    def pop(self) -> Event:
        if not self.events:
            raise AssertionError("a read of the event channel would block forever here")
        os.read(self.r, 1)
        return self.events.popleft()

    def close(self) -> None:
        if self in WORLD.channels:
            WORLD.channels.remove(self)
            os.close(self.r)
            os.close(self.w)


class CMEvent:
    private_data = None  # pyverbs 42: what _require_private_data looks for

    def __new__(cls, channel: Channel):
        return channel.pop()


class ConnParam:
    def __init__(self, **kwargs):
        self.data = b""

    def set_private_data(self, data: bytes) -> None:
        self.data = data


class FakeError(Exception):
    pass


class FakeCMID:
    dev_name, port_num = "rxe0", 1
    context = pd = None

    def __init__(self, creator=None, port_space=None, listen_id=None):
        self.request, self.qp = None, None
        if isinstance(creator, Event):
            self.request = creator.request
            assert self.request in WORLD.arrived
            self.request.child = self
            self.channel = listen_id.channel
        else:
            self.channel = creator
            WORLD.listener = self

    def bind_addr(self, ai) -> None:
        assert (ai.src, ai.src_service) == (SERVER, str(PORT))

    def listen(self, backlog: int) -> None:
        pass

    def reject(self, data: bytes) -> None:
        assert self.request.lqpn is None, "an accepted request rejected"
        WORLD.rejected.append((self.request.address, bytes(data)))

    def accept(self, param) -> None:
        self.request.lqpn = 0x99
        self.channel.push(WORLD.event("RDMA_CM_EVENT_ESTABLISHED"))
        script = WORLD.on_accept
        if script and isinstance(script[0], list):
            script = script.pop(0)
        for item in script:
            if isinstance(item, Request):
                WORLD.connect(item)
            else:
                self.channel.push(WORLD.event(item))

    def init_qp_attr(self, state):
        # RoCE: the GID of the client's end is its IP address, an IPv4 one mapped; pyverbs
        # spells it in 8 groups of 4 digits
        gid = self.request.gid or self.request.address
        dgid = ipaddress.IPv6Address(f"::ffff:{gid}" if "." in gid else gid).exploded
        ah = SimpleNamespace(is_global=1, dgid=dgid, sl=0, traffic_class=0)
        return SimpleNamespace(ah_attr=ah, pkey_index=0, path_mtu=3), 0

    def create_qp(self, init) -> None:
        self.qp = WORLD.build("qp")

    def post_recv(self, mr, length) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def close(self) -> None:
        if self.qp is not None:
            WORLD.destroy("qp", self.qp)
            self.qp = None
        if self.request is not None and self.request in WORLD.arrived:
            WORLD.arrived.remove(self.request)


class Context:
    def __init__(self, cmid):
        cmid.context, self.name = self, cmid.dev_name

    def query_port(self, port: int):
        return SimpleNamespace(link_layer=WORLD.link_layer)


class PD:
    def __init__(self, cmid):
        cmid.pd = self


class CQ:
    def __init__(self, ctx, cqe: int):
        self.token = WORLD.build("cq")

    def poll(self, n: int = 1):
        return 0, []

    def close(self) -> None:
        WORLD.destroy("cq", self.token)


class MR:
    buf, rkey = 0x1000, 0x77

    def __init__(self, pd, size: int, access: int):
        self.token, self.data = WORLD.build("mr"), bytearray(size)

    def close(self) -> None:
        WORLD.destroy("mr", self.token)


class Session:
    """cmping's Session, as far as the server's handshake uses it."""

    def __init__(self, conn, size: int, mode):
        self.size, self.mode, self.token = size, mode, WORLD.build("session")
        self.qp = SimpleNamespace(qp_num=0x99, modify=lambda attr, mask: None)

    def ready(self, offer) -> None:
        pass

    def post_recv(self) -> None:
        pass

    def close(self) -> None:
        WORLD.destroy("session", self.token)


def _answer_pings(session, fd, idle):
    """The echo loop: no ping comes; it returns when a CM event is there."""
    assert select.select([fd], [], [], 10)[0], "no CM event came"
    return None, 0


def _ready(self, timeout) -> bool:
    """The event channel's wait: an event is there or not; a wait for one that can never come
    (none queued, a timeout other than 0) is the operator stopping the server."""
    if not self.channel.events and timeout != 0:
        raise KeyboardInterrupt
    return bool(self.channel.events)


WORLD = World()


@pytest.fixture
def world(monkeypatch):
    global WORLD
    WORLD = World()
    enum = SimpleNamespace
    rdmacm = SimpleNamespace(
        cmid=SimpleNamespace(
            CMEventChannel=Channel, CMEvent=CMEvent, CMID=FakeCMID, ConnParam=ConnParam,
            AddrInfo=lambda **kw: SimpleNamespace(close=lambda: None, **kw),
        ),
        e=enum(
            rdma_cm_event_type=enum(**EVENTS),
            rdma_port_space=enum(RDMA_PS_TCP=0x106),
        ),
    )  # fmt: skip
    pv = SimpleNamespace(
        device=SimpleNamespace(Context=lambda cmid: Context(cmid)),
        pd=SimpleNamespace(PD=PD),
        cq=SimpleNamespace(CQ=CQ),
        mr=SimpleNamespace(MR=MR),
        qp=SimpleNamespace(QPCap=SimpleNamespace, QPInitAttr=SimpleNamespace),
        e=enum(
            ibv_qp_type=enum(IBV_QPT_RC=2),
            ibv_qp_state=enum(IBV_QPS_INIT=1, IBV_QPS_RTR=2, IBV_QPS_RTS=3),
        ),
        Error=FakeError,
    )
    monkeypatch.setattr(cm, "rdmacm", lambda: rdmacm)
    monkeypatch.setattr(cm, "pyverbs", lambda: pv)
    monkeypatch.setattr(cm, "rdma_cm_fds", lambda: {c.r for c in WORLD.channels})
    monkeypatch.setattr(cm, "kernel_cm_ids", lambda device: WORLD.cm_ids(device))
    monkeypatch.setattr(cmping, "Session", Session)
    monkeypatch.setattr(cmping, "answer_pings", _answer_pings)
    monkeypatch.setattr(cm.EventChannel, "ready", _ready)
    yield WORLD
    for channel in list(WORLD.channels):
        channel.close()


def serve_cm(world, *requests: Request, max_clients: int = 1, **limits) -> list[str]:
    """cmping's server with `limits`, until `max_clients` were served; its log."""
    lines: list[str] = []
    real = cm.Listener.__init__

    def listening(self, bind, port):  # the requests arrive once it listens
        real(self, bind, port)
        world.connect(*requests)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(cm.Listener, "__init__", listening)
        try:
            told = dict(max_clients=max_clients, limits=Limits(**limits))
            cmping.serve(ServeOptions(SERVER, PORT, lines.append, **told))
        except KeyboardInterrupt:
            lines.append("server stopped")
    return lines


def serve_rping(world, *requests: Request, max_clients: int = 1, **limits) -> list[str]:
    lines: list[str] = []
    real = cm.Listener.__init__

    def listening(self, bind, port):
        real(self, bind, port)
        world.connect(*requests)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(cm.Listener, "__init__", listening)
        try:
            told = dict(max_clients=max_clients, idle=120.0, limits=Limits(**limits))
            rping.serve(ServeOptions(SERVER, PORT, lines.append, **told))
        except KeyboardInterrupt:
            lines.append("server stopped")
    return lines


def allow(*texts: str) -> tuple:
    return tuple(parse_network(t) for t in texts)


CONNECTED = "client 1 connected on rxe0/1: mode send size 64, mtu 1024, sl 0, tclass 0"


# -- who: --allow --------------------------------------------------------------------------------


def test_a_source_outside_allow_is_refused_with_a_rej_and_never_gets_a_qp(world):
    world.on_accept = ["RDMA_CM_EVENT_DISCONNECTED"]
    lines = serve_cm(
        world, Request("10.9.9.9"), Request("192.168.77.2"), allow=allow("192.168.77.0/24")
    )
    assert lines == [
        f"listening on {SERVER}:{PORT} (rdma_cm), rxe0/1",
        "refused 10.9.9.9: connection not in --allow",
        CONNECTED,
        "client 1 done: 0 pings answered",
    ]
    assert [(a, told(d)) for a, d in world.rejected] == [
        ("10.9.9.9", "refused: connection not in --allow")
    ]
    assert world.built == {"cq": 0, "qp": 0, "mr": 0, "session": 1}  # the allowed one's
    assert world.clean()


def test_an_rping_source_outside_allow_gets_no_cq_qp_or_mr(world):
    world.on_accept = ["RDMA_CM_EVENT_DISCONNECTED"]
    lines = serve_rping(
        world, Request("fd77::9", data=b""), Request("fd77::2", data=b""), allow=allow("fd77::2")
    )
    assert lines == [
        f"listening on {SERVER}:{PORT} (rdma_cm, rping), rxe0/1",
        "refused fd77::9: connection not in --allow",
        "client 1 connected on rxe0/1",
        "client 1 done: 0 pings answered",
    ]
    assert [a for a, _ in world.rejected] == ["fd77::9"]
    assert world.built == {"cq": 1, "qp": 1, "mr": 3, "session": 0}  # the allowed one's
    assert world.clean()


# -- how many, how often: a flood from one source -----------------------------------------------


def test_a_flood_beyond_max_per_source_is_refused_in_two_lines(world):
    # 40 more requests from the served client's address while it is served, and one from
    # another: each turned down (REJ) with its reason, none built anything.
    world.on_accept = [Request("192.168.77.2", 40001 + i) for i in range(40)]
    world.on_accept += [Request("192.168.77.3"), "RDMA_CM_EVENT_DISCONNECTED"]
    lines = serve_cm(world, Request("192.168.77.2"), max_per_source=1, max_rate=1000)
    assert lines == [
        f"listening on {SERVER}:{PORT} (rdma_cm), rxe0/1",
        CONNECTED,
        "refused 192.168.77.2: connection over --max-per-source 1",
        "refused 192.168.77.3: connection while another client is served (one at a time)",
        "client 1 done: 0 pings answered",
    ]
    refusals = [(a, told(d)) for a, d in world.rejected]
    over = "refused: 1 connection from 192.168.77.2 already, the most --max-per-source 1 allows"
    assert refusals[:40] == [("192.168.77.2", over)] * 40
    assert refusals[40:] == [("192.168.77.3", "busy: serving client 1, one at a time")]
    assert world.built["session"] == 1
    assert world.clean()


def test_a_flood_beyond_max_rate_is_refused_while_served_and_after(world):
    # --max-rate 1: a burst of 2. Client 1 is served; the second request, which came during
    # its accept, is turned down as busy (it had its token), the third as over the rate. Five
    # more once the server is free again are over the rate too; another address's is served.
    a, b = "192.168.77.2", "192.168.77.3"
    flood = [Request(a, 40000 + i) for i in range(3)]
    world.on_accept = [
        ["RDMA_CM_EVENT_DISCONNECTED", *(Request(a, 41000 + i) for i in range(5)), Request(b)],
        ["RDMA_CM_EVENT_DISCONNECTED"],
    ]
    lines = serve_cm(world, *flood, max_clients=2, max_rate=1)
    assert lines == [
        f"listening on {SERVER}:{PORT} (rdma_cm), rxe0/1",
        f"refused {a}: connection while another client is served (one at a time)",
        f"refused {a}: connection over --max-rate 1/s",
        CONNECTED,
        "client 1 done: 0 pings answered",
        CONNECTED.replace("client 1", "client 2"),
        "client 2 done: 0 pings answered",
    ]
    assert [(address, told(d)) for address, d in world.rejected] == (
        [(a, "busy: serving client 1, one at a time")]
        + [(a, "refused: connection over --max-rate 1/s")] * 6
    )
    assert world.built["session"] == 2
    assert world.clean()


# -- when the kernel cannot tell -----------------------------------------------------------------

NO_NETLINK = "RDMA netlink: no RDMA netlink in this kernel"


def test_an_unknown_source_is_refused_under_allow_with_the_reason(world):
    world.netlink, world.link_layer = False, 1  # InfiniBand: the path's GID is no address
    lines = serve_cm(world, Request("192.168.77.2"), allow=allow("192.168.77.0/24"))
    assert lines == [
        f"listening on {SERVER}:{PORT} (rdma_cm), rxe0/1",
        f"refused a connection from an unknown address: --allow cannot be matched ({NO_NETLINK})",
        "server stopped",
    ]
    assert [told(d) for _, d in world.rejected] == [
        "refused: this server takes only the networks of its --allow, and cannot tell this "
        "client's address"
    ]
    assert world.built == {"cq": 0, "qp": 0, "mr": 0, "session": 0}
    assert world.clean()


def test_an_unknown_source_without_allow_is_served_and_said_once(world):
    world.netlink, world.link_layer = False, 1
    world.on_accept = [Request("192.168.77.2", 40001), "RDMA_CM_EVENT_DISCONNECTED"]
    lines = serve_cm(world, Request("192.168.77.2"))
    assert lines == [
        f"listening on {SERVER}:{PORT} (rdma_cm), rxe0/1",
        f"a connection from an unknown address ({NO_NETLINK}): only --max-sessions and "
        "--max-memory apply to it",
        CONNECTED,
        "refused a connection from an unknown address: while another client is served (one at "
        f"a time) ({NO_NETLINK})",
        "client 1 done: 0 pings answered",
    ]
    assert [told(d) for _, d in world.rejected] == ["busy: serving client 1, one at a time"]
    assert world.clean()


def test_unknown_sources_are_held_to_the_total_limits():
    lines: list[str] = []
    admission = Admission(Limits(max_sessions=1, max_memory=1 << 20), lines.append)
    first = admission.unknown("no RDMA netlink")
    admission.session(first)
    admission.reserve(first, 1 << 20)
    with pytest.raises(Refused) as refused:
        admission.unknown("no RDMA netlink")
    assert refused.value.tell == "refused: 1 clients served, the most --max-sessions allows"
    admission.release(first)
    second = admission.unknown("no RDMA netlink")
    assert (admission.sessions, admission.memory) == (0, 0)
    admission.release(second)
    assert lines == [
        "a connection from an unknown address (no RDMA netlink): only --max-sessions and "
        "--max-memory apply to it",
        "refused a connection from an unknown address: over --max-sessions 1 (no RDMA netlink)",
    ]


def test_without_netlink_a_roce_requests_path_tells_its_address(world):
    world.netlink = False  # on RoCE the GID the request came from is the client's address
    world.on_accept = ["RDMA_CM_EVENT_DISCONNECTED"]
    lines = serve_cm(
        world, Request("10.9.9.9"), Request("192.168.77.2"), allow=allow("192.168.77.0/24")
    )
    assert lines[1:3] == ["refused 10.9.9.9: connection not in --allow", CONNECTED]
    assert world.clean()


def test_a_request_whose_path_and_cm_header_disagree_has_no_known_source(world):
    # The address in the kernel's id is what the client's CM header says; its packets come
    # from another: nothing can be believed.
    lines = serve_cm(world, Request("192.168.77.2", gid="10.9.9.9"), allow=allow("192.168.77.0/24"))
    assert lines[1] == (
        "refused a connection from an unknown address: --allow cannot be matched (the kernel's "
        "rdma_cm id says 192.168.77.2, the request's path comes from GID 10.9.9.9)"
    )
    assert world.built["session"] == 0
    assert world.clean()


# -- the kernel's ids: which one is the request --------------------------------------------------


def entry(idn, dst="192.168.77.2:40000", src=f"{SERVER}:{PORT}", pid=None, **kw):
    fields = dict(
        state=CmState.CONNECT,
        ps=PortSpace.TCP,
        cm_idn=idn,
        src_addr=src,
        dst_addr=dst,
        owner=Owner(pid=os.getpid() if pid is None else pid),
    )
    fields.update(kw)
    return CmIdResource(device="rxe0", device_index=1, **fields)  # fmt: skip


def test_the_request_is_the_oldest_waiting_id_of_this_process_on_the_listeners_port():
    me = {os.getpid()}
    entries = [
        entry(9, "10.0.0.9:9"),
        entry(4, "10.0.0.4:4", lqpn=0x12),  # accepted: the client being served
        entry(3, "10.0.0.3:3", state=CmState.DISCONNECT),
        entry(2, "10.0.0.2:2", pid=1),  # another process's
        entry(1, "10.0.0.1:1", src=f"{SERVER}:{PORT + 1}"),  # another listener's
        entry(0, "10.0.0.0:0", ps=PortSpace.UDP),
        entry(7, "10.0.0.7:7"),
        entry(8, "10.0.0.8:8", src=f"::ffff:{SERVER}:{PORT}"),  # as an AF_INET6 id says it
    ]
    assert cm.pending_request(entries, SERVER, PORT, me) == cm.Source("10.0.0.7", 7)
    assert cm.pending_request(entries[:1], SERVER, PORT, me) == cm.Source("10.0.0.9", 9)


def test_without_a_waiting_request_or_its_number_the_source_is_unknown():
    me = {os.getpid()}
    none = cm.pending_request([entry(4, lqpn=0x12)], SERVER, PORT, me)
    assert (none.address, none.unknown) == (
        None,
        f"the kernel lists no connection request of this process to {SERVER}:{PORT} "
        "(RDMA_NLDEV_CMD_RES_CM_ID_GET; Linux 5.10 and later name a request's id after its "
        "listener's process)",
    )
    two = cm.pending_request([entry(None), entry(None, "10.0.0.9:9")], SERVER, PORT, me)
    assert two.unknown == (
        "2 connection requests wait, and the kernel numbers no rdma_cm id (RES_CM_IDN: "
        "Linux 5.1 and later)"
    )
    one = cm.pending_request([entry(None)], SERVER, PORT, me)
    assert one == cm.Source("192.168.77.2", 40000)


def test_an_ipv6_request_is_told_with_its_port():
    source = cm.pending_request(
        [entry(3, "fe80::2:41000", src=f"fe80::1:{PORT}")], "fe80::1%veth0", PORT, {os.getpid()}
    )
    assert (source, str(source)) == (cm.Source("fe80::2", 41000), "[fe80::2]:41000")


# -- memory --------------------------------------------------------------------------------------


class Held:
    """A request's Connection, as far as the Gate uses it."""

    cmid, private_data, busy = object(), ASK, b""

    def __init__(self):
        self.kept = []
        self.source = self.on_request = None

    def keep(self, close) -> None:
        self.kept.append(close)


def test_a_request_over_the_memory_a_client_may_register_is_refused_before_it_is(monkeypatch):
    listener = SimpleNamespace(source=lambda cmid: cm.Source("192.168.77.2", 40000))
    lines = []
    gate = cmping.Gate(listener, Limits(), lines.append, lambda conn: 2 << 20)
    conn = Held()
    assert told(gate.admit(conn)) == "refused: 2097152 bytes to register, a client may have 1048576"
    assert lines == ["refused 192.168.77.2: connection over the 1M a client may register"]
    assert conn.kept == [] and gate.admission.held("192.168.77.2") == 0
    assert gate.admission.memory == 0


def test_an_admitted_requests_slot_and_memory_come_back_when_it_closes():
    listener = SimpleNamespace(source=lambda cmid: cm.Source("192.168.77.2", 40000))
    gate = cmping.Gate(listener, Limits(), [].append, cmping.asked_memory)
    conn = Held()
    assert gate.admit(conn) is None
    admission: Admission = gate.admission
    assert (admission.sessions, admission.memory, admission.held("192.168.77.2")) == (1, 64, 1)
    for close in conn.kept:
        close()
    assert (admission.sessions, admission.memory, admission.held("192.168.77.2")) == (0, 0, 0)


# -- what the client says -------------------------------------------------------------------------


def test_an_ibtool_client_says_the_servers_reason_once():
    client = object.__new__(cmping.Client)
    client.server, client.port = f"{SERVER}:{PORT}", PORT
    data = wire.encode_cm(wire.CmMessage.REFUSE, "refused: connection not in --allow")
    got = cm.Event(EVENTS["RDMA_CM_EVENT_REJECTED"], "RDMA_CM_EVENT_REJECTED", None, data)
    assert client._rejected(got).message == (
        f"the ping server at {SERVER}:{PORT} refused this client: connection not in --allow"
    )


def test_an_rping_client_says_an_ibtool_servers_reason():
    data = wire.encode_cm(wire.CmMessage.REFUSE, "refused: connection over --max-rate 10/s")
    e = cm.event_error("RDMA_CM_EVENT_REJECTED", "connect", f"{SERVER}:7174", data)
    assert e.message == (
        f"connect: the server at {SERVER}:7174 refused this client: connection over --max-rate 10/s"
    )
    stock = cm.event_error("RDMA_CM_EVENT_REJECTED", "connect", f"{SERVER}:7174", bytes(148))
    assert (
        stock.message == f"connect: {SERVER}:7174 rejected the connection (RDMA_CM_EVENT_REJECTED)"
    )
