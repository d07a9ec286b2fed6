"""`ibtool ping`'s clients and servers: ibtool's own protocol (Client, serve), ibv_rc_pingpong's
(PingpongClient, serve_pingpong), rping's (RpingClient, serve_rping, its size bounds) and the
RDMA CM echo (CmpingClient, serve_cmping); what each server is told (ServeOptions) and its
admission limits."""

from __future__ import annotations

from ibtool.rdma.ping.admission import Limits, parse_network
from ibtool.rdma.ping.client import Client, PingStats, run_client
from ibtool.rdma.ping.cmping import Client as CmpingClient
from ibtool.rdma.ping.cmping import serve as serve_cmping
from ibtool.rdma.ping.options import ServeOptions
from ibtool.rdma.ping.pingpong import PingpongClient
from ibtool.rdma.ping.pingpong import serve as serve_pingpong
from ibtool.rdma.ping.rping import MAX_SIZE as RPING_MAX_SIZE
from ibtool.rdma.ping.rping import MIN_SIZE as RPING_MIN_SIZE
from ibtool.rdma.ping.rping import Client as RpingClient
from ibtool.rdma.ping.rping import serve as serve_rping
from ibtool.rdma.ping.server import serve
from ibtool.rdma.ping.session import DEFAULT_PORT, MAX_PING_SIZE

__all__ = [
    "DEFAULT_PORT",
    "MAX_PING_SIZE",
    "RPING_MAX_SIZE",
    "RPING_MIN_SIZE",
    "Client",
    "CmpingClient",
    "Limits",
    "PingStats",
    "PingpongClient",
    "RpingClient",
    "ServeOptions",
    "parse_network",
    "run_client",
    "serve",
    "serve_cmping",
    "serve_pingpong",
    "serve_rping",
]
