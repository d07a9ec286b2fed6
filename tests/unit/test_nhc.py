"""The NHC check file: check_ibtool as LBNL NHC sources and calls it, against an ibtool that
answers with each Nagios status."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from ibtool.cli import main

NHC = Path(__file__).resolve().parents[2] / "ibtool" / "data" / "ibtool.nhc"
CRITICAL = (
    "IBTOOL CRITICAL - rxe0/1: state DOWN (physical_state DISABLED) | 'rxe0/1 rate Gb/s'=10;;;0\n"
    "[CRITICAL] port rxe0/1: state DOWN (physical_state DISABLED)\n"
    "[OK] system 2 RDMA devices\n"
)


def nhc(tmp_path: Path, answer: str, code: int, *args: str, env: str = "") -> list[str]:
    """What NHC's die and log received when check_ibtool ran with `args`, the fake ibtool
    printing `answer` and exiting `code`; and the fake's own arguments."""
    fake = tmp_path / "ibtool"
    (tmp_path / "answer").write_text(answer)
    fake.write_text(
        f'#!/bin/sh\necho "$*" > {tmp_path}/args\ncat {tmp_path}/answer\n'
        f"echo 'ibtool: warning: noise' >&2\nexit {code}\n"
    )
    fake.chmod(0o755)
    script = (
        'log() { echo "log: $*"; }\n'
        'die() { echo "die: $*"; }\n'
        f"{env}IBTOOL={fake}\n"
        f". {NHC}\n"
        'check_ibtool "$@"; echo "rc: $?"\n'
    )
    out = subprocess.run(
        ["bash", "-c", script, "nhc", *args], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines() + [f"args: {(tmp_path / 'args').read_text().strip()}"]


def test_the_file_is_bash():
    subprocess.run(["bash", "-n", str(NHC)], check=True)


def test_critical_marks_the_node_down_with_the_summary(tmp_path):
    assert nhc(tmp_path, CRITICAL, 2, "--config", "/etc/ibtool/health.toml") == [
        "log: check_ibtool: " + CRITICAL.splitlines()[0],
        "log: check_ibtool: [CRITICAL] port rxe0/1: state DOWN (physical_state DISABLED)",
        "log: check_ibtool: [OK] system 2 RDMA devices",
        "die: 1 ibtool: CRITICAL: rxe0/1: state DOWN (physical_state DISABLED)",
        "rc: 1",
        "args: health --config /etc/ibtool/health.toml",
    ]


def test_ok_passes_and_logs(tmp_path):
    lines = nhc(tmp_path, "IBTOOL OK - all OK: port 2\n[OK] port rxe0/1: ACTIVE\n", 0)
    assert lines[-2:] == ["rc: 0", "args: health"]
    assert not any(line.startswith("die:") for line in lines)


@pytest.mark.parametrize(("env", "dies"), [("", False), ("IBTOOL_NHC_FAIL_ON_WARNING=1\n", True)])
def test_a_warning_is_logged_and_fails_only_when_asked(tmp_path, env, dies):
    answer = "IBTOOL WARNING - rxe0/1: link went down once since the last run (flap)\n"
    lines = nhc(tmp_path, answer, 1, env=env)
    died = [line for line in lines if line.startswith("die:")]
    assert died == (
        ["die: 1 ibtool: WARNING: rxe0/1: link went down once since the last run (flap)"]
        if dies
        else []
    )
    assert lines[-2] == ("rc: 1" if dies else "rc: 0")


def test_unknown_and_a_broken_ibtool_mark_the_node_down(tmp_path):
    lines = nhc(tmp_path, "IBTOOL UNKNOWN - config /etc/ibtool/health.toml:3: bad\n", 3)
    assert "die: 1 ibtool: UNKNOWN: config /etc/ibtool/health.toml:3: bad" in lines
    lines = nhc(tmp_path, "", 70)
    assert "die: 1 ibtool health failed (exit 70): no output" in lines


def test_ibtool_prints_the_file_it_ships():
    out = io.StringIO()
    assert main(["health", "--print-nhc"], stdout=out) == 0
    assert out.getvalue() == NHC.read_text()
