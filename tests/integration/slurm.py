"""A one-node Slurm cluster inside the testbed VM (Debian's slurm-wlm and munge, installed on the
host the guest shares): munged, slurmctld and slurmd, with the node registered before a test
uses it. slurmd runs HealthCheckProgram (as root, without arguments) every HealthCheckInterval
seconds, as slurm.conf(5) says; a drain or resume through scontrol shows in sinfo -R."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.integration.faults import sh, wait_for

CONF = "/etc/slurm/slurm.conf"
CGROUP_CONF = "/etc/slurm/cgroup.conf"
DIRS = ("/var/spool/slurmctld", "/var/spool/slurmd", "/var/log/slurm")
DAEMONS = ("slurmd", "slurmctld", "munged")


def node_line(node: str) -> str:
    return sh("scontrol", "show", "node", node, "-o").strip()


def state_of(node: str) -> set[str]:
    m = re.search(r"(?:^|\s)State=(\S+)", node_line(node))
    return set(re.split(r"[+*]", m.group(1))) if m else set()


def reason_of(node: str) -> str | None:
    m = re.search(r"(?:^|\s)Reason=(.*) \[", node_line(node))
    return m.group(1) if m else None


def _munge() -> None:
    key = "/etc/munge/munge.key"
    if not os.path.exists(key):
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        sh("chown", "munge:munge", key)
        os.chmod(key, 0o400)
    # the guest's /var and /run are empty overlays: munged's directories, as its package makes them
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(d, mode=0o700, exist_ok=True)
        sh("chown", "munge:munge", d)
    sh("runuser", "-u", "munge", "--", "munged", "--force")


# slurm.conf's lines between SlurmctldHost and the nodes (tests/integration/mesh_slurm.py too)
SETTINGS = (
    "SlurmUser=root",
    "AuthType=auth/munge",
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "StateSaveLocation=/var/spool/slurmctld",
    "SlurmdSpoolDir=/var/spool/slurmd",
    "SlurmctldPidFile=/run/slurmctld.pid",
    "SlurmdPidFile=/run/slurmd.pid",
    "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
    "SlurmdLogFile=/var/log/slurm/slurmd.log",
    "ReturnToService=2",
    "SchedulerType=sched/builtin",
    "SelectType=select/cons_tres",
)
# slurmd 22.05 sets up a cgroup for its step daemons whatever the proctrack plugin; the guest
# has no systemd to ask for one (IgnoreSystemd: slurmd makes it in cgroupfs itself)
CGROUP_SETTINGS = "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"


def _config(node: str, program: str | None, interval: int) -> str:
    lines = [
        "ClusterName=ibtooltest",
        # the guest's name is in no /etc/hosts: every daemon is reached on the loopback
        f"SlurmctldHost={node}(127.0.0.1)",
        *SETTINGS,
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    if program:
        lines += [
            f"HealthCheckProgram={program}",
            f"HealthCheckInterval={interval}",
            "HealthCheckNodeState=ANY",
        ]
    return "\n".join(lines) + "\n"


@contextmanager
def slurm_node(program: str | None = None, interval: int = 0) -> Iterator[str]:
    """Slurm up with this host as its one node (HealthCheckProgram `program` every `interval`
    seconds, if given); yields the node's name once it registered (under emulation slurmd
    takes 10 s and more: `unk` until then, and RESUME is refused before it); everything
    stopped afterwards."""
    node = socket.gethostname().split(".")[0]
    for d in DIRS:
        os.makedirs(d, exist_ok=True)
    os.makedirs(os.path.dirname(CONF), exist_ok=True)
    with open(CONF, "w") as f:
        f.write(_config(node, program, interval))
    with open(CGROUP_CONF, "w") as f:
        f.write(CGROUP_SETTINGS)
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        sh("mount", "-t", "cgroup2", "none", "/sys/fs/cgroup")
    os.makedirs("/sys/fs/cgroup/system.slice", exist_ok=True)  # where it puts its scope
    try:
        _munge()
        for daemon in ("slurmctld", "slurmd"):
            try:
                sh(daemon)
            except RuntimeError as e:
                raise RuntimeError(f"{e}; its log ends: {_log_tail(daemon)}") from None

        def registered() -> bool:
            try:
                states = state_of(node) if _answers() else set()
            except RuntimeError:  # slurmctld not answering yet
                return False
            return bool(states) and not states & {"UNKNOWN", "NOT_RESPONDING", "DOWN"}

        wait_for(registered, f"slurmd on {node} to register", timeout=240)
        yield node
    finally:
        subprocess.run(["scontrol", "shutdown"], capture_output=True, timeout=60)
        for daemon in DAEMONS:
            subprocess.run(["pkill", "-x", daemon], capture_output=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            subprocess.run(["pgrep", "-x", d], capture_output=True).returncode == 0 for d in DAEMONS
        ):
            time.sleep(0.2)
        os.unlink(CONF)
        os.unlink(CGROUP_CONF)


def _log_tail(daemon: str) -> str:
    try:
        with open(f"/var/log/slurm/{daemon}.log") as f:
            return " | ".join(f.read().splitlines()[-5:])
    except OSError as e:
        return f"(no log: {e.strerror})"


def _answers() -> bool:
    return subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0
