"""RC connections through rdma_cm (librdmacm's part of pyverbs), reached by IP address and port.

Active side: event channel -> id (RDMA_PS_TCP) -> resolve address -> resolve route -> CQ, QP on
the id, MRs -> connect -> ESTABLISHED. Passive side: event channel -> id -> bind -> listen, then
per client: CONNECT_REQUEST -> the child id's CQ, QP, MRs -> accept -> ESTABLISHED. rdma_cm picks
the device and port from the address (IPoIB or RoCE), so no GID index is needed.

pyverbs facts this module is shaped by (rdma-core pyverbs/cmid.pyx, device.pyx, pd.pyx, 33 to 65):

- `CMID.close()` destroys the id's QP and the id, and then clears the Context and PD objects the
  id holds (librdmacm owns that device context and its per-device PD). A child id made from a
  CONNECT_REQUEST holds its listener's: each child gets Context and PD objects of its own here,
  or closing the first child would clear the listener's.
- `bind_addr` builds a Context from the bound id's device: on a wildcard address there is none
  (NULL) and pyverbs 44+ dereferences it. The passive side binds to one address only.
- `CMEvent(channel)` blocks in rdma_get_cm_event with no timeout, and CMEventChannel does not
  show its file descriptor: it is found in /proc/self/fd (the rdma_cm device file the channel
  opened) so that waits have deadlines and the CQ polling loop can look at events in passing.
- Every event is acknowledged at once: rdma_destroy_id waits for the acknowledgement of every
  event it reported (librdmacm/cma.c, rdma_destroy_id), a missed one hangs the close. Its
  private data is read before: `CMEvent.private_data` (rdma-core 42 and later) dereferences
  the event, which the acknowledgement frees.
- Connection private data: `ConnParam(data_len=N)` then `set_private_data(data)` (rdma-core
  42); without data_len the buffer has no room and set_private_data does nothing, silently.
  `CMID.reject(private_data)` from rdma-core 42 too.
- A QP not made by rdma_create_qp (an "external" QP, ibv_create_qp on the id's PD) is
  connected by its owner: rdma_init_qp_attr for each state, as librdmacm does for its own
  (cma.c, ucma_modify_qp_rtr and ucma_modify_qp_rts), its number in ConnParam.qp_num; the
  active side then gets RDMA_CM_EVENT_CONNECT_RESPONSE instead of ESTABLISHED and completes
  with rdma_establish (CMID.establish). pyverbs shows no QP object for the id's own QP, so a
  loop that posts prepared work requests (WRITE WITH IMM, say) needs an external one.
- No pyverbs (33 to 65) shows where a connection request comes from: a child id has no peer
  address (CMID.query_addrinfo, rdma-core 62, answers only for an id resolved with
  rdma_resolve_addrinfo). request_source() reads it from the kernel (see there).
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import ipaddress
import os
import select
import socket
import time
from typing import NamedTuple

from ibtool.errors import IbtoolError, UsageError
from ibtool.model.records import CmState, LinkLayer, PortSpace
from ibtool.rdma import wire
from ibtool.rdma.completions import CompletionError, CompletionTimeout
from ibtool.rdma.ladder import DEFAULT_PATH, PathSpec
from ibtool.sources.verbs import pyverbs, rdmacm

RDMA_CM_DEVICE = "/dev/infiniband/rdma_cm"
RAI_PASSIVE = 0x00000001  # librdmacm/rdma_cma.h
RESOLVE_TIMEOUT_MS = 2000  # rping.c's rdma_resolve_addr and rdma_resolve_route timeouts
EVENT_SLACK = 3.0  # an answer to a resolve comes within its timeout; this is our margin
CONNECT_TIMEOUT = 30.0  # the CM retries REQ itself (~4 s per try on rxe); give up after this
IBV_SEND_SIGNALED = 2
IBV_QP_AV, IBV_QP_PATH_MTU = 1 << 7, 1 << 8  # enum ibv_qp_attr_mask (libibverbs/verbs.h)
# ibv_wc_opcode (libibverbs/verbs.h)
IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_RECV = 0, 1, 2, 128
EVENT_CHECK_EVERY = 1024  # empty CQ polls between looks at the CM events (and the clock)
NETLINK_TIMEOUT = 2.0  # s for the kernel's list of rdma_cm ids (it answers at once)
TICK = 1.0  # s between a waiting listener's calls of its tick (Listener.request)


class Disconnected(wire.ConnectionLost):
    """The peer disconnected (RDMA_CM_EVENT_DISCONNECTED) or the device went away."""


class CmTimeout(IbtoolError):
    """No CM event within the time the step is given."""


class Event(NamedTuple):
    kind: int
    name: str
    child: object  # the new id of a connection request, else None
    private_data: bytes  # of a REQ, REP or REJ (padding included); b"" where none came
    ud: object = None  # a MULTICAST_JOIN's UDParam (the group's AH attributes, Q_Key)


def rdma_cm_fds() -> set[int]:
    """The descriptors this process has open on /dev/infiniband/rdma_cm."""
    fds = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == RDMA_CM_DEVICE:
                    fds.add(int(name))
    return fds


class EventChannel:
    """A CM event channel with a select()able descriptor where one could be found."""

    def __init__(self, cm):
        self.cm = cm
        before = rdma_cm_fds()
        self.channel = checked(cm.cmid.CMEventChannel, "create an rdma_cm event channel")
        new = rdma_cm_fds() - before
        self.fd = new.pop() if len(new) == 1 else None  # None: every wait blocks
        self.listener = None  # the listening id whose connection requests arrive here

    def close(self) -> None:
        self.channel.close()

    def ready(self, timeout: float | None) -> bool:
        if self.fd is None:
            return True
        return bool(select.select([self.fd], [], [], timeout)[0])

    def next(self, timeout: float | None) -> Event | None:
        """The next event, acknowledged; None when nothing came within `timeout` seconds. A
        connection request yields its new id, a multicast join the group's UDParam (copied out
        of the event, which the acknowledgement frees)."""
        if not self.ready(timeout):
            return None
        event = checked(lambda: self.cm.cmid.CMEvent(self.channel), "read a CM event")
        types = self.cm.e.rdma_cm_event_type
        try:
            kind, name, child, ud = event.event_type, event.event_str(), None, None
            data = bytes(getattr(event, "private_data", b""))
            if kind == types.RDMA_CM_EVENT_CONNECT_REQUEST:
                child = self.cm.cmid.CMID(creator=event, listen_id=self.listener)
            elif kind == getattr(types, "RDMA_CM_EVENT_MULTICAST_JOIN", None):
                ud = self.cm.cmid.UDParam(event)
        finally:
            event.ack_cm_event()
        if child is not None:
            try:
                _adopt(child)
            except BaseException:
                reject_request(child)
                raise
        return Event(kind, name, child, data, ud)


def _adopt(child) -> None:
    """Context and PD objects of the child id's own (see the module's docstring): closing it
    then clears these, not its listener's. They wrap librdmacm's device context and PD:
    nothing is allocated."""
    pv = pyverbs()
    pv.device.Context(cmid=child)
    pv.pd.PD(child)


def checked(fn, what: str):
    """fn(), a pyverbs error raised as an IbtoolError that says `what` failed."""
    try:
        return fn()
    except pyverbs().Error as e:
        raise IbtoolError(f"{what}: {e}") from None


class _Holder(contextlib.AbstractContextManager):
    """What holds its objects on `_stack`: closed in reverse by close() or the `with`."""

    _stack: contextlib.ExitStack

    def close(self) -> None:
        self._stack.close()

    def __exit__(self, *exc):
        self.close()
        return False


class Connection(_Holder):
    """One RC connection over rdma_cm and everything it owns (QP, CQ, MRs, the id, and on the
    active side the event channel). close() destroys them on every path: MRs, then the id with
    its QP, then the CQ (a CQ with a QP on it cannot be destroyed), then the channel."""

    def __init__(self, cm, channel: EventChannel, cmid, stack: contextlib.ExitStack):
        self.cm, self.pv, self.channel, self.cmid = cm, pyverbs(), channel, cmid
        self._stack = stack
        self.established = False
        self.disconnected = False
        self.private_data = b""  # the peer's, from its connection request
        self.busy = b""  # private data of the REJ that turns down another client meanwhile
        # What turns down another client's request meanwhile (its child id); None: a REJ with
        # `busy`, if set, and the id destroyed.
        self.on_request = None
        self.source: Source | None = None  # where the request came from (passive side)

    @property
    def ctx(self):
        return self.cmid.context

    @property
    def pd(self):
        return self.cmid.pd

    def keep(self, close) -> None:
        """Call `close` on close(), before the id is destroyed (librdmacm's PD and device
        context, which the id holds, go with the last id of the device)."""
        self._stack.callback(close)

    @property
    def device(self) -> str:
        return device_of(self.cmid)

    def checked(self, fn, what: str):
        """fn() on this connection's verbs, a pyverbs error raised as an IbtoolError that says
        `what` failed."""
        try:
            return fn()
        except self.pv.Error as e:
            raise IbtoolError(f"{what}: {e}") from None

    def build_qp(self, send_wr: int, recv_wr: int) -> None:
        pv, cmid = self.pv, self.cmid
        self.cq = self.checked(lambda: pv.cq.CQ(cmid.context, send_wr + recv_wr), "create CQ")
        self._stack.callback(self.cq.close)
        cap = pv.qp.QPCap(max_send_wr=send_wr, max_recv_wr=recv_wr, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(
            qp_type=pv.e.ibv_qp_type.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0
        )
        # The QP is the id's (rdma_create_qp): CMID.close destroys it, so the id is closed here
        # too, before the CQ; closing it again later does nothing.
        self._stack.callback(cmid.close)
        self.checked(lambda: cmid.create_qp(init), "create the RC QP")

    def mr(self, size: int, access: int):
        mr = self.checked(
            lambda: self.pv.mr.MR(self.cmid.pd, size, access), f"register a {size}-byte MR"
        )
        self._stack.callback(mr.close)
        return mr

    def post_recv(self, mr, length: int) -> None:
        self.checked(lambda: self.cmid.post_recv(mr, length), "post a receive")

    def post_send(self, mr, length: int) -> None:
        self.checked(lambda: self.cmid.post_send(mr, IBV_SEND_SIGNALED, length), "post a send")

    def post_read(self, mr, length: int, addr: int, rkey: int) -> None:
        self.checked(
            lambda: self.cmid.post_read(mr, length, addr, rkey, IBV_SEND_SIGNALED),
            "post an RDMA READ",
        )

    def post_write(self, mr, length: int, addr: int, rkey: int) -> None:
        self.checked(
            lambda: self.cmid.post_write(mr, length, addr, rkey, IBV_SEND_SIGNALED),
            "post an RDMA WRITE",
        )

    def connect_qp(self, qp, path: PathSpec = DEFAULT_PATH) -> PathSpec:
        """Move an external QP (see the module's docstring) to RTS on the path and numbers
        rdma_cm negotiated, as librdmacm moves its own (cma.c, ucma_modify_qp_rtr and
        ucma_modify_qp_rts): INIT first, even from INIT, since only once the CM has a
        connection does rdma_init_qp_attr give the access flags (REMOTE_WRITE, and READ and
        atomics with responder resources: linux ib_cm.c, cm_init_qp_init_attr).

        What the operator chose in `path` overrides rdma_cm's choice at RTR: a service level
        and a traffic class other than 0, a smaller MTU (the P_Key is the address's). Returns
        the path the QP was connected on."""
        states = self.pv.e.ibv_qp_state
        steps = (
            (states.IBV_QPS_INIT, "INIT"),
            (states.IBV_QPS_RTR, "RTR"),
            (states.IBV_QPS_RTS, "RTS"),
        )
        used, pkey_index = path, 0
        for state, name in steps:
            try:
                attr, mask = self.cmid.init_qp_attr(state)
                if name == "INIT":
                    pkey_index = attr.pkey_index
                elif name == "RTR":
                    used = choose_path(attr, path, pkey_index)
                    if self._infiniband():
                        # cma.c, ucma_modify_qp_rtr: "Workaround for rdma_ucm kernel bug: mask
                        # off qp_attr_mask bits 21-24 which are used for RoCE".
                        mask &= ~0xE00000
                qp.modify(attr, mask)
            except self.pv.Error as e:
                raise IbtoolError(f"move the QP to {name} (rdma_init_qp_attr): {e}") from None
        return used

    def path_used(self) -> PathSpec | None:
        """The path of the id's own QP (rdma_create_qp), which librdmacm moved to RTS on
        rdma_cm's choices: its SL, traffic class and MTU, read back with ibv_query_qp; None
        where this pyverbs cannot query it (CMID.query_qp) or the query fails."""
        if not hasattr(self.cmid, "query_qp"):
            return None
        try:
            attr, _ = self.cmid.query_qp(IBV_QP_AV | IBV_QP_PATH_MTU)
        except self.pv.Error:
            return None
        return _path_of(attr)

    def _infiniband(self) -> bool:
        return self.ctx.query_port(self.cmid.port_num).link_layer == LinkLayer.INFINIBAND

    def await_established(self, what: str, peer: str) -> None:
        """Wait for RDMA_CM_EVENT_ESTABLISHED after `what` (connect, accept) with `peer`; from
        then on close() disconnects first."""
        self.expect_event("RDMA_CM_EVENT_ESTABLISHED", CONNECT_TIMEOUT, what, peer)
        self.established = True
        self._stack.callback(self.disconnect)

    def disconnect(self) -> None:
        """rdma_disconnect, once established; an id already gone is no error."""
        # rdma_disconnect moves our QP to the error state and tells the peer (a DREQ): its
        # rping sees RDMA_CM_EVENT_DISCONNECTED and ends.
        with contextlib.suppress(self.pv.Error):
            self.cmid.disconnect()

    def refuse(self, private_data: bytes) -> None:
        """Reject the connection request with `private_data` in the REJ (rdma_reject, pyverbs
        38 and later; before, destroying the id rejects it, without data), then destroy
        everything this connection holds."""
        if private_data:
            with contextlib.suppress(Exception):
                self.cmid.reject(private_data)
        self.close()

    def turn_down(self, child) -> None:
        """Another client's connection request while this connection is in use."""
        if self.on_request is not None:
            self.on_request(child)
            return
        if self.busy:  # one client at a time: our reason in the REJ
            with contextlib.suppress(Exception):
                child.reject(self.busy)
        reject_request(child)

    def expect_event(self, wanted: str, timeout: float, what: str, peer: str) -> None:
        """The next CM event must be `wanted` (an rdma_cm_event_type name) within `timeout`
        seconds; another, or none, is an error naming `what` and `peer`. A connection request
        meanwhile is turned down (turn_down), and the wait goes on: a flood of requests cannot
        break the one in progress."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.channel.next(max(0.0, deadline - time.monotonic()))
            if got is None:
                raise CmTimeout(f"{what}: no answer from {peer} within {timeout:.0f} s")
            if got.child is None:
                break
            self.turn_down(got.child)
        if got.kind != getattr(self.cm.e.rdma_cm_event_type, wanted):
            raise event_error(got.name, what, peer, got.private_data)

    def wait(self, opcode: int, deadline: float | None, what: str):
        """The next completion of `opcode` (others, a signaled send's, are passed over),
        busy-polling as ibv_rc_pingpong does; the CM events are looked at every
        EVENT_CHECK_EVERY empty polls, so a peer that disconnects ends the wait."""
        poll, spins = self.cq.poll, 0
        while True:
            n, wcs = poll(1)
            if n:
                wc = wcs[0]
                if wc.status:
                    self.check_events()  # a flush after the peer left: say that instead
                    raise CompletionError(wc, what)
                if wc.opcode == opcode:
                    return wc
                continue
            spins += 1
            if spins % EVENT_CHECK_EVERY == 0:
                self.check_events()
                if deadline is not None and time.monotonic() > deadline:
                    raise CompletionTimeout(f"{what}: no completion before the timeout")

    def check_events(self) -> None:
        """Handle the CM events that came (none: return at once)."""
        while self.channel.fd is not None and self.channel.ready(0):
            got = self.channel.next(0)
            kind, name, child = got.kind, got.name, got.child
            if child is not None:
                self.turn_down(child)  # one client at a time
                continue
            types = self.cm.e.rdma_cm_event_type
            if kind == types.RDMA_CM_EVENT_DISCONNECTED:
                self.disconnected = True
                raise Disconnected("the peer disconnected")
            if kind != types.RDMA_CM_EVENT_ESTABLISHED:
                raise Disconnected(f"the connection ended: {name}")


def choose_path(attr, path: PathSpec, pkey_index: int) -> PathSpec:
    """Put the operator's choices of `path` into rdma_cm's RTR attributes `attr`; the path
    they then describe. The SL of an InfiniBand path comes from the SA's path record, on RoCE
    from the TOS (the netdev's priority map): 0 here leaves it so."""
    ah = attr.ah_attr  # a copy: set back below
    if path.sl:
        ah.sl = path.sl
    if path.traffic_class and ah.is_global:
        ah.traffic_class = path.traffic_class
    attr.ah_attr = ah
    if path.mtu is not None:
        attr.path_mtu = min(attr.path_mtu, path.mtu)
    return _path_of(attr, pkey_index)


def _path_of(attr, pkey_index: int = 0) -> PathSpec:
    """The path a QP's attributes (ibv_qp_attr: its AV and path MTU) put it on."""
    ah = attr.ah_attr
    return PathSpec(ah.sl, ah.traffic_class if ah.is_global else 0, attr.path_mtu, pkey_index)


def device_of(cmid) -> str:
    """DEV/PORT of a bound or resolved id (CMID.dev_name and port_num: rdma-core 34 and later;
    before, the name of the Context pyverbs built for the id, if it has one)."""
    name = getattr(cmid, "dev_name", None) or getattr(cmid.context, "name", None) or "?"
    port = getattr(cmid, "port_num", None)
    return f"{name}/{port}" if port else name


def reject_request(child) -> None:
    """Turn down a connection request (the id rdma_cm made for it) that nobody will serve."""
    # Destroying an id that has not accepted its request rejects it (the kernel sends a REJ).
    with contextlib.suppress(Exception):
        child.close()


def event_error(name: str, what: str, peer: str, private_data: bytes = b"") -> IbtoolError:
    """The error an unexpected RDMA CM event `name` during `what` with `peer` means; an ibtool
    server's REJ carries its reason in the private data."""
    if name.endswith("REJECTED"):
        try:  # an ibtool server's REJ says why
            reason = wire.decode_cm(private_data, wire.CmMessage.REFUSE, 0)
        except wire.ProtocolError:
            pass
        else:
            return IbtoolError(f"{what}: the server at {peer} refused this client: {told(reason)}")
        return IbtoolError(
            f"{what}: {peer} rejected the connection ({name})",
            f"is an rping server listening at {peer}? start `rping -s -a ADDR -p PORT` or "
            "`ibtool ping --server --compat rping --bind ADDR` there",
        )
    if name.endswith(("UNREACHABLE", "CONNECT_ERROR")):
        return IbtoolError(
            f"{what}: {peer} did not answer ({name})",
            "is the peer up, and its RDMA port ACTIVE (rdma link)?",
        )
    return IbtoolError(f"{what}: {name}")


def told(reason: str) -> str:
    """A server's reason as a client says it: "refused: " is in the sentence already."""
    return reason[len("refused: ") :] if reason.startswith("refused: ") else reason


def addr_info(cm, what: str, port_space=None, **kw):
    """An AddrInfo of the TCP port space, or of `port_space`."""
    if port_space is None:
        port_space = cm.e.rdma_port_space.RDMA_PS_TCP
    try:
        return cm.cmid.AddrInfo(port_space=port_space, **kw)
    except pyverbs().Error as e:
        raise IbtoolError(f"{what}: {e}", "give an IP address or a host name") from None


# -- active side -------------------------------------------------------------------------------


def dial(host: str, port: int, send_wr: int, recv_wr: int) -> Connection:
    """The active side up to its QP (resolved, not connected): the caller registers its MRs,
    posts its receives, then calls connect_to()."""
    return _with_qp(resolve(host, port), send_wr, recv_wr)


def _with_qp(conn: Connection, send_wr: int, recv_wr: int) -> Connection:
    """`conn` with its CQ and QP built, or closed if they cannot be."""
    try:
        conn.build_qp(send_wr, recv_wr)
    except BaseException:
        conn.close()
        raise
    return conn


def resolve(host: str, port: int) -> Connection:
    """The active side's id, address and route resolved: no QP yet."""
    cm = rdmacm()
    peer = peer_name(host, port)
    stack = contextlib.ExitStack()
    try:
        channel = EventChannel(cm)
        stack.callback(channel.close)
        cmid = checked(
            lambda: cm.cmid.CMID(creator=channel.channel, port_space=_tcp(cm)),
            "create an rdma_cm id",
        )
        stack.callback(cmid.close)
        conn = Connection(cm, channel, cmid, stack)
        ai = addr_info(cm, f"cannot resolve {host}", dst=host, dst_service=str(port))
        stack.callback(ai.close)
        try:
            cmid.resolve_addr(ai, RESOLVE_TIMEOUT_MS)
        except conn.pv.Error as e:
            raise IbtoolError(
                f"cannot resolve {peer} to an RDMA device: {e}", _route_hint(host)
            ) from None
        _resolved(conn, "RDMA_CM_EVENT_ADDR_RESOLVED", peer, host)
        conn.checked(lambda: cmid.resolve_route(RESOLVE_TIMEOUT_MS), f"resolve a route to {peer}")
        _resolved(conn, "RDMA_CM_EVENT_ROUTE_RESOLVED", peer, host)
        return conn
    except BaseException:
        stack.close()
        raise


def _resolved(conn: Connection, wanted: str, peer: str, host: str) -> None:
    try:
        conn.expect_event(wanted, RESOLVE_TIMEOUT_MS / 1000 + EVENT_SLACK, f"resolve {peer}", peer)
    except IbtoolError as e:
        raise IbtoolError(
            f"cannot resolve {peer} to an RDMA device: {e.message}", _route_hint(host)
        ) from None


def _route_hint(host: str) -> str:
    return (
        f"{host} must be reachable through an IPoIB or RoCE netdev of this host "
        f"(`ip route get {host}`, `rdma link` shows which netdev each RDMA port has)"
    )


def connect_to(conn: Connection, host: str, port: int) -> None:
    # rping.c, rping_init_conn_param: one outstanding RDMA READ each way, retries at 7
    # (rnr_retry 7: retry forever while the peer has no receive posted).
    param = conn.cm.cmid.ConnParam(resources=1, depth=1, retry=7, rnr_retry=7)
    conn.checked(lambda: conn.cmid.connect(param), f"connect to {peer_name(host, port)}")
    conn.await_established("connect", peer_name(host, port))


def peer_name(host: str, port: int) -> str:
    """HOST:PORT as messages name a peer, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tcp(cm):
    return cm.e.rdma_port_space.RDMA_PS_TCP


# -- passive side ------------------------------------------------------------------------------


class Listener(_Holder):
    """A listening id on one address and port; accept() hands out one client's Connection."""

    def __init__(self, bind: str, port: int):
        self.cm = cm = rdmacm()
        self.bind, self.where, self.port = bind, peer_name(bind, port), port
        self.address = address = _numeric(bind, port)
        self._stack = contextlib.ExitStack()
        try:
            self.channel = EventChannel(cm)
            self._stack.callback(self.channel.close)
            self.cmid = checked(
                lambda: cm.cmid.CMID(creator=self.channel.channel, port_space=_tcp(cm)),
                "create an rdma_cm id",
            )
            self._stack.callback(self.cmid.close)
            self.channel.listener = self.cmid
            ai = addr_info(
                cm, f"--bind {bind}", src=address, src_service=str(port), flags=RAI_PASSIVE
            )
            self._stack.callback(ai.close)
            self._bind(ai)
            try:
                self.cmid.listen(3)  # rping.c's backlog
            except pyverbs().Error as e:
                raise IbtoolError(f"cannot listen on {self.where}: {e}") from None
            self.device = device_of(self.cmid)
        except BaseException:
            self._stack.close()
            raise

    def _bind(self, ai) -> None:
        try:
            self.cmid.bind_addr(ai)
        except pyverbs().Error as e:
            code = getattr(e, "error_code", 0)
            if code == errno_mod.EADDRINUSE:
                raise IbtoolError(
                    f"cannot listen on {self.where}: {os.strerror(code)}",
                    "another rping server has the port (`rdma res show cm_id` shows which): "
                    "stop it, or give both sides another --port",
                ) from None
            if code in (errno_mod.ENODEV, errno_mod.EADDRNOTAVAIL):
                raise UsageError(
                    f"--bind {self.bind}: no RDMA device has this address ({os.strerror(code)})",
                    "give the IP address of an IPoIB or RoCE netdev (`rdma link` names them)",
                ) from None
            raise IbtoolError(f"cannot listen on {self.where}: {e}") from None

    def next_request(self, send_wr: int, recv_wr: int, admit=None, tick=None) -> Connection:
        """Wait for a client's connection request that `admit` lets in (see request()); its
        Connection with CQ and QP built (the caller registers its MRs, posts its receives,
        then calls accept())."""
        return _with_qp(self.request(admit, tick), send_wr, recv_wr)

    def request(self, admit=None, tick=None) -> Connection:
        """Wait for a client's connection request: its Connection, no QP yet, the client's
        private data in `private_data`. `admit(conn)`, if given, is asked first, before
        anything is built for it: None lets the request in, bytes turn it down (a REJ with
        them as private data; its id destroyed), and the next one is waited for. `tick()`,
        if given, is called about once a second meanwhile."""
        while True:
            got = self.channel.next(None if tick is None else TICK)
            if tick is not None:
                tick()
            if got is None or got.child is None:
                continue  # nothing else is expected on a listening id
            child = got.child
            stack = contextlib.ExitStack()
            stack.callback(reject_request, child)  # until accepted, closing it rejects the request
            try:
                conn = Connection(self.cm, self.channel, child, stack)
                conn.private_data = got.private_data
                refusal = None if admit is None else admit(conn)
            except BaseException:
                stack.close()
                raise
            if refusal is None:
                return conn
            conn.refuse(refusal)

    def source(self, cmid) -> Source:
        """Where the connection request of `cmid` (a child id) comes from: request_source()."""
        return request_source(cmid, self.address, self.port)

    def accept(self, conn: Connection) -> None:
        param = self.cm.cmid.ConnParam(resources=1, depth=1, retry=7, rnr_retry=7)
        conn.checked(lambda: conn.cmid.accept(param), "accept the connection")
        conn.await_established("accept", "the client")


def _numeric(bind: str, port: int) -> str:
    """`bind` as one numeric address; a wildcard is refused (see the module's docstring)."""
    if not bind:
        raise UsageError(
            "--compat rping --server needs --bind ADDR",
            "give the IP address of the IPoIB or RoCE netdev to serve on (rdma_cm picks the "
            "RDMA device from it)",
        )
    try:
        infos = socket.getaddrinfo(bind, port, 0, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(
            f"--bind {bind}: not an address ({e.strerror})", "give an IP address of this host"
        ) from None
    address = infos[0][4][0]
    if ipaddress.ip_address(address.split("%")[0]).is_unspecified:
        raise UsageError(
            f"--bind {bind}: a wildcard address names no RDMA device",
            "give the IP address of the IPoIB or RoCE netdev to serve on",
        )
    return address


# -- where a connection request comes from -----------------------------------------------------


class Source(NamedTuple):
    """Where a connection request comes from: `address` (an IP address, as text) and `port`
    (None where only the address is known), or address None and `unknown`, why nobody can
    tell."""

    address: str | None
    port: int | None = None
    unknown: str = ""

    def __str__(self) -> str:
        if self.address is None:
            return "an unknown address"
        return self.address if self.port is None else peer_name(self.address, self.port)


def request_source(cmid, address: str, port: int) -> Source:
    """The source of the connection request whose id is `cmid` (a CONNECT_REQUEST's child),
    made to the listener on `address` and `port`.

    pyverbs shows no peer address (the module's docstring), the kernel does: its rdma_cm ids
    in the RDMA netlink resource dump (RDMA_NLDEV_CMD_RES_CM_ID_GET, what `rdma res show
    cm_id` prints; include/uapi/rdma/rdma_netlink.h), each with RDMA_NLDEV_ATTR_RES_SRC_ADDR
    and _DST_ADDR. The request's is found by what both sides know (pending_request). On RoCE
    the request's path says it too: its GID is the client's IP address (path_address); the
    two must agree, and the path's serves where the kernel's list cannot (no RDMA netlink, a
    kernel before 5.10)."""
    context = getattr(cmid, "context", None)
    device = getattr(cmid, "dev_name", None) or getattr(context, "name", None)
    try:
        kernel = pending_request(kernel_cm_ids(device), address, port, own_tasks())
    except IbtoolError as e:
        kernel = Source(None, None, f"RDMA netlink: {e.message}")
    path = path_address(cmid)
    if path is None:
        return kernel
    if kernel.address is None:
        return Source(path)
    if _ip(kernel.address) != _ip(path):
        return Source(
            None,
            None,
            f"the kernel's rdma_cm id says {kernel.address}, the request's path comes from "
            f"GID {path}",
        )
    return kernel


def kernel_cm_ids(device: str | None) -> list:
    """The kernel's rdma_cm ids (CmIdResource) of `device`, of every device if None: a
    RES_CM_ID_GET dump of each (there is no all-devices dump); an IbtoolError if the kernel
    cannot say (no RDMA netlink, a kernel before 4.17)."""
    from ibtool.sources.netlink import NldevClient, records

    with NldevClient(timeout=NETLINK_TIMEOUT) as nl:
        indexes = [
            r.get("RDMA_NLDEV_ATTR_DEV_INDEX")
            for r in nl.devices()
            if device is None or r.get("RDMA_NLDEV_ATTR_DEV_NAME") == device
        ]
        found = []
        for index in indexes:
            if index is not None:
                found += records.resources("cm_id", nl.resource_dump("cm_id", index))
    return found


def pending_request(entries, address: str, port: int, owners) -> Source:
    """Among the kernel's rdma_cm ids (`entries`), the connection request being handled: an
    id of the TCP port space in state CONNECT on the listener's `address` and `port` (its
    source address, rdma_cm's name for our side), of this process (its pid in `owners`: a
    request's id takes its listener's owner, Linux 5.10 and later), not yet accepted (no
    local QP number: rdma_accept gives the id one). Several may wait (the events of the others
    are still queued): the requests are made ids, and numbered (RES_CM_IDN, Linux 5.1 and
    later), in the order their events come, and every earlier one was accepted or destroyed
    before the next event was read, so the handled one is the oldest. Its destination
    address is the client's; a Source with `unknown` said where none is found."""
    listener = _ip(address)
    waiting = [
        r
        for r in entries
        if r.state == CmState.CONNECT
        and r.ps == PortSpace.TCP
        and not r.lqpn
        and _address_port(r.src_addr) == (listener, port)
        and r.owner.pid in owners
    ]
    if not waiting:
        return Source(
            None,
            None,
            "the kernel lists no connection request of this process to "
            f"{peer_name(address, port)} (RDMA_NLDEV_CMD_RES_CM_ID_GET; Linux 5.10 and later "
            "name a request's id after its listener's process)",
        )
    if len(waiting) > 1 and any(r.cm_idn is None for r in waiting):
        return Source(
            None,
            None,
            f"{len(waiting)} connection requests wait, and the kernel numbers no rdma_cm id "
            "(RES_CM_IDN: Linux 5.1 and later)",
        )
    request = min(waiting, key=lambda r: r.cm_idn or 0)
    client = _address_port(request.dst_addr)
    if client is None:
        return Source(None, None, "the kernel's id of the request has no IP address (AF_IB?)")
    return Source(str(client[0]), client[1])


def own_tasks() -> set[int]:
    """The ids of this process and its threads, as RDMA_NLDEV_ATTR_RES_PID names an owner."""
    tasks = {os.getpid()}
    with contextlib.suppress(OSError):
        tasks.update(int(t) for t in os.listdir("/proc/self/task") if t.isdigit())
    return tasks


def path_address(cmid) -> str | None:
    """The IP address a RoCE connection request came from: the GID of the client's end of
    its path (rdma_init_qp_attr's RTR attributes: the request's), which on RoCE is the IP
    address the client's rdma_cm chose (IPv4 mapped: ::ffff:a.b.c.d), as the packets carry
    it. None on InfiniBand (a port GID, no IP address), on iWARP (no such path), with a
    pyverbs before rdma-core 34 (no CMID.port_num) or where it cannot be read."""
    port = getattr(cmid, "port_num", None)
    if not port:
        return None
    pv = pyverbs()
    try:
        if cmid.context.query_port(port).link_layer != LinkLayer.ETHERNET:
            return None
        attr, _ = cmid.init_qp_attr(pv.e.ibv_qp_state.IBV_QPS_RTR)
        ah = attr.ah_attr
        if not ah.is_global:
            return None
        gid = ipaddress.IPv6Address(str(ah.dgid))
    except (pv.Error, ValueError, AttributeError):
        return None
    if gid.is_unspecified:
        return None
    return str(gid.ipv4_mapped or gid)


def _ip(text: str):
    """An address as ipaddress compares it: a scope (%eth0) dropped, an IPv4-mapped IPv6
    address as the IPv4 one."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _address_port(text: str | None):
    """(address, port) of records.sockaddr's "ADDRESS:PORT"; None for none."""
    if not text:
        return None
    host, _, port = text.rpartition(":")
    try:
        return _ip(host), int(port)
    except ValueError:
        return None
