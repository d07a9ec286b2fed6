"""Fixture trees of real hardware under tmp_path, and the CLI run in-process against them."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `pytest` (not `python -m pytest`) does not put the repo there
    sys.path.insert(0, str(REPO))

from ibtool.cli import main  # noqa: E402
from ibtool.plugin.manager import ENV_DISABLE_AUTOLOAD  # noqa: E402
from tests.fixtures import sysfs_trees  # noqa: E402
from tests.unit.fake_host import sysfs_from  # noqa: E402


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)

    @property
    def warnings(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("ibtool: warning: ")]


def run_cli(argv: list[str], **seams) -> Result:
    """ibtool run in-process on `argv`; `seams` as cli.main takes them (host_factory). Only
    ibtool's own plugins and those a test names are loaded, not the third-party ones this
    machine has installed (the tests of that loading call cli.main themselves): the scan of
    every installed distribution's metadata was also most of a command's time here."""
    seams.setdefault("environ", {**os.environ, ENV_DISABLE_AUTOLOAD: "1"})
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err, **seams)
    return Result(int(code), out.getvalue(), err.getvalue())


Ibtool = Callable[..., Result]


class OnHost:
    """ibtool on the running host (no --root) with the Host's seams a test gives in `seams`
    (netlink=, release=, comm=, ...: see ibtool.host.Host), through cli.main's host_factory:
    `on_host(*argv)`. What a test does not give is the running host's; a --root tree is read
    as ever (only sysfs)."""

    def __init__(self):
        self.seams: dict = {}

    def host(self, inv):
        from ibtool.host import Host
        from ibtool.plugin.commands import default_host

        if inv.root != "/":
            return default_host(inv)
        return Host(warn=inv.warn, details=inv.details, **self.seams)

    def __call__(self, *argv: str) -> Result:
        return run_cli(list(argv), host_factory=self.host)


@pytest.fixture
def on_host() -> OnHost:
    return OnHost()


@pytest.fixture
def cli() -> Ibtool:
    """ibtool with the arguments given, nothing added."""
    return lambda *argv: run_cli(list(argv))


def _ibtool_on(root: Path) -> Ibtool:
    def ibtool(*argv: str) -> Result:
        return run_cli(["--root", str(root), *argv])

    ibtool.root = root  # type: ignore[attr-defined]
    return ibtool


def _tree(name: str, root: Path) -> Ibtool:
    return _ibtool_on(sysfs_trees.build(name, root))


@pytest.fixture
def mlx5_ib_hca(tmp_path) -> Ibtool:
    return _tree("mlx5_ib_hca", tmp_path)


@pytest.fixture
def mlx5_roce(tmp_path) -> Ibtool:
    return _tree("mlx5_roce", tmp_path)


@pytest.fixture
def mlx5_roce_lag(tmp_path) -> Ibtool:
    return _tree("mlx5_roce_lag", tmp_path)


@pytest.fixture
def cxgb4_iwarp(tmp_path) -> Ibtool:
    return _tree("cxgb4_iwarp", tmp_path)


@pytest.fixture
def i40iw_iwarp(tmp_path) -> Ibtool:
    return _tree("i40iw_iwarp", tmp_path)


@pytest.fixture
def hfi1_opa(tmp_path) -> Ibtool:
    return _tree("hfi1_opa", tmp_path)


@pytest.fixture
def mlx4_ofed_ib(tmp_path) -> Ibtool:
    return _tree("mlx4_ofed_ib", tmp_path)


@pytest.fixture
def broken_device(tmp_path) -> Ibtool:
    return _tree("broken_device", tmp_path)


@pytest.fixture
def garbled_values(tmp_path) -> Ibtool:
    return _tree("garbled_values", tmp_path)


@pytest.fixture
def incomplete_capture(tmp_path) -> Ibtool:
    return _tree("incomplete_capture", tmp_path)


@pytest.fixture(scope="session")
def sriov_500_vfs(tmp_path_factory) -> Ibtool:
    return _tree("sriov_vfs", tmp_path_factory.mktemp("sriov_500_vfs"))


@pytest.fixture
def empty_root(tmp_path) -> Ibtool:
    """A root without sys/class/infiniband: a host whose RDMA drivers are not loaded."""
    return _ibtool_on(tmp_path)


@pytest.fixture
def captured_rxe() -> Ibtool:
    """rxe0 on veth0 as the testbed's kernel showed it (tests/testbed/guest.sh topology)."""
    return _ibtool_on(
        sysfs_trees.require_capture(
            sysfs_trees.CAPTURED_RXE / "sys" / "class" / "infiniband"
        ).parents[2]
    )


@pytest.fixture
def live_roce(tmp_path) -> Ibtool:
    """ibtool on the live host whose sysfs is the mlx5_roce tree (mlx5_0/1, RoCE v2 GID 3), for
    loopback and ping, which refuse --root; with fake_pyverbs for their verbs."""
    return on_live_host(sysfs_trees.build("mlx5_roce", tmp_path))


def on_live_host(root: Path) -> Ibtool:
    """ibtool on the live host (no --root) whose sysfs is the tree at `root`."""
    host = sysfs_from(root)
    return lambda *argv: run_cli(list(argv), host_factory=host)


@pytest.fixture
def fake_pyverbs(monkeypatch):
    """Install a fake pyverbs of one release's layout (tests/unit/pyverbs_fakes.py):
    `fabric = fake_pyverbs("rdma-core-65")`; the probe cache is cleared before and after."""
    from ibtool.sources import verbs
    from tests.unit import pyverbs_fakes

    def clear():
        verbs.pyverbs.cache_clear()
        verbs.rdmacm.cache_clear()

    clear()
    yield lambda layout, **options: pyverbs_fakes.install(monkeypatch, layout, **options)
    clear()


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """tests/fixtures/tls's certificates and keys copied next to the web config files a test
    writes, so that relative names work."""
    import shutil

    for f in (REPO / "tests" / "fixtures" / "tls").iterdir():
        if f.suffix in (".pem", ".key"):
            shutil.copy(f, tmp_path / f.name)
    return tmp_path
