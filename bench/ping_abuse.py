#!/usr/bin/env python3
"""Benchmark: `ibtool ping --server` (and its --compat rc_pingpong) under abuse, in the testbed.

    tests/testbed/testbed run -- .venv/bin/python bench/ping_abuse.py [--count 200]

Both servers run with their default limits on rxe0, listening on every address. In one run:

1. quiet: an `ibtool ping` client (-c COUNT -i 0) against the native server, an `ibtool ping
   --compat rc_pingpong` client and a stock `ibv_rc_pingpong` against the compat server, from
   rxe0's address: RTT median and p99 (ibv_rc_pingpong: its usec/iter) and loss;
2. the same while a flood comes from 127.0.0.1 at both: 200 idle connections each, half-open
   handshakes (half an ENDPOINT, then nothing) renewed 4 a second, a garbage client every
   10 ms;
3. the quiet runs again (the guest's two emulated CPUs make a run's figures move: compare
   within a run), then the native client with 3 idle sessions held on the native server
   (each a real QP that never pings: the server's polling of them backs off, ping._echo),
   and the server's CPU while they stay idle;
4. the servers' threads, open descriptors, resident memory and CPU (from /proc/PID) idle, at
   the worst of the flood and after it;
5. a client killed with SIGKILL mid-run: how long its QP stays on the server (until `rdma res
   show qp` has none of the server's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ibtool.rdma import wire  # noqa: E402
from tests.fixtures.flood import Flood  # noqa: E402

PORT, PINGPONG_PORT = 18800, 18815
IBTOOL = [sys.executable, "-m", "ibtool"]


def topology() -> dict:
    path = os.environ.get("IBTOOL_TESTBED_INFO")
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {k[10:].lower(): v for k, v in os.environ.items() if k.startswith("IBTOOL_TB_")}


def proc_stats(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "threads": int(status["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "cpu_s": (int(fields[11]) + int(fields[12])) / ticks,  # utime + stime
    }


class Sampler(threading.Thread):
    """The worst threads/fds/RSS of `pid` while it runs."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.done, self.worst = pid, threading.Event(), {}

    def run(self) -> None:
        while not self.done.is_set():
            s = proc_stats(self.pid)
            for k in ("threads", "fds", "rss_mib"):
                self.worst[k] = max(self.worst.get(k, 0), s[k])
            self.done.wait(0.2)

    def stop(self) -> dict:
        self.done.set()
        self.join(10)
        return self.worst


def endpoint(size: int, qpn: int = 0x99, ipv4: str = "127.0.0.1") -> bytes:
    """An ENDPOINT from a QP that is not there, on the RoCE v2 GID of `ipv4`."""
    gid = bytes(10) + b"\xff\xff" + socket.inet_aton(ipv4)
    return wire.encode_endpoint(wire.Endpoint(qpn, 1, 0, 3, gid, 0x1000, 1, size, wire.Mode.SEND))


