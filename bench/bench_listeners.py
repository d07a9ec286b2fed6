#!/usr/bin/env python3
"""Benchmark: `ibtool exporter` under abuse, beside Debian's prometheus-node-exporter.

Each exporter is started on 127.0.0.1 (ibtool on a fixture tree, --root; node_exporter with its
infiniband collector, whose sysfs has no device here: both answer from the same kind of data).
For each one, in the same run:

1. 200 normal scrapes (a new connection each, as a scraper after an idle close): p50, p99, worst;
2. the same scrapes while 1,000 idle connections are held, 200 slowloris clients dribble a
   request head one byte every second, and a stream of garbage requests (binary, HTTP/0.9,
   overlong lines) comes in: p50, p99, worst and how many failed;
3. the exporter's threads, open files and resident memory idle, at the worst of the abuse, and
   once the abuse is gone (waited for, up to 30 s);
4. with its open-files limit at 128: 200 idle connections, then 50 scrapes (how many answered)
   and, for ibtool, the poller's error counter (a poll starved of descriptors counts as one).

The ping server's side of the listeners (a flood at `ibtool ping --server` while real clients
are served) needs RDMA devices: bench/ping_abuse.py, run in the testbed.

Usage: .venv/bin/python bench/bench_listeners.py [--scrapes 200] [--idle 1000] [--slow 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures import sysfs_trees  # noqa: E402

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_figures(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
    }


def worst(a: dict, b: dict) -> dict:
    return {k: max(a[k], b[k]) for k in a}


class Exporter:
    """One exporter process, its port, and its figures."""

    def __init__(self, name: str, argv: list[str], port: int, nofile: int | None = None):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}/metrics"

        def limit():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=REPO,
            preexec_fn=limit,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.errors: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            try:
                body = scrape(self.url, 5)
                if name != "ibtool" or "ibtool_exporter_last_poll_timestamp_seconds" in body:
                    break  # ibtool: its first poll is in
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not serve: {''.join(self.errors)[-500:]}")
            time.sleep(0.1)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.errors.append(line.decode(errors="replace"))
            del self.errors[:-50]

    def figures(self) -> dict:
        return proc_figures(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def scrape(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read().decode()


def timed_scrapes(
    url: str, n: int, timeout: float = 5.0, every: float = 0.0
) -> tuple[list[float], int]:
    """`n` scrapes, one every `every` seconds (0: back to back): their times in ms, failures."""
    took, failed = [], 0
    start = time.monotonic()
    for i in range(n):
        if every:
            time.sleep(max(0.0, start + i * every - time.monotonic()))
        t0 = time.perf_counter()
        try:
            scrape(url, timeout)
        except OSError:
            failed += 1
            continue
        took.append((time.perf_counter() - t0) * 1000)
    return took, failed


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Abuse:
    """Idle connections, slowloris heads and garbage at one port, from threads of this process,
    until stopped; the idle and slow ones are re-opened when the server closes them."""

    GARBAGE = [
        b"GET /metrics\r\n",  # HTTP/0.9
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32),  # a TLS ClientHello
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 70000 + b"\r\n",
        bytes(random.Random(1).getrandbits(8) for _ in range(512)),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ]

    def __init__(self, port: int, idle: int, slow: int):
        self.port, self.idle_n, self.slow_n = port, idle, slow
        self.stop_event = threading.Event()
        self.garbage_sent = 0
        self.threads = [threading.Thread(target=self._idle_and_slow, daemon=True)]
        self.threads += [threading.Thread(target=self._garbage, daemon=True) for _ in range(4)]

    def _connect(self) -> socket.socket | None:
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", self.port))
        return s

    def _idle_and_slow(self) -> None:
        sel = selectors.DefaultSelector()
        conns: dict[socket.socket, list] = {}

        def open_one(kind: str) -> None:
            try:
                s = self._connect()
            except OSError:
                return
            conns[s] = [kind, 0]
            sel.register(s, selectors.EVENT_READ)

        for _ in range(self.idle_n):
            open_one("idle")
        for _ in range(self.slow_n):
            open_one("slow")
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"s" * 4000
        last_drip = 0.0
        while not self.stop_event.is_set():
            for key, _ in sel.select(0.2):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:  # closed by the server: come back
                    kind = conns.pop(s)[0]
                    sel.unregister(s)
                    s.close()
                    open_one(kind)
            now = time.monotonic()
            if now - last_drip >= 1.0:
                last_drip = now
                for s, state in list(conns.items()):
                    if state[0] == "slow" and state[1] < len(head):
                        with contextlib.suppress(OSError):
                            s.send(head[state[1] : state[1] + 1])
                            state[1] += 1
        for s in conns:
            s.close()
        sel.close()

    def _garbage(self) -> None:
        while not self.stop_event.is_set():
            for payload in self.GARBAGE:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                        self.garbage_sent += 1
                        s.sendall(payload)
                        with contextlib.suppress(OSError):
                            s.recv(4096)
                except OSError:
                    pass

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(30)


def settle(exporter: Exporter, idle: dict, timeout: float = 30.0) -> dict:
    """The exporter's figures once its open files are back to idle (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        now = exporter.figures()
        if now["fds"] <= idle["fds"] + 2 or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


