"""Draining this Slurm node when its RDMA health is CRITICAL; resuming it if ibtool drained it.

Through scontrol(1), as a HealthCheckProgram does (slurm.conf(5)): `scontrol update
NodeName=N State=DRAIN Reason=...` and `State=RESUME`. The reason starts with "ibtool: ", which
is how a later run tells its own drain from an administrator's: a node someone else drained is
never resumed, nor its reason replaced.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ibtool.errors import IbtoolError, UnsupportedError
from ibtool.model.deferred import dataclass

if TYPE_CHECKING:
    import subprocess

REASON_PREFIX = "ibtool: "
REASON_MAX = 120  # sinfo -R shows the first 20 characters by default; scontrol the whole reason
TIMEOUT = 10.0

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command (scontrol), bounded by TIMEOUT; its output as text."""
    import subprocess  # only where --slurm-drain asks: a health run never else

    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def node_name(env: Mapping[str, str] = os.environ) -> str:
    """This host's Slurm node name: SLURMD_NODENAME where slurmd set it, else the short host
    name (slurm.conf's NodeName is the short name unless NodeHostname says otherwise)."""
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    import socket

    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class NodeState:
    flags: frozenset[str]  # IDLE, DRAIN, DOWN, ...
    reason: str | None

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or "DRAINED" in self.flags or "DRAINING" in self.flags

    @property
    def ours(self) -> bool:
        return self.reason is not None and self.reason.startswith(REASON_PREFIX)


# `scontrol show node -o` (Slurm 22.05): one line of Key=Value fields, Reason last; its value
# has spaces and '=' of its own, and ends with " [user@time]" where Slurm knows who set it.
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON_SIGNED = re.compile(r"(?:^|\s)Reason=(.*) \[[^\]@]*@[^\]]*\]")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Z][A-Za-z]*=|\s*$)")


def parse_node(line: str) -> NodeState:
    state = _STATE.search(line)
    flags = frozenset(re.split(r"[+*]", state.group(1).upper())) - {""} if state else frozenset()
    m = _REASON_SIGNED.search(line) or _REASON.search(line)
    reason = m.group(1).strip() if m else None
    return NodeState(flags, None if reason in (None, "", "(null)") else reason)


def scontrol(args: list[str], run: Run = run_command) -> str:
    import subprocess

    try:
        proc = run(["scontrol", *args])
    except FileNotFoundError:
        raise UnsupportedError(
            "--slurm-drain needs scontrol, which is not on PATH",
            "run on a Slurm node (package slurm-client), or drop --slurm-drain",
        ) from None
    except subprocess.TimeoutExpired:
        raise IbtoolError(f"scontrol {args[0]} took more than {TIMEOUT:g} s") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise IbtoolError(f"scontrol: {lines[0] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def node_state(node: str, run: Run = run_command) -> NodeState:
    return parse_node(scontrol(["show", "node", node, "-o"], run).strip())


def _reason(summary: str) -> str:
    text = REASON_PREFIX + " ".join(summary.split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def apply(
    critical: bool, summary: str, node: str | None = None, run: Run = run_command
) -> str | None:
    """Drains `node` (default: this host's) with the summary as the reason when `critical`;
    otherwise resumes it if ibtool drained it. Says what it did, or None."""
    node = node or node_name()
    state = node_state(node, run)
    if critical:
        reason = _reason(summary)
        if state.drained and not state.ours:
            return f"slurm: node {node} drained by someone else ({state.reason}): left alone"
        if state.drained and state.reason == reason:
            return None
        scontrol(["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], run)
        return f"slurm: drained node {node}: {reason}"
    if state.drained and state.ours:
        scontrol(["update", f"NodeName={node}", "State=RESUME"], run)
        was = state.reason[len(REASON_PREFIX) :]
        return f"slurm: resumed node {node}, which ibtool had drained for: {was}"
    return None
