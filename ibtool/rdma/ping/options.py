"""What a ping server is told (`ibtool ping --server`'s options), one record for the four:
the native server (server.py), rc_pingpong's (pingpong.py), rping's (rping.py) and the native
ping over rdma_cm (cmping.py). A server refuses an option it cannot honour rather than drop
it unsaid."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from ibtool.model.deferred import dataclass
from ibtool.rdma.ladder import DEFAULT_PATH, PathSpec

if TYPE_CHECKING:
    from ibtool.model.records import PKey
    from ibtool.rdma.ping.admission import Limits
    from ibtool.rdma.ping.session import Log


@dataclass(frozen=True)
class ServeOptions:
    """Where a server listens, what it builds on, whom it lets in and how long it waits.

    - `bind`, `listen_port`: the address and port it listens on: a TCP port for the servers
      over a port's verbs (the native one, rc_pingpong's; `bind` "" for every address of the
      host), a port of rdma_cm's TCP port space (RDMA_PS_TCP) for rping's and cmping's, whose
      device the kernel picks by the route to `bind`;
    - `device`, `device_port`, `gid_index`: the RDMA port whose verbs the TCP servers open
      (ibtool.rdma.ladder.Ladder: a RoCE port needs its GID index); the rdma_cm servers take
      none of them;
    - `log`: where each event goes, a line each;
    - `max_clients`: the server returns once that many clients were served (None: never);
    - `path`: the service level, traffic class, MTU cap and P_Key index of the QPs it builds;
      not rping's, whose path is rdma_cm's own;
    - `idle`: seconds without a ping before rc_pingpong's, rping's and cmping's servers drop a
      client (None: rc_pingpong's 2 s, no bound for the others); the native server's is
      `limits.idle_timeout`;
    - `pkey`: the P_Key in the slot of `path.pkey_index`, for the first line of the TCP
      servers;
    - `limits`: the admission limits (admission.Limits; None: its defaults).
    """

    bind: str
    listen_port: int
    log: Log
    device: str | None = None
    device_port: int | None = None
    gid_index: int | None = None
    max_clients: int | None = None
    path: PathSpec = DEFAULT_PATH
    idle: float | None = None
    pkey: PKey | None = None
    limits: Limits | None = None

    def refuse(self, server: str, *names: str) -> None:
        """A TypeError naming the options among `names` that are set (not their default), as
        `server` cannot honour them; as a call with an unknown keyword would raise."""
        default = {f.name: f.default for f in fields(self)}
        given = [name for name in names if getattr(self, name) != default[name]]
        if given:
            raise TypeError(f"{server} does not take {_named(given)}")

    def require(self, server: str, *names: str) -> None:
        """A TypeError naming the options among `names` that are not set, as `server` needs
        them; as a call without a positional argument would raise."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise TypeError(f"{server} needs {_named(missing)}")


def _named(names: list[str]) -> str:
    return ", ".join(f"ServeOptions.{name}" for name in names)
