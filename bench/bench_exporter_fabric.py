#!/usr/bin/env python3
"""Benchmark: `ibtool exporter --fabric` on a simulated 648-HCA fat tree.

ibsim serves bench_fabric.py's two-level fat tree (36 leaves of 18 HCAs, 18 spines) with opensm
as its subnet manager (tests/fabric/ibsim.py); the exporter runs on one of its nodes, with
--fabric and without, each until it has served `--scans` fabric scans (or as many polls).
Printed: each scan's duration and MADs (the exporter's own ibtool_fabric_scan_* series), the
MADs a second, the series and bytes a scrape serves and how long a scrape takes (the text
format, and OpenMetrics as Prometheus asks by default), and the exporter's peak RSS (VmHWM)
with --fabric and without; then one run paced at --paced MADs a second, whose scan must take
at least its PMA queries divided by that rate.

Usage: .venv/bin/python bench/bench_exporter_fabric.py [--scans 3] [--paced 1000]
       [--leaves 36] [--hcas 18] [--spines 18]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fabric.ibsim import SimFabric, fat_tree, missing  # noqa: E402

NODE = "node001 mlx5_0"


OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"


def scrape(url: str, accept: str = "") -> tuple[str, float]:
    began = time.monotonic()
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=120) as reply:
        body = reply.read().decode()
    return body, time.monotonic() - began


def value(body: str, name: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def run(sim: SimFabric, scans: int, *args: str) -> dict:
    """The exporter on NODE with `args`, until `scans` fabric scans (or polls, without
    --fabric) have been served; what it served and its peak RSS."""
    env = sim.env(NODE)
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "ibtool", "exporter", "--listen", "127.0.0.1:0"]
    log = open(sim.dir / "exporter.log", "w+")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv + ["--interval", "1", *args], env=env, stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("serving "):
            raise SystemExit(f"the exporter did not start: {line!r}")
        url = line.split()[1]
        fabric = "--fabric" in args
        counter = "ibtool_fabric_scans_total" if fabric else "ibtool_exporter_polls_total"
        seen: dict[float, tuple[float, float]] = {}
        deadline = time.monotonic() + 600
        body, took = "", 0.0
        while len(seen) < scans:
            if time.monotonic() > deadline or proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"{scans} scans not served: {log.read()[-2000:]}")
            body, took = scrape(url)
            n = value(body, counter)
            if n is not None and n not in seen:
                if fabric:
                    duration = value(body, "ibtool_fabric_scan_duration_seconds")
                    mads = value(body, "ibtool_fabric_scan_mads")
                    if value(body, "ibtool_fabric_up") != 1.0:
                        raise SystemExit("a fabric scan failed")
                    seen[n] = (duration or 0.0, mads or 0.0)
                else:
                    seen[n] = (0.0, 0.0)
            time.sleep(0.2)
        series = sum(1 for x in body.splitlines() if x.startswith("ibtool_fabric_"))
        openmetrics = [scrape(url, OPENMETRICS)[1] for _ in range(2)]  # Prometheus' default
        return {
            "openmetrics": openmetrics,
            "scans": list(seen.values()),
            "series": series,
            "bytes": len(body.encode()),
            "scrape": took,
            "peak": peak_rss_mib(proc.pid),
        }
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scans", type=int, default=3)
    ap.add_argument("--paced", type=int, default=1000)
    ap.add_argument("--leaves", type=int, default=36)
    ap.add_argument("--hcas", type=int, default=18)
    ap.add_argument("--spines", type=int, default=18)
    args = ap.parse_args()
    if missing():
        print(f"no simulated fabric here: {', '.join(missing())} missing", file=sys.stderr)
        return 1
    net = fat_tree(args.leaves, args.hcas, args.spines)
    with tempfile.TemporaryDirectory() as scratch, SimFabric(net, Path(scratch)) as sim:
        os.chdir(scratch)  # umad2sim's stand-in sysfs (./sys-PID) goes there
        interval = "--fabric-interval", "5"
        on = run(sim, args.scans, "--fabric", *interval)
        off = run(sim, args.scans)
        paced = run(sim, 1, "--fabric", *interval, "--fabric-mads", str(args.paced))
    durations = [d for d, _ in on["scans"]]
    mads = [m for _, m in on["scans"]]
    print(f"fabric: {args.leaves} leaves x {args.hcas} HCAs, {args.spines} spines; "
          f"{args.scans} scans served, default pace")  # fmt: skip
    print(f"scan                 median {statistics.median(durations):.2f} s "
          f"(min {min(durations):.2f}, max {max(durations):.2f}), "
          f"{statistics.median(mads):.0f} MADs, "
          f"{statistics.median(m / d for d, m in on['scans']):.0f} MADs/s")  # fmt: skip
    print(f"a scrape             {on['series']} fabric series, {on['bytes'] / 1024:.0f} KiB, "
          f"{on['scrape'] * 1000:.0f} ms")  # fmt: skip
    om = on["openmetrics"]
    print(f"an OpenMetrics one   {om[0] * 1000:.0f} ms the first after a scan (written then), "
          f"{om[1] * 1000:.0f} ms after")  # fmt: skip
    print(f"exporter peak RSS    --fabric {on['peak']:.1f} MiB, without {off['peak']:.1f} MiB "
          f"(+{on['peak'] - off['peak']:.1f} MiB); without: {off['bytes'] / 1024:.0f} KiB, "
          f"{off['scrape'] * 1000:.0f} ms a scrape")  # fmt: skip
    (d, m), = paced["scans"]  # fmt: skip
    print(f"paced at {args.paced}/s     scan {d:.2f} s, {m:.0f} MADs, {m / d:.0f} MADs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
