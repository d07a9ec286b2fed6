#!/usr/bin/env python3
"""Benchmark: a snapshot's replay, checked as untrusted input, against reading the tree itself.

On the largest host measured (an mlx5 PF with 500 RoCE VFs: 28,348 sysfs entries), prints the
median wall time and peak memory of `ibtool --snapshot S -j gids` (read, check every entry and
link, read the tree from memory) beside `ibtool --root TREE -j gids` on the same tree
and their ratio, measured in the same run; then the peak memory of refusing a gzip bomb of
1 GB in 1 MB, beside ibtool's floor (a usage error after the plugins are loaded). Each peak is
the child's own high-water mark (VmHWM), which starts anew at its exec.

Usage: .venv/bin/python bench/bench_snapshot.py [--runs 7]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ibtool.errors import IbtoolError  # noqa: E402
from ibtool.snapshot import save as snapshot  # noqa: E402
from tests.fixtures.peak import PEAK  # noqa: E402
from tests.fixtures.sysfs_trees import sriov_vfs  # noqa: E402


def timed(argv: list[str], runs: int, expect: int = 0) -> tuple[float, float]:
    """Median wall seconds and median peak MiB of `ibtool ARGV`."""
    walls, peaks = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, cwd=REPO
        )
        walls.append(time.perf_counter() - t0)
        if proc.returncode != expect:
            raise SystemExit(f"ibtool {' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
        peaks.append(int(proc.stderr.splitlines()[-1].split()[1]) / 1024)
    return statistics.median(walls), statistics.median(peaks)


def no_kernel():
    raise IbtoolError("the benchmark records no kernel")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ibtool-bench-"))
    try:
        tree, saved, bomb = work / "tree", work / "vf500.json.gz", work / "bomb.json.gz"
        sriov_vfs(tree, 500)
        data = snapshot.save(
            str(saved), lambda m: None, "bench", root=str(tree), open_netlink=no_kernel,
            open_verbs=no_kernel,
        )  # fmt: skip
        member = gzip.compress(b" " * (1 << 20), compresslevel=9)
        bomb.write_bytes(member * 1024)
        print(
            f"500 VFs: {len(data['sysfs'])} sysfs entries, {saved.stat().st_size:,} bytes "
            f"compressed; bomb: {bomb.stat().st_size:,} bytes holding 1 GiB"
        )
        rows = [
            ("--root TREE -j gids", ["--root", str(tree), "-j", "gids"], 0),
            ("--snapshot S -j gids", ["--snapshot", str(saved), "-j", "gids"], 0),
            ("--snapshot BOMB port", ["--snapshot", str(bomb), "port"], 7),
            ("floor (usage error)", ["--root", str(work / "none"), "port"], 2),
        ]
        figures = {}
        print(f"{'command':<24} {'wall s':>8} {'peak MiB':>9}")
        for name, argv, expect in rows:
            figures[name] = timed(argv, args.runs, expect)
            print(f"{name:<24} {figures[name][0]:8.3f} {figures[name][1]:9.1f}")
        root, snap = figures[rows[0][0]], figures[rows[1][0]]
        bomb_peak, floor = figures[rows[2][0]][1], figures[rows[3][0]][1]
        print(f"snapshot / root: wall x{snap[0] / root[0]:.2f}, peak x{snap[1] / root[1]:.2f}")
        print(f"bomb refused at {bomb_peak:.1f} MiB, {bomb_peak - floor:+.1f} MiB over the floor")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
