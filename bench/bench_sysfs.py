#!/usr/bin/env python3
"""Benchmark: ibtool's sysfs commands on SR-IOV trees of growing size, against show_gids' way.

Prints wall times (median of several runs), per-device cost, growth between sizes, and the
ratio against a shell loop that reads every GID file with `cat` as show_gids does — both
measured in the same run on the same trees. Targets (issue 2): `ibtool -j gids` on the
500-VF tree under 0.3 s; time linear in the number of devices.

Usage: .venv/bin/python bench/bench_sysfs.py [--sizes 100,250,500] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.sysfs_trees import sriov_vfs  # noqa: E402

IBTOOL = [sys.executable, "-m", "ibtool"]
SHELL_LOOP = [str(REPO / "bench" / "show_gids_loop.sh")]
TARGET_GIDS_500 = 0.3


def timed(cmd: list[str], runs: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        out = proc.stdout
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,250,500")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ibtool-bench-"))
    try:
        startup, _ = timed([*IBTOOL, "--version"], args.runs)
        print(f"ibtool --version: {startup * 1000:.1f} ms (interpreter + import floor)")
        print()
        header = (
            f"{'VFs':>5} {'devices':>7} {'gids':>6} {'command':<14} {'ibtool s':>9} "
            f"{'shell s':>8} {'shell/ibtool':>12} {'ms/device':>9}"
        )
        print(header)
        print("-" * len(header))
        gid_times = {}
        for n in sizes:
            root = work / f"vfs{n}"
            sriov_vfs(root, count=n)
            devices = len(os.listdir(root / "sys/class/infiniband"))
            shell_t, shell_out = timed([*SHELL_LOOP, str(root)], max(1, args.runs // 2))
            for command in (["dev"], ["port"], ["-j", "gids"]):
                t, out = timed([*IBTOOL, "--root", str(root), *command], args.runs)
                name = " ".join(command)
                gids = shell_out.count("\n") if command[-1] == "gids" else ""
                ratio = f"{shell_t / t:12.1f}" if command[-1] == "gids" else f"{'':>12}"
                shell = f"{shell_t:8.3f}" if command[-1] == "gids" else f"{'':>8}"
                per_dev = (t - startup) / devices * 1000
                print(
                    f"{n:>5} {devices:>7} {gids!s:>6} {name:<14} {t:9.3f} {shell} {ratio} "
                    f"{per_dev:9.3f}"
                )
                if command[-1] == "gids":
                    gid_times[n] = t
            shutil.rmtree(root)
        print()
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            growth = (gid_times[hi] - startup) / max(gid_times[lo] - startup, 1e-9)
            print(
                f"growth of -j gids above startup, {lo} -> {hi} VFs: x{growth:.2f} "
                f"(linear would be x{hi / lo:.2f})"
            )
        if 500 in gid_times:
            verdict = "met" if gid_times[500] < TARGET_GIDS_500 else "MISSED"
            print(
                f"target -j gids on 500 VFs < {TARGET_GIDS_500} s: {gid_times[500]:.3f} s, "
                f"{verdict}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
