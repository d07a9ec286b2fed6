"""ibtool on a fake RDMA host: the mlx5_roce tree as the live host's sysfs, a fake pyverbs.

`python -m tests.unit.fake_host [--serve PORT] ARGS...` runs ibtool's main() so in a process of
its own, for the tests that signal one. With --serve PORT an `ibtool ping --server` first
listens on 127.0.0.1:PORT in a thread of the same process: the fake device exists in one process
only, so a client is pinged by a server beside it.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

ROCE_GID = "0000:0000:0000:0000:0000:ffff:c0a8:0a01"  # GID 3 of the mlx5_roce tree


def sysfs_from(root: Path):
    """A host factory (cli.main's host_factory) for the live host (no --root) reading its
    sysfs from `root`, for the commands that refuse --root because they open the host's verbs
    devices (loopback, ping; pyverbs_fakes fakes those)."""
    from ibtool.host import Host
    from ibtool.sources.sysfs.infiniband import SysfsSource

    def host(inv) -> Host:
        return Host(warn=inv.warn, details=inv.details, sysfs=SysfsSource(str(root), inv.warn))

    return host


def counters_cli(host, *words, json=False, details=False):
    """`ibtool counters WORDS` run on `host` (a Host given its sources): (stdout, warnings)."""
    import argparse
    import io

    from ibtool_plugins import counters

    out, warnings = io.StringIO(), []
    args = argparse.Namespace(
        words=list(words), explain=None, rate=False, watch=None, interval=1.0, errors=False
    )
    from ibtool.plugin.commands import Invocation

    inv = Invocation(
        args=args,
        json=json,
        details=details,
        out=out,
        warn=warnings.append,
        host_factory=lambda inv: host,
    )
    counters.run(inv)
    return out.getvalue(), warnings


def _serve(port: int) -> None:
    from ibtool.rdma.ping import server as ping_server
    from ibtool.rdma.ping.options import ServeOptions

    listening = threading.Event()

    def log(line: str) -> None:
        if line.startswith("listening on "):
            listening.set()

    options = ServeOptions("127.0.0.1", port, log, device="mlx5_0", device_port=1, gid_index=3)
    server = threading.Thread(target=ping_server.serve, args=(options,), daemon=True)
    server.start()
    if not listening.wait(30):
        raise SystemExit("the in-process ping server did not listen within 30 s")


def main(argv: list[str]) -> int:
    import pytest

    from ibtool.cli import main as ibtool
    from tests.fixtures import sysfs_trees
    from tests.unit import pyverbs_fakes

    patch = pytest.MonkeyPatch()
    fabric = pyverbs_fakes.install(patch, "rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    with tempfile.TemporaryDirectory() as tmp:
        live = sysfs_from(sysfs_trees.build("mlx5_roce", Path(tmp)))
        if argv[:1] == ["--serve"]:
            _serve(int(argv[1]))
            argv = argv[2:]
        return ibtool(argv, host_factory=live)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
