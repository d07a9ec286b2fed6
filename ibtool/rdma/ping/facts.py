"""`ibtool doctor PEER`'s question to the peer's `ibtool ping --server`: its side's facts.

One FACTS_QUERY on a fresh connection to the ping port, one FACTS (JSON) back, then the
server closes: no QP, no memory registered, nothing left on either side. The answer is bytes
for ibtool.model.doctor.Facts.from_wire to validate; this module only moves them, bounded
in size (wire.MAX_FACTS_PAYLOAD) and time. It imports no pyverbs.
"""

from __future__ import annotations

import socket
import time

from ibtool.errors import IbtoolError
from ibtool.rdma import wire


class NoFacts(IbtoolError):
    """The peer gave no facts: nothing listens, it refused, or it is not an ibtool server."""


def query_facts(host: str, tcp_port: int, timeout: float) -> bytes:
    """The facts of the `ibtool ping --server` at host:tcp_port, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    where = f"{host}:{tcp_port}"
    try:
        conn = socket.create_connection((host, tcp_port), timeout=timeout)
    except OSError as e:
        raise NoFacts(
            f"no ibtool ping server at {where}: {e.strerror or e}",
            f"run `ibtool ping --server` on {host}, or give --compat for a stock peer",
        ) from None
    with conn:
        try:
            wire.send(conn, wire.encode(wire.MessageType.FACTS_QUERY))
            return wire.receive(conn, max(0.1, deadline - time.monotonic()), wire.MessageType.FACTS)
        except wire.PeerError as e:
            raise NoFacts(f"{where}: {e.message}") from None
        except wire.ConnectionLost:
            raise NoFacts(
                f"{where} closed the connection without facts",
                "an ibtool older than `doctor` or another program listens there",
            ) from None
        except wire.ProtocolError as e:
            raise NoFacts(f"{where} did not answer with facts: {e.message}") from None
