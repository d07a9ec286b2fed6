"""The engines a mesh fans out through, all alike to the coordinator: start the agent on every
node with its join on its standard input, hand over what each says before it joins (why it
could not: ssh failed, no ibtool, no RDMA device) and how it ended, close. Once joined, an
agent speaks over its own connection to the coordinator (channel.py), not through the engine.

- ClusterShell (its Python API: ssh as the cluster has it configured, clush.conf's options,
  a gateway tree where topology.conf defines one), one worker a node (each its own join),
  through a window of ssh at a time (--fanout, clush's 64): an agent leaves its ssh once it
  joined, so the window moves on. ClusterShell keeps no copy of the output (msgtree off).
- Slurm: `srun` inside an allocation, one task per node, the join broadcast to every task
  (srun's default --input=all), each output line labelled with its task (--label).
- local: this host alone (`ibtool mesh --local`), the agent as a child process.

Events come through a queue from the engine's own thread(s), so the coordinator waits on one
thing with one timeout, whatever the engine.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import threading

from ibtool.errors import IbtoolError, UnsupportedError, UsageError
from ibtool.mesh.protocol import MAX_LINE
from ibtool.model.deferred import dataclass

LINE, STDERR, EXIT = "line", "stderr", "exit"


@dataclass(frozen=True)
class Event:
    node: str  # the engine's name for the node ("" for the whole engine)
    kind: str  # LINE, STDERR or EXIT
    data: object  # the line (str), or the exit code (int)
    origin: str = "engine"  # or channel.CHANNEL: the agent's own connection


class Engine:
    name = "engine"
    nodes: list[str]
    # Whether its agents leave it once joined (--detach): ssh's do, so that its window moves
    # on; srun's must not (the step's end kills what it started) and need not (one srun).
    detaches = False
    # Whether each node gets its own join (its own token and key); else one join for all,
    # each agent keyed by its task (srun's --input=all is one stream)
    own_joins = True

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def start(self, argv: list[str], joins: dict[str, str]) -> None:
        """Start `argv` on every node, `joins[node]` its first line of input (`joins[""]`
        for every node, where the engine has one input for all)."""
        raise NotImplementedError

    def close(self, grace: float) -> None:
        raise NotImplementedError

    def get(self, timeout: float) -> Event | None:
        try:
            return self.events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def name_of(self, key: str) -> str | None:
        """The node an event's key stands for when the engine knows it and the agent never
        said (srun's task number); None where the key is the node's name itself."""
        return None


def _line(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text.rstrip("\r\n")


# -- ClusterShell ----------------------------------------------------------------------------

_ABORT = "abort"


def parse_nodeset(text: str) -> list[str]:
    """A ClusterShell node set (`node[001-064]`, `a,b`, `@group`) as its nodes."""
    try:
        from ClusterShell.NodeSet import NodeSet, NodeSetException
    except ImportError:
        raise UnsupportedError(
            "ibtool mesh NODESET fans out through ClusterShell, which is not installed",
            "apt install python3-clustershell (EPEL: python3-clustershell), or pip install "
            "'ibtool[mesh]'; inside a Slurm allocation --srun needs none",
        ) from None
    try:
        nodes = list(NodeSet(text))
    except (NodeSetException, ValueError) as e:
        raise UsageError(
            f"{text}: not a node set ({e})", "as clush -w takes it: node[01-16]"
        ) from None
    if not nodes:
        raise UsageError(f"{text}: no nodes", "as clush -w takes it: node[01-16]")
    return nodes


# Descriptors of this process: one a joined agent (its connection, channel.py) for the whole
# mesh, and, while ClusterShell starts them, three an ssh in its window (stdin, stdout and
# stderr pipes). clush raises its soft limit to min(hard, fd_max = 8192) for the same reason
# (ClusterShell CLI/Clush.py set_fdlimit); what cannot be raised shrinks the window.
FDS_PER_START = 3
FDS_SPARE = 24  # this process's own: the runtime, the listener, ClusterShell's port and poll
FD_MAX = 8192
FANOUT = 64  # ssh at a time, as clush's default fanout


def open_files_for(nodes: int, starting: int = 1, limits=None) -> int:
    """Raises this process's soft limit of open files as clush does, enough for `nodes`
    joined agents and `starting` ssh at once; the soft limit now. UsageError when the
    hard limit cannot hold the agents and one ssh."""
    import resource

    get, set_ = limits or (resource.getrlimit, resource.setrlimit)
    soft, hard = get(resource.RLIMIT_NOFILE)
    least = nodes + FDS_PER_START + FDS_SPARE
    needed = nodes + FDS_PER_START * max(1, starting) + FDS_SPARE
    unlimited = hard == resource.RLIM_INFINITY
    if not unlimited and hard < least:
        raise UsageError(
            f"{nodes} nodes need about {least} open files (one a node's agent), and this "
            f"process may open {hard} (ulimit -Hn)",
            "raise the hard limit (limits.conf nofile), or fewer nodes at a time",
        )
    wanted = max(needed, FD_MAX) if unlimited else min(hard, max(needed, FD_MAX))
    if soft != resource.RLIM_INFINITY and soft < wanted:
        set_(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted
    return soft


def window(nodes: int, fanout: int, soft: int) -> int:
    """ssh at a time: `fanout`, or fewer where the open files left beside the joined agents
    take fewer (at least one)."""
    room = (soft - nodes - FDS_SPARE) // FDS_PER_START if soft >= 0 else fanout
    return max(1, min(fanout, nodes, room))


class ClusterShellEngine(Engine):
    name = "clustershell"
    detaches = True

    def __init__(self, nodeset: str, connect_timeout: float | None = None, remote: bool = True,
                 fanout: int = FANOUT):  # fmt: skip
        """`remote` False: ClusterShell's exec worker runs the command here once a node, %h
        in it standing for the node (`ip netns exec %h ...`, a container, a test)."""
        super().__init__()
        self.remote = remote
        self.nodes = parse_nodeset(nodeset)
        self.nodeset = nodeset
        self.connect_timeout = connect_timeout
        self.fanout = fanout
        self.window = fanout
        self.port = None
        self.thread: threading.Thread | None = None

    def start(self, argv: list[str], joins: dict[str, str]) -> None:
        soft = open_files_for(len(self.nodes), self.fanout)
        self.window = window(len(self.nodes), self.fanout, soft)
        ready = threading.Event()
        failed: list[BaseException] = []
        self.thread = threading.Thread(
            target=self._loop, args=(shlex.join(argv), joins, ready, failed), daemon=True
        )
        self.thread.start()
        ready.wait()
        if failed:
            raise IbtoolError(f"ClusterShell could not start: {failed[0]}")

    def _loop(self, command: str, joins: dict, ready: threading.Event, failed: list) -> None:
        from ClusterShell.Event import EventHandler
        from ClusterShell.NodeSet import NodeSet
        from ClusterShell.Task import task_self

        events = self.events

        class Reader(EventHandler):
            def ev_read(self, worker, node, sname, msg):
                kind = LINE if sname == "stdout" else STDERR
                events.put(Event(str(node), kind, _line(msg[: MAX_LINE + 1])))

            def ev_hup(self, worker, node, rc):
                events.put(Event(str(node), EXIT, rc))

        class Writer(EventHandler):
            def ev_msg(self, port, msg):
                if msg == _ABORT:
                    task.abort(kill=True)

        try:
            task = task_self()
            task.set_default("stdout_msgtree", False)  # the coordinator keeps what it needs
            task.set_default("stderr_msgtree", False)
            # ssh at a time: each ends once its agent joined (it detaches), the next starts
            task.set_info("fanout", self.window)
            if self.connect_timeout:
                task.set_info("connect_timeout", self.connect_timeout)
            reader = Reader()
            for node in self.nodes:  # a worker a node: each its own join on its stdin
                worker = task.shell(command, nodes=NodeSet(node), handler=reader,
                                    stderr=True, remote=self.remote)  # fmt: skip
                worker.write(joins[node].encode())  # kept until its ssh starts
                worker.set_write_eof()
            self.port = task.port(handler=Writer(), autoclose=True)
        except Exception as e:  # ClusterShell's own errors: said by start()
            failed.append(e)
            ready.set()
            return
        ready.set()
        try:
            task.resume()
        except Exception as e:
            events.put(Event("", STDERR, f"ClusterShell: {e}"))
        events.put(Event("", EXIT, None))

    def close(self, grace: float) -> None:
        if self.thread is None:
            return
        self.thread.join(grace)  # the ssh still starting agents, or stuck
        if self.thread.is_alive() and self.port is not None:
            self.port.msg_send(_ABORT)  # ssh killed: an agent sees EOF and cleans up
            self.thread.join(10)


# -- a child process: srun, or the local agent -----------------------------------------------


class ProcessEngine(Engine):
    """One child process carrying every agent's stdin and stdout."""

    def __init__(self) -> None:
        super().__init__()
        self.proc: subprocess.Popen | None = None

    def command(self, argv: list[str]) -> list[str]:
        raise NotImplementedError

    def node_of(self, line: str) -> tuple[str, str] | None:
        raise NotImplementedError

    def start(self, argv: list[str], joins: dict[str, str]) -> None:
        open_files_for(len(self.nodes))
        cmd = self.command(argv)
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C here is ours to pass on, once
            )
        except OSError as e:
            raise IbtoolError(
                f"cannot run {cmd[0]}: {e.strerror or e}", self.missing_hint()
            ) from None
        for stream, kind in ((self.proc.stdout, LINE), (self.proc.stderr, STDERR)):
            threading.Thread(target=self._read, args=(stream, kind), daemon=True).start()
        threading.Thread(target=self._wait, daemon=True).start()
        # the join, then EOF: an agent reads one line of its input (srun: every task's)
        join = joins[""] if "" in joins else joins[self.nodes[0]]
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self.proc.stdin.write(join.encode())
            self.proc.stdin.close()

    def missing_hint(self) -> str | None:
        return None

    def _read(self, stream, kind: str) -> None:
        while True:
            raw = stream.readline(MAX_LINE + 1)
            if not raw:
                return
            labelled = self.node_of(_line(raw))
            if labelled is None:
                continue
            node, text = labelled
            self.events.put(Event(node, kind, text))

    def _wait(self) -> None:
        rc = self.proc.wait()
        self.events.put(Event("", EXIT, rc))

    def close(self, grace: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, sig)


