#!/usr/bin/env python3
"""Benchmark: what each headless command costs to start, against the bare interpreter.

Every case is a whole process run the way an operator runs it (the `ibtool` entry point beside
this interpreter, else `python -m ibtool`), and its CPU (user + system, from wait4's rusage of
the child) is the figure: wall time on a shared machine measures the neighbours. The reference
is `python -c pass` with the same interpreter and environment (site, the venv's .pth files), run
interleaved with the cases, so each ratio is taken in the same run. Commands that need a live
kernel or a peer (ping, doctor, mesh, loopback, monitor, exporter, tui) are started as far as
their parser (`CMD --help`); the others answer from a --root tree (mlx5 RoCE), from the
testbed's snapshot, or from nothing (--version, plugins, completion).

Targets (issue 43): every case at most 3x the interpreter, --version at most 2x.

Usage: python bench/bench_startup.py [--runs 9] [--only=NAME ...] [--imports]
    --imports   also print, for `-j port`, the modules imported beyond the interpreter's own
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.sysfs_trees import build  # noqa: E402

SNAPSHOT = REPO / "tests/fixtures/captured/snapshot/host.json.gz"
FABRIC = REPO / "tests/fixtures/captured/snapshot/fabric.json.gz"


def entry_point() -> list[str]:
    script = Path(sys.executable).parent / "ibtool"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "ibtool"]


def cpu(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """CPU seconds (user + system) of one run of argv, and its exit code."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, proc.returncode


def cases(tree: str) -> list[tuple[str, list[str], float]]:
    """(name, arguments, the target ratio)."""
    root = ["--root", tree]
    snap = ["--snapshot", str(SNAPSHOT)]
    found = [
        ("--version", ["--version"], 2.0),
        ("port -j", [*root, "-j", "port"], 3.0),
        ("port", [*root, "port"], 3.0),
        ("dev", [*root, "dev"], 3.0),
        ("gids", [*root, "gids"], 3.0),
        ("gids --best", [*root, "gids", "--best"], 3.0),
        ("counters", [*root, "counters"], 3.0),
        ("health", [*root, "health", "--no-state", "--config", "/dev/null"], 3.0),
        ("health --list", ["health", "--list"], 3.0),
        ("plugins", ["plugins"], 3.0),
        ("completion bash", ["completion", "bash"], 3.0),
        ("res (snapshot)", [*snap, "res"], 3.0),
        ("system (snapshot)", [*snap, "system"], 3.0),
        ("snapshot show", ["snapshot", "show", str(SNAPSHOT)], 3.0),
        ("fabric (snapshot)", ["--snapshot", str(FABRIC), "fabric"], 3.0),
        ("unknown device", [*root, "port", "show", "nosuch0"], 3.0),
        ("usage error", ["port", "--no-such-option"], 3.0),
    ]
    for command in ("ping", "doctor", "mesh", "loopback", "monitor", "exporter", "tui"):
        found.append((f"{command} --help", [command, "--help"], 3.0))
    return found


def imports_beyond(tree: str, env: dict[str, str]) -> list[str]:
    probe = (
        "import sys; base = set(sys.modules)\n"
        "from ibtool.cli import main\n"
        "import io; main(sys.argv[1:], stdout=io.StringIO())\n"
        "print('\\n'.join(sorted(set(sys.modules) - base)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, "--root", tree, "-j", "port"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    ).stdout
    return out.split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--only", action="append", help="a case to run, as --only=NAME (default: all)")
    ap.add_argument("--imports", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ, COLUMNS="80", TZ="UTC")
    for name in ("IBTOOL_DISABLE_PLUGIN_AUTOLOAD", "IBTOOL_PLUGINS", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    # As installed (a wheel's or a package's byte code is compiled when installed): a source
    # whose .pyc is stale would be compiled again at every start of this checkout.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "ibtool", "plugins"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    work = Path(tempfile.mkdtemp(prefix="ibtool-bench-"))
    try:
        tree = str(build("mlx5_roce", work / "roce"))
        ibtool = entry_point()
        bare = [sys.executable, "-c", "pass"]
        selected = [c for c in cases(tree) if not args.only or c[0] in args.only]
        print(f"Python {sys.version.split()[0]} ({sys.executable}); ibtool: {' '.join(ibtool)}")
        print(f"CPU seconds, median of {args.runs} runs, each case interleaved with the bare")
        print("interpreter (python -c pass); ratio = case / interpreter in the same runs\n")
        print(f"{'case':24} {'CPU s':>7} {'python':>7} {'ratio':>6} {'target':>6}  rc")
        worst = 0.0
        over = []
        for name, argv, target in selected:
            mine, base, codes = [], [], set()
            for _ in range(args.runs):
                base.append(cpu(bare, env)[0])
                seconds, rc = cpu([*ibtool, *argv], env)
                mine.append(seconds)
                codes.add(rc)
            m, b = statistics.median(mine), statistics.median(base)
            ratio = m / b if b else float("inf")
            worst = max(worst, ratio / target)
            if ratio > target:
                over.append(name)
            rcs = ",".join(str(c) for c in sorted(codes))
            print(f"{name:24} {m:7.3f} {b:7.3f} {ratio:5.1f}x {target:5.1f}x  {rcs}")
        print()
        print(f"over target: {', '.join(over) if over else 'none'}")
        if args.imports:
            extra = imports_beyond(tree, env)
            print(f"\n`-j port` imports {len(extra)} modules beyond the interpreter's own:")
            print(" ".join(extra))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