def start(*extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*IBTOOL, "ping", "--server", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    assert "listening" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return out


def res_count(kind: str) -> int:
    """User-space objects of `kind` in `rdma res`, whoever holds them: the kernel shows each
    with the id of the thread that made it (task_pid_vnr), a session thread's for a server's
    QP, so a process's pid does not find them; nothing else runs here meanwhile."""
    out = subprocess.run(["rdma", "-j", "res", "show", kind], capture_output=True, text=True)
    return sum(1 for r in json.loads(out.stdout or "[]") if "pid" in r)


def res_left() -> str:
    return "qp {} cq {} mr {} pd {}".format(*(res_count(k) for k in ("qp", "cq", "mr", "pd")))


def ibtool_ping(host: str, port: int, count: int, *extra: str) -> tuple[str, str, str]:
    proc = subprocess.run(
        [*IBTOOL, "-j", "ping", host, "--port", str(port), "-c", str(count), "-i", "0", *extra],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return "-", "-", f"failed: {proc.stderr.strip()[-80:]}"
    rtts = sorted(r["rtt_us"] for r in report["replies"] if "rtt_us" in r)
    if not rtts:
        return "-", "-", f"{report['loss_pct']}%"
    p99 = rtts[min(len(rtts) - 1, int(0.99 * len(rtts)))]
    return f"{statistics.median(rtts):.0f}", f"{p99:.0f}", f"{report['loss_pct']:g}%"


def stock_ping(topo: dict, count: int) -> tuple[str, str, str]:
    proc = subprocess.run(
        ["ibv_rc_pingpong", "-d", topo["device"], "-g", "1", "-p", str(PINGPONG_PORT),
         "-s", "64", "-n", str(count), "-c", topo["ipv4"]],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    found = re.search(r"^(\d+) iters in [\d.]+ seconds = ([\d.]+) usec/iter$", proc.stdout, re.M)
    if proc.returncode or not found:
        return "-", "-", f"failed: {proc.stderr.strip()[-60:]}"
    lost = count - int(found.group(1))
    return f"{float(found.group(2)):.0f}/iter", "-", f"{100 * lost / count:g}%"


def measure(topo: dict, count: int) -> list[tuple[str, tuple]]:
    host = topo["ipv4"]
    return [
        ("ibtool ping", ibtool_ping(host, PORT, count)),
        (
            "ibtool --compat rc_pingpong",
            ibtool_ping(host, PINGPONG_PORT, count, "--compat", "rc_pingpong", "-s", "64"),
        ),  # fmt: skip
        ("ibv_rc_pingpong (stock)", stock_ping(topo, count)),
    ]


def idle_sessions(n: int) -> list[socket.socket]:
    """n sessions on the native server that never ping: a QP each on the server."""
    held, ipv4 = [], topology()["ipv4"]
    for i in range(n):
        s = socket.create_connection((ipv4, PORT), timeout=30)
        s.sendall(endpoint(64, 0x1000 + i, ipv4))
        wire.receive(s, 30, wire.MessageType.ENDPOINT)
        s.sendall(wire.encode(wire.MessageType.READY))
        held.append(s)
    return held


def dead_client_seconds(host: str) -> float:
    """A client killed with SIGKILL mid-run: seconds until no QP is left (its own went with
    its process; the server's with its session)."""
    client = subprocess.Popen(
        [*IBTOOL, "ping", host, "--port", str(PORT), "-i", "0.01"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in client.stdout:
        if " bytes from " in line:
            break
    assert res_count("qp") == 2, res_count("qp")  # the client's and the server's
    client.kill()
    t0 = time.monotonic()
    client.communicate()
    while res_count("qp"):
        if time.monotonic() - t0 > 120:
            return float("inf")
        time.sleep(0.05)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=200)
    args = ap.parse_args()
    topo = topology()
    native = start("--port", str(PORT))
    compat = start("--compat", "rc_pingpong", "--port", str(PINGPONG_PORT))
    pids = {"native": native.pid, "rc_pingpong": compat.pid}
    stats: dict[str, dict] = {}
    rows: list[tuple[str, str, tuple]] = []
    try:
        for name, pid in pids.items():
            stats[f"{name} idle"] = proc_stats(pid)
        rows += [("quiet", c, r) for c, r in measure(topo, args.count)]
        samplers = {name: Sampler(pid) for name, pid in pids.items()}
        for s in samplers.values():
            s.start()
        cpu0 = {name: proc_stats(pid)["cpu_s"] for name, pid in pids.items()}
        t0 = time.monotonic()
        with Flood([PORT, PINGPONG_PORT]) as flood:
            rows += [("flood", c, r) for c, r in measure(topo, args.count)]
            counts = dict(flood.counts)
        wall = time.monotonic() - t0
        for name, s in samplers.items():
            worst = s.stop()
            worst["cpu_s"] = proc_stats(pids[name])["cpu_s"] - cpu0[name]
            worst["cpu_pct"] = 100 * worst["cpu_s"] / wall
            stats[f"{name} flood (worst)"] = worst
        rows += [("quiet again", c, r) for c, r in measure(topo, args.count)]
        held = idle_sessions(3)
        rows.append(("3 idle sessions", *measure(topo, args.count)[0]))
        time.sleep(3)  # all three quiet for long now
        cpu0n, t1 = proc_stats(native.pid)["cpu_s"], time.monotonic()
        time.sleep(5)
        idle_cpu = 100 * (proc_stats(native.pid)["cpu_s"] - cpu0n) / (time.monotonic() - t1)
        for s in held:
            s.close()
        time.sleep(2)
        for name, pid in pids.items():
            stats[f"{name} after"] = proc_stats(pid)
        dead = dead_client_seconds(topo["ipv4"])
    finally:
        logs = {name: stop(proc) for name, proc in (("native", native), ("rc_pingpong", compat))}
    print(f"flood per server: {counts} (from 127.0.0.1; the clients from {topo['ipv4']})")
    print()
    print(f"{'phase':<16} {'client':<28} {'median us':>12} {'p99 us':>8} {'loss':>6}")
    for phase, client, (median, p99, loss) in rows:
        print(f"{phase:<16} {client:<28} {median:>12} {p99:>8} {loss:>6}")
    print()
    print(f"{'server':<28} {'threads':>7} {'fds':>5} {'RSS MiB':>8} {'CPU %':>6}")
    for name, s in stats.items():
        cpu = f"{s['cpu_pct']:.0f}" if "cpu_pct" in s else "-"
        print(f"{name:<28} {s['threads']:>7} {s['fds']:>5} {s['rss_mib']:>8.1f} {cpu:>6}")
    print()
    print(f"native server CPU with 3 idle sessions held (no client, quiet 3-8 s): {idle_cpu:.0f}%")
    print(f"a client killed with SIGKILL: its QP gone from the server after {dead:.2f} s")
    print(f"both servers stopped: rdma res shows {res_left()} user objects")
    for name, log in logs.items():
        lines = log.splitlines()
        print(f"\n{name} server log: {len(lines)} lines; refusals and drops:")
        for line in lines:
            if line.startswith(("refused", "dropped")) or " dropped: " in line:
                print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
