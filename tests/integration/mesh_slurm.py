"""One Slurm cluster over the guests of `testbed mesh` (Debian's slurm-wlm 22.05 and munge,
from the host the guests share): munged on every node with the run's key (installed by
tests/testbed/guest.sh), slurmctld on node1, slurmd on every node, all nodes in one
partition, all talking over the management network (10.78.0.K). The daemons' settings are the
one-node cluster's (tests/integration/slurm.py)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from tests.integration.faults import wait_for
from tests.integration.mesh import Mesh, Node
from tests.integration.slurm import CGROUP_CONF, CGROUP_SETTINGS, CONF, DAEMONS, DIRS, SETTINGS

PARTITION = "mesh"

# Each node, before its daemons: the configuration, the cgroup slurmd 22.05 wants (no systemd
# in the guest), munged's directories (the guest's /run and /var are empty overlays) and munged.
_PREPARE = f"""set -e
mkdir -p {" ".join(DIRS)} /etc/slurm
printf %s "$1" > {CONF}
printf %s "$2" > {CGROUP_CONF}
[ -e /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/system.slice
for d in /run/munge /var/log/munge /var/lib/munge; do
    mkdir -p -m 700 "$d"; chown munge:munge "$d"
done
pgrep -x munged >/dev/null || runuser -u munge -- munged --force
"""

# Each node, at the end: every daemon stopped (and waited for), the configuration removed.
_STOP = f"""for d in {" ".join(DAEMONS)}; do pkill -x "$d"; done
for _ in $(seq 150); do
    pgrep -x '{"|".join(DAEMONS)}' >/dev/null || break
    sleep 0.2
done
for d in {" ".join(DAEMONS)}; do pkill -KILL -x "$d"; done
rm -f {CONF} {CGROUP_CONF}
! pgrep -x '{"|".join(DAEMONS)}'
"""


def hostlist(names: list[str]) -> str:
    """node1..nodeN as Slurm writes them: node[1-N]."""
    numbers = [int(re.sub(r"\D", "", n)) for n in names]
    assert numbers == list(range(1, len(names) + 1)), names
    return f"node[1-{len(names)}]"


def config(mesh: Mesh) -> str:
    runner = mesh.runner
    n = len(mesh.nodes)
    lines = [
        "ClusterName=ibtoolmesh",
        # the management network: a fabric fault (port down, loss) does not cut Slurm off
        f"SlurmctldHost={runner.name}({runner.mgmt})",
        *SETTINGS,
        f"NodeName={hostlist(mesh.names())} NodeAddr=10.78.0.[1-{n}] CPUs=1 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={hostlist(mesh.names())} Default=YES "
        "MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


class SlurmMesh:
    """The running cluster: `nodes` (names), `partition`, commands on node1."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.nodes = mesh.names()
        self.partition = PARTITION

    def states(self) -> dict[str, str]:
        """{node: its state as sinfo prints it (idle, alloc, down*, ...)}."""
        proc = self.mesh.runner.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=60)
        if proc.returncode != 0:
            return {}
        return dict(line.split() for line in proc.stdout.splitlines() if line.strip())

    def srun(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """`srun ARGS...` on node1."""
        return self.mesh.runner.run(["srun", *args], timeout=timeout)

    def log_tail(self, node: Node, daemon: str) -> str:
        proc = node.run(["tail", "-n", "5", f"/var/log/slurm/{daemon}.log"], timeout=60)
        return " | ".join(proc.stdout.splitlines()) or proc.stderr.strip()


def _start(node: Node, daemon: str) -> None:
    proc = node.run([daemon], timeout=120)
    if proc.returncode != 0:
        tail = node.run(["tail", "-n", "5", f"/var/log/slurm/{daemon}.log"], timeout=60)
        raise RuntimeError(
            f"{daemon} on {node.name}: exit {proc.returncode}: {proc.stderr.strip()}; its log "
            f"ends: {' | '.join(tail.stdout.splitlines())}"
        )


@contextmanager
def slurm_mesh(mesh: Mesh, timeout: float = 300) -> Iterator[SlurmMesh]:
    """Slurm up over every node of `mesh`; yields once sinfo shows every node idle (under
    emulation slurmd takes 10 s and more to register); every daemon on every node stopped
    afterwards, whatever happened."""
    conf = config(mesh)
    cluster = SlurmMesh(mesh)
    try:
        for name, proc in mesh.on_all(
            lambda node: node.run(["sh", "-c", _PREPARE, "sh", conf, CGROUP_SETTINGS], 120)
        ).items():
            assert proc.returncode == 0, f"{name}: preparing Slurm: {proc.stderr.strip()}"
        _start(mesh.runner, "slurmctld")
        mesh.on_all(lambda node: _start(node, "slurmd"))

        def idle() -> bool:
            states = cluster.states()
            return sorted(states) == sorted(cluster.nodes) and all(
                s == "idle" for s in states.values()
            )

        try:
            wait_for(idle, f"every node idle in sinfo ({cluster.nodes})", timeout=timeout)
        except AssertionError as e:
            raise AssertionError(
                f"{e}: sinfo says {cluster.states()}; slurmctld's log ends: "
                f"{cluster.log_tail(mesh.runner, 'slurmctld')}"
            ) from None
        yield cluster
    finally:
        mesh.runner.run(["scontrol", "shutdown"], timeout=60)
        stopped = mesh.on_all(lambda node: node.run(["sh", "-c", _STOP], timeout=120))
        left = {n: p.stdout.strip() for n, p in stopped.items() if p.returncode != 0}
        assert not left, f"Slurm's daemons still running: {left}"
