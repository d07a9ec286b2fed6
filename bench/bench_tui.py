#!/usr/bin/env python3
"""Benchmark: `ibtool tui` at its default 1 s refresh on 64 ports whose counters change at every
read: CPU over a minute (target, issue 11: under 10% of one core, rdmatop-class), start-up to
the first frame, peak memory. Measured in the same run against what an operator runs today
without a dashboard: `watch -n 1 ibtool counters` (a process per second) and the floor, a shell
loop that only cats the same counter files every second.

The tree is 32 two-port ConnectX-5 IB devices (tests/fixtures' mlx5_ib_hca, copied), each port
with its 20 PMA and 20 mlx5 counters; a separate process rewrites every port's data, packet
and one error counter every 0.5 s. The dashboard runs for real in a pseudo-terminal (160x48),
its screen output drained; its Feed reads the tree as it reads the live host (anew each poll,
rates, health every 60 s).

Usage: .venv/bin/python bench/bench_tui.py [--seconds 60] [--ports 64]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures import sysfs_trees  # noqa: E402

FUNCTION = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
TARGET = 0.10
TICK = os.sysconf("SC_CLK_TCK")


def build(root: Path, ports: int) -> list[Path]:
    """The tree and the counters directory of each port."""
    sysfs_trees.mlx5_ib_hca(root)
    first = root / FUNCTION / "infiniband" / "mlx5_0"
    for n in range(1, ports // 2):
        name = f"mlx5_{n}"
        shutil.copytree(first, first.parent / name, symlinks=True)
        os.symlink(
            f"../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/{name}",
            root / "sys/class/infiniband" / name,
        )
    sysfs_trees.uverbs(root, sorted(os.listdir(root / "sys/class/infiniband")))
    return sorted((root / "sys/class/infiniband").glob("*/ports/*/counters"))


def mutate(dirs: list[str]) -> None:
    """Every port's traffic and an error counter move, twice a second, until killed."""
    step = 0
    spare = os.path.join(dirs[0].split("/sys/")[0], "bench-tui-spare")  # beside sys/
    while True:
        step += 1
        for d in dirs:
            for name, by in (
                ("port_xmit_data", 250_000_000),
                ("port_rcv_data", 125_000_000),
                ("port_xmit_packets", 900_000),
                ("port_rcv_packets", 450_000),
                ("symbol_error", step % 2),
            ):
                path = os.path.join(d, name)
                with open(path) as f:
                    value = int(f.read())
                with open(spare, "w") as f:
                    f.write(f"{value + by}\n")
                os.replace(spare, path)  # a reader never sees a file half written
        time.sleep(0.5)


def serve(root: str, ready: str) -> None:
    """The dashboard, as `ibtool tui` runs it on a live host, on the tree."""
    from ibtool.health import state as healthstate
    from ibtool.health.config import HealthConfig
    from ibtool.host import Host
    from ibtool.live.feed import Feed
    from ibtool.plugin.hooks import health_checks
    from ibtool.plugin.manager import build_plugins
    from ibtool.tui.app import Dashboard

    feed = Feed(
        lambda: Host(root=root, warn=feed.note),
        live=True,
        source="bench",
        checks=health_checks(build_plugins(), lambda m: None),
        config=HealthConfig(),
        boot_id=lambda host: healthstate.boot_id(host.root, host.fs),
    )

    def stamp() -> None:  # written whole, then renamed: the bench never reads half of it
        Path(ready + ".new").write_text(f"{time.time()}\n")
        os.replace(ready + ".new", ready)

    class Timed(Dashboard):
        def on_polled(self, message) -> None:
            super().on_polled(message)
            if message.frame.number == 1:
                self.call_after_refresh(stamp)

    Timed(feed, interval=1.0).run()


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process and its waited-for children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICK


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def drain(fd: int, until: float) -> None:
    while time.monotonic() < until:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                return


def dashboard(root: Path, seconds: float) -> tuple[float, float, int]:
    """(start-up to first frame s, CPU share over `seconds`, peak KiB) of the real app."""
    ready = root / "ready"
    began = time.time()
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, __file__, "--serve", str(root), str(ready)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if time.monotonic() > deadline:
                raise SystemExit("the dashboard showed no frame in 120 s")
            drain(fd, time.monotonic() + 0.05)
        first = float(ready.read_text()) - began
        drain(fd, time.monotonic() + 3)  # past start-up: the steady state is measured
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        drain(fd, t0 + seconds)
        share = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        return first, share, peak_kib(pid)
    finally:
        os.write(fd, b"q")
        drain(fd, time.monotonic() + 2)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)


def loop_share(script: str, seconds: float) -> float:
    """CPU share of a shell loop (and every process it starts) over `seconds`."""
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 2 and sys.argv[1] == "--mutate":
        return mutate(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ports", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ibtool-bench-tui-"))
    mutator = None
    try:
        dirs = [str(d) for d in build(work, args.ports)]
        mutator = subprocess.Popen([sys.executable, __file__, "--mutate", *dirs])
        ibtool = f"{sys.executable} -m ibtool --root {work} counters"
        cat = f"cat {work}/sys/class/infiniband/*/ports/*/counters/*"
        print(f"{len(dirs)} ports, counters rewritten every 0.5 s; {args.seconds:g} s each")
        first, share, peak = dashboard(work, args.seconds)
        watch = loop_share(f"while :; do {ibtool} >/dev/null; sleep 1; done", args.seconds)
        floor = loop_share(f"while :; do {cat} >/dev/null; sleep 1; done", args.seconds)
        print(
            f"  ibtool tui (1 s refresh)            CPU {share:6.1%} of a core  "
            f"first frame {first:5.2f} s  peak {peak / 1024:6.1f} MiB"
        )
        print(
            f"  watch -n 1 ibtool counters (loop)   CPU {watch:6.1%}   "
            f"tui/this {share / watch:5.2f}x"
        )
        print(
            f"  cat every counter file (loop)       CPU {floor:6.1%}   tui/this "
            f"{share / floor if floor else float('inf'):5.2f}x"
        )
        verdict = "met" if share < TARGET else "NOT met"
        print(f"  target: under {TARGET:.0%} of one core: {verdict}")
    finally:
        if mutator is not None:
            mutator.kill()
            mutator.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