class LocalEngine(ProcessEngine):
    name = "local"

    def __init__(self) -> None:
        super().__init__()
        self.nodes = [socket.gethostname().split(".")[0]]

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def node_of(self, line: str) -> tuple[str, str]:
        return self.nodes[0], line


_LABEL = re.compile(r"\s*(\d{1,7}): ?(.*)\Z", re.S)


class SrunEngine(ProcessEngine):
    """`srun -N n --ntasks-per-node=1 --label` in the allocation; task i names its node in
    its hello (SLURMD_NODENAME), so the coordinator maps tasks to nodes by what they say."""

    name = "srun"
    own_joins = False

    def __init__(self, nodeset: str | None, overlap: bool, srun: str = "srun"):
        super().__init__()
        self.srun = srun
        if nodeset:
            self.nodes = parse_nodeset(nodeset)
        else:
            listed = os.environ.get("SLURM_JOB_NODELIST")
            if not listed:
                raise UsageError(
                    "--srun without NODESET runs in a Slurm allocation, and this is not one",
                    "salloc -N 4 ibtool mesh --srun, or give the nodes: ibtool mesh --srun NODESET",
                )
            self.nodes = expand_hostlist(listed, srun)
        self.overlap = overlap
        self.labels: dict[str, str] = {}  # task -> node, from hellos
        # "taskN" -> node, from srun's own line about a task that ended: srun names the node,
        # which an agent that died before its hello never did
        self.task_nodes: dict[str, str] = {}

    def command(self, argv: list[str]) -> list[str]:
        n = str(len(self.nodes))
        cmd = [self.srun, "--nodes", n, "--ntasks", n, "--ntasks-per-node", "1", "--label",
               "--unbuffered", "--kill-on-bad-exit=0", "--input=all",
               "--nodelist", ",".join(self.nodes)]  # fmt: skip
        if self.overlap:
            cmd.append("--overlap")  # Slurm 20.11 and later: steps share the allocation
        return cmd + ["--"] + argv

    def name_of(self, key: str) -> str | None:
        return self.task_nodes.get(key)

    def missing_hint(self) -> str:
        return "srun comes with Slurm (slurm-client): run inside an allocation (salloc, sbatch)"

    def node_of(self, line: str) -> tuple[str, str] | None:
        m = _LABEL.match(line)
        if not m:
            ended = _TASK_EXIT.match(line)
            if ended:  # srun's word that tasks ended: their EXIT, now, not at a timeout
                code = int(ended.group(3)) if ended.group(3) else None
                tasks = _tasks(ended.group(2))
                # one task a node (--ntasks-per-node 1): a line naming one task names its node
                if len(tasks) == 1 and ended.group(1) in self.nodes:
                    self.task_nodes[f"task{tasks[0]}"] = ended.group(1)
                for task in tasks:
                    self.events.put(Event(f"task{task}", EXIT, code))
            return None
        return f"task{m.group(1)}", m.group(2)


