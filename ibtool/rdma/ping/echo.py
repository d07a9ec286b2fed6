"""A server's answer loop: every ping on a connected Session echoed, same bytes, same immediate.

The native server, the rc_pingpong server and the rdma_cm server all answer with it
(server.py, pingpong.py, cmping.py); what ends it differs: the client's next request on its
TCP connection, an rdma_cm event, or silence.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from errno import ENOENT

from ibtool.errors import IbtoolError
from ibtool.rdma import wire
from ibtool.rdma.completions import CompletionError, poll_failed
from ibtool.rdma.ping.session import (
    HANDSHAKE_TIMEOUT,
    SIGNAL_EVERY,
    QPError,
    Session,
    next_endpoint,
)

ECHO_ROUND = range(2000)  # a server's empty polls between two looks at its TCP side
BACKOFF_ROUND = range(1)  # a quiet session's polls between two sleeps (see answer_pings)
QUIET_AFTER = 0.05  # s without a ping before a session's polling backs off (if not alone)
BACKOFF_SLEEP = 0.001  # s slept between two polls of a quiet session
LONG_QUIET = 2.0  # s without a ping after which it sleeps LONG_SLEEP between polls instead
LONG_SLEEP = 0.005


class Idle(IbtoolError):
    """The client sent nothing for --idle-timeout seconds."""


def answer_pings(
    session: Session,
    conn: socket.socket | int | None,
    idle: float | None = None,
    stop: threading.Event | None = None,
    crowded: Callable[[], bool] | None = None,
) -> tuple[wire.Endpoint | None, int]:
    """Answer pings until the client reconnects (new ENDPOINT on `conn`) or leaves (None):
    closes `conn`, or, without one, sends nothing for `idle` seconds. Without `conn` (a
    stock client, whose TCP connection ended with the exchange) each answer is as long as
    the ping it answers. `conn` may be an rdma_cm event channel's descriptor instead: the
    loop returns (None) when an event is there to read, the caller's to handle. With a
    socket `conn` and `idle`, a client that sends nothing for `idle` seconds raises Idle.
    `stop` set: the loop returns (None) within a round.

    From a ping's completion to its answer's post is half of every round trip: everything
    is bound to locals, and the answer is posted before anything else is done.

    Several sessions in one process fight for the GIL when each busy-polls: when `crowded()`
    says another session runs, a session quiet for QUIET_AFTER polls once per BACKOFF_SLEEP
    (time.sleep releases the GIL), once per LONG_SLEEP when quiet for LONG_QUIET, and
    busy-polls again from its next ping on. The cost: the first ping after a pause waits up
    to 1 ms more (a pause under 2 s: `-i 1`), 5 ms after a longer one; a session alone
    busy-polls as before. An idle session wakes 200 times a second, not millions.
    """
    session.answered = answered = 0
    seen = -1
    last = time.monotonic()  # the last ping's round, for the back-off
    quiet_since = last + HANDSHAKE_TIMEOUT  # the first ping may take a while
    cq, attr, cadence = session.polled, session.poll_attr, session.cadence
    post_send = session.qp.post_send
    start, end, opcode_of, imm_of = cq.start_poll, cq.end_poll, cq.read_opcode, cq.read_imm_data
    echo_imm, rearm = session.with_imm, session.post_recv
    echo_length, empty, polls = conn is None, ENOENT, ECHO_ROUND
    while True:
        for _ in polls:  # as in Client.ping: an empty poll is a call and a comparison
            rc = start(attr)
            if rc != empty:
                break
        else:  # that many empty polls in a row (a few ms): look at the TCP side
            if conn is None:
                now = time.monotonic()
                if answered != seen:
                    seen, quiet_since, last = answered, now if answered else quiet_since, now
                elif now - quiet_since > idle:
                    return None, answered
            elif select.select([conn], [], [], 0)[0]:
                if not isinstance(conn, socket.socket):
                    return None, answered
                return next_endpoint(conn, HANDSHAKE_TIMEOUT), answered
            elif idle is not None or crowded is not None:
                now = time.monotonic()
                if answered != seen:
                    seen, quiet_since, last = answered, now if answered else quiet_since, now
                elif idle is not None and now - quiet_since > idle:
                    raise Idle(f"sent nothing for {idle:g} s (--idle-timeout)")
            if stop is not None and stop.is_set():
                return None, answered
            if crowded is not None and now - last > QUIET_AFTER and crowded():
                polls = BACKOFF_ROUND
                time.sleep(BACKOFF_SLEEP if now - last < LONG_QUIET else LONG_SLEEP)
            continue
        if rc:
            raise poll_failed(rc)
        try:
            status = cq.status
            if status:
                raise CompletionError.of(status, cq.read_vendor_err(), "ping reply")
            if not opcode_of() & 128:
                continue  # a (signaled) send's completion: nothing to do
            if echo_length and cq.read_byte_len() != session.size:
                session.answer_with(cq.read_byte_len())
                cadence = session.cadence
            wr = cadence[(answered + 1) % SIGNAL_EVERY]
            if echo_imm:
                wr.imm_data = imm_of()  # as received, in network order
            # The answer (same bytes, same immediate) goes before anything else, even the
            # end of the poll: it touches the QP only, never this CQ.
            post_send(wr)
        except session.ladder.pv.Error as e:
            raise QPError(f"post the answer: {e}") from None
        finally:
            end()
        rearm()  # the spare receive posted up front covers the client's next ping
        answered += 1
        polls = ECHO_ROUND  # busy again, if it had backed off
        session.answered = answered  # what was answered, when a failure ends the loop