def measure(exporter: Exporter, args) -> dict:
    out = {}
    base, failed = timed_scrapes(exporter.url, args.scrapes)
    out["base"] = (pct(base, 0.5), pct(base, 0.99), failed, pct(base, 1.0))
    idle = exporter.figures()
    out["idle"] = idle
    peak = dict(idle)
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(OSError):
                peak = worst(peak, exporter.figures())
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    with Abuse(exporter.port, args.idle, args.slow) as abuse:
        sampler.start()
        time.sleep(2)  # the flood in place before the timed scrapes
        under, failed = timed_scrapes(exporter.url, args.scrapes, every=args.every)
        out["garbage"] = abuse.garbage_sent
    stop.set()
    sampler.join()
    out["abused"] = (pct(under, 0.5), pct(under, 0.99), failed, pct(under, 1.0))
    out["peak"] = peak
    out["after"] = settle(exporter, idle)
    return out


def starved(name: str, argv, port: int, idle: int) -> tuple[int, int, str]:
    """Open-files limit 128: `idle` idle connections held, then 50 scrapes."""
    exporter = Exporter(name, argv, port, nofile=128)
    held = []
    try:
        for _ in range(idle):
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        time.sleep(2.5)  # two polls of ibtool's --interval 1 while starved
        took, failed = timed_scrapes(exporter.url, 50)
        errors = ""
        if name == "ibtool":
            try:
                body = scrape(exporter.url, 5)
            except OSError as e:
                body = f"ibtool_exporter_poll_errors_total ({e})"
            errors = next(
                (
                    line.split()[-1]
                    for line in body.splitlines()
                    if line.startswith("ibtool_exporter_poll_errors_total ")
                ),
                "?",
            )
        return len(took), failed, errors
    finally:
        for s in held:
            s.close()
        exporter.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument(
        "--every",
        type=float,
        default=0.1,
        help="seconds between two scrapes under abuse (default 0.1: the abuse lasts 20 s, past "
        "the 10 s a slow head is given)",
    )
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if not os.access(NODE_EXPORTER, os.X_OK):
        print(
            f"note: {NODE_EXPORTER} missing (apt-get install prometheus-node-exporter): ibtool only"
        )
    work = Path(tempfile.mkdtemp(prefix="ibtool-bench-"))
    try:
        root = sysfs_trees.build("mlx5_ib_hca", work / "root")
        port_i = free_port()
        ibtool = [sys.executable, "-m", "ibtool", "--root", str(root), "exporter"]
        ibtool += ["--listen", f"127.0.0.1:{port_i}", "--interval", "1"]
        runs = {"ibtool": (ibtool, port_i)}
        if os.access(NODE_EXPORTER, os.X_OK):
            port_n = free_port()
            node = [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port_n}"]
            node += ["--collector.disable-defaults", "--collector.infiniband"]
            runs["node_exporter"] = (node, port_n)
        results = {}
        for name, (argv, port) in runs.items():
            exporter = Exporter(name, argv, port)
            try:
                results[name] = measure(exporter, args)
            finally:
                exporter.stop()
            results[name]["starved"] = starved(name, argv, port, 200)
        report(results, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(results: dict, args) -> None:
    names = list(results)
    print(
        f"abuse: {args.idle} idle connections, {args.slow} slowloris heads (a byte a second), "
        f"4 streams of garbage requests; {args.scrapes} timed scrapes each (under abuse one "
        f"every {args.every:g} s), a new connection per scrape"
    )
    print(f"{'':34}" + "".join(f"{n:>22}" for n in names))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:34}" + "".join(f"{c:>22}" for c in cells))

    row(
        "scrape p50/p99/max ms, no abuse",
        [f"{r['base'][0]:.1f} / {r['base'][1]:.1f} / {r['base'][3]:.1f}" for r in results.values()],
    )
    row(
        "scrape p50/p99/max ms, under abuse",
        [
            f"{r['abused'][0]:.1f} / {r['abused'][1]:.1f} / {r['abused'][3]:.1f}"
            for r in results.values()
        ],
    )
    row(
        "scrapes failed under abuse",
        [f"{r['abused'][2]} of {args.scrapes}" for r in results.values()],
    )
    row("garbage requests sent", [str(r["garbage"]) for r in results.values()])
    for phase in ("idle", "peak", "after"):
        row(
            f"threads / fds / RSS MiB, {phase}",
            [
                f"{r[phase]['threads']} / {r[phase]['fds']} / {r[phase]['rss_mib']:.1f}"
                for r in results.values()
            ],
        )
    row(
        "open files 128, 200 idle: answered",
        [
            f"{r['starved'][0]} of 50" + (f", errs {r['starved'][2]}" if r["starved"][2] else "")
            for r in results.values()
        ],
    )
    if len(names) == 2:
        a, b = (results[n]["abused"][1] for n in names)
        print(f"p99 under abuse, {names[0]} / {names[1]}: x{a / b:.2f}")


if __name__ == "__main__":
    sys.exit(main())
