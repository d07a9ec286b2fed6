"""An rdma_cm ping server's loop (`--compat rping`, `--cm`): one client at a time, each
numbered, served, closed and said in the log; a client's failure is its line, the next is
served.

The TCP servers (server.py, pingpong.py) serve several at once through acceptor.py; rdma_cm
has no listening socket a selector could watch, and rping.c serves one client too.
"""

from __future__ import annotations

from ibtool.errors import IbtoolError
from ibtool.rdma.ping.session import Log


def serve_clients(next_request, max_clients: int | None, log: Log, serve_one) -> None:
    """A passive side's loop: each connection request `next_request()` returns, numbered,
    served by `serve_one(conn, who)` (the pings it answered) and closed, until `max_clients`
    were served; a client's failure is its log line, the next one is served."""
    served = 0
    while max_clients is None or served < max_clients:
        conn = next_request()
        served += 1
        with conn:
            who = f"client {served}"
            try:
                log(f"{who} done: {serve_one(conn, who)} pings answered")
            except IbtoolError as e:
                log(f"{who} dropped: {e.message}")
