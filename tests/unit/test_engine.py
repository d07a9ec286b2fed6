"""The one engine: where each poll's host comes from, what a poll reads, the checks' state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ibtool.health.run import select_checks
from ibtool.health.state import StateFile
from ibtool.host import Host
from ibtool.live.engine import Engine, Hosts, hosts_for
from ibtool.model.health import HealthResult, Status
from tests.fixtures import sysfs_trees

COUNTERS = "sys/class/infiniband/mlx5_0/ports/1/counters"


@pytest.fixture
def root(tmp_path):
    return sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")


class Counted:
    """A host factory that counts the hosts it made and closed."""

    def __init__(self, root):
        self.root, self.made, self.closed = root, [], []

    def __call__(self):
        host = Host(root=str(self.root))
        host.close = lambda: self.closed.append(host)
        self.made.append(host)
        return host


def test_the_running_host_is_built_anew_and_closed_at_every_poll(root):
    make = Counted(root)
    engine = Engine(Hosts(make, live=True))
    engine.poll()
    engine.poll()
    assert len(make.made) == 2 and make.closed == make.made


def test_a_capture_is_built_once_and_read_again(root):
    make = Counted(root)
    engine = Engine(Hosts(make, live=False))
    first, second = engine.poll(), engine.poll()
    assert len(make.made) == 1 and make.closed == []
    # a capture read again is the same moment: no rates, no change
    assert all(r.rate is None for r in second.rated) and second.events == ()
    assert first.ports == second.ports


def test_a_poll_rates_the_counters_against_the_one_before(root):
    now = [0.0]
    engine = Engine(Hosts(lambda: Host(root=str(root)), live=True), clock=lambda: now[0])
    engine.poll()
    (root / COUNTERS / "port_rcv_errors").write_text("7\n")
    now[0] = 2.0
    reading = engine.poll()
    (rated,) = [
        r for r in reading.rated if r.sample.port == 1 and r.sample.name == "port_rcv_errors"
    ]
    assert rated.rate == 3.5 and reading.interval == 2.0 and reading.number == 2


def test_the_checks_run_at_every_poll_and_keep_their_state_in_memory(root):
    seen = []

    def check(ctx):
        seen.append(ctx.previous)
        ctx.keep(len(seen))
        return [HealthResult(Status.OK, "", f"run {len(seen)}")]

    engine = Engine(Hosts(lambda: Host(root=str(root)), live=False), checks={"c": check})
    first, second = engine.poll(), engine.poll()
    assert seen == [None, 1]
    assert [r.summary for r in first.findings] == ["run 1"]
    assert second.checked and [r.summary for r in second.findings] == ["run 2"]


def test_checks_every_so_often_keep_the_last_run_in_between(root):
    runs = []
    now = [0.0]

    def check(ctx):
        runs.append(now[0])
        return []

    engine = Engine(
        Hosts(lambda: Host(root=str(root)), live=True),
        checks={"c": check},
        check_every=60.0,
        clock=lambda: now[0],
    )
    for t in (0.0, 1.0, 30.0, 61.0):
        now[0] = t
        engine.poll()
    assert runs == [0.0, 61.0]


def test_a_state_file_is_the_checks_memory_between_engines(root, tmp_path):
    def check(ctx):
        ctx.keep((ctx.previous or 0) + 1)
        return [HealthResult(Status.OK, "", f"run {ctx.previous}")]

    def once():
        state = StateFile(str(tmp_path / "health.json"))
        hosts = Hosts(lambda: Host(root=str(root)), live=False)
        engine = Engine(hosts, checks={"c": check}, state=state, ports=False, counters=False)
        return engine.poll()

    once()
    reading = once()
    assert [r.summary for r in reading.findings] == ["run 1"]
    assert reading.ports == () and reading.rated is None  # health reads what its checks read


def test_read_runs_on_the_same_host_after_the_rest(root):
    made = []

    def make():
        made.append(Host(root=str(root)))
        return made[-1]

    engine = Engine(Hosts(make, live=True))
    reading = engine.poll(read=lambda host, ports: (host, [p.port for p in ports]))
    assert reading.extra == (made[0], [1, 2])


def test_a_host_that_cannot_be_read_is_a_failed_reading(tmp_path):
    (tmp_path / "sys/class").mkdir(parents=True)
    (tmp_path / "sys/class/infiniband").write_text("not a directory")
    reading = Engine(Hosts(lambda: Host(root=str(tmp_path)), live=False)).poll()
    assert reading.failed and reading.error


def test_no_devices_is_said_not_failed(tmp_path):
    reading = Engine(Hosts(lambda: Host(root=str(tmp_path)), live=False)).poll()
    assert not reading.failed and reading.error and reading.ports == ()


def test_the_warnings_of_a_poll_are_its_notes_and_passed_on(root):
    passed = []
    engine = None
    engine = Engine(
        Hosts(lambda: Host(root=str(root), warn=engine.note), live=True), warn=passed.append
    )
    reading = engine.poll(read=lambda host, ports: host.warn("one"))
    assert reading.notes == ("one",) and passed == ["one"]
    assert engine.poll().notes == ()


def test_hosts_for_this_host_a_tree_or_the_invocations_capture(root):
    import argparse

    from ibtool.plugin.commands import Invocation

    warnings: list[str] = []
    built = []

    def factory(inv):  # the command's seam: what it gives is what every poll reads
        built.append((inv.root, inv.warn, inv.details))
        return Host(root=inv.root, warn=inv.warn)

    def invocation(root: str) -> Invocation:
        return Invocation(argparse.Namespace(), root=root, details=True, host_factory=factory)

    live = hosts_for(invocation("/"), warnings.append)
    assert live.live and live.source == "this host"
    assert live.open() is not live.open()  # the running host anew at each poll
    assert built == [("/", warnings.append, False)] * 2
    tree = hosts_for(invocation(str(root)), warnings.append)
    assert not tree.live and tree.open() is tree.open()
    assert tree.source == f"--root {root}"
    assert built[2:] == [(str(root), warnings.append, False)]
    mine = object()
    inv = SimpleNamespace(root=str(root), snapshot=None, host=mine)
    assert hosts_for(inv, warnings.append, own_capture=False).open() is mine


def test_select_checks_names_a_wrong_one():
    from ibtool.errors import UsageError
    from ibtool.health.config import HealthConfig

    checks = {"a": 1, "b": 2}
    assert select_checks(checks, ["a"], [], HealthConfig(), print) == {"a": 1}
    assert select_checks(checks, [], ["a"], HealthConfig(), print) == {"b": 2}
    with pytest.raises(UsageError, match="no health check named 'c'"):
        select_checks(checks, ["c"], [], HealthConfig(), print)


def test_the_dashboard_and_the_engine_reach_neither_the_data_path_nor_a_plugin():
    """The loopback screen is handed its runner (plugins/tui.py); the engine and its faces read
    the kernel through the Host only."""
    import ast
    from pathlib import Path

    ibtool = Path(__file__).resolve().parents[2] / "ibtool"
    wrong = []
    for folder, banned in (
        ("tui", ("ibtool.rdma", "ibtool.api", "ibtool_plugins", "plugins")),
        (
            "live",
            ("ibtool.rdma", "ibtool.api", "ibtool_plugins", "plugins", "ibtool.sources.sysfs"),
        ),
        ("health", ("ibtool.api", "ibtool_plugins", "plugins")),
    ):
        for path in sorted((ibtool / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                wrong += [
                    f"{path.name}:{node.lineno} {n}"
                    for n in names
                    if any(n == b or n.startswith(b + ".") for b in banned)
                ]
    assert wrong == []