# srun(1) on a task that ended badly (src/srun/srun_job.c, _task_finish): "srun: error:
# NODE: task 2: Exited with exit code 3", or "tasks 0-1,3" for several.
_TASK_EXIT = re.compile(
    r"srun: error: (\S+): tasks? ([\d,-]+): (?:Exited with exit code (\d+)|.*)\Z"
)


def _tasks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out += range(int(lo), int(hi or lo) + 1)
    return out[:100000]


def expand_hostlist(text: str, srun: str = "srun") -> list[str]:
    """A Slurm hostlist as its nodes: ClusterShell's node sets read it, else scontrol does."""
    try:
        return parse_nodeset(text)
    except UnsupportedError:
        pass
    scontrol = os.path.join(os.path.dirname(srun), "scontrol") if os.sep in srun else "scontrol"
    try:
        out = subprocess.run(
            [scontrol, "show", "hostnames", text], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IbtoolError(f"cannot expand the allocation's nodes {text}: {e}") from None
    nodes = out.stdout.split()
    if out.returncode or not nodes:
        raise IbtoolError(f"cannot expand the allocation's nodes {text}: {out.stderr.strip()}")
    return nodes


def slurm_overlap(srun: str = "srun") -> bool:
    """Whether srun takes --overlap (Slurm 20.11 and later, where a step needs it to share
    the allocation's CPUs with another): `srun --version` says `slurm 22.05.8`."""
    try:
        out = subprocess.run([srun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.search(r"(\d+)\.(\d+)", out.stdout)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (20, 11)
