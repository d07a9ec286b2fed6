"""`ibtool --version`: ibtool's, Python's, pyverbs', rdma-core's and the kernel's versions, read
from files (pyverbs is never imported for it, nor its __version__.py executed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from ibtool import __version__
from ibtool.cli import main
from ibtool.sources import versions


@pytest.fixture
def libs(tmp_path, monkeypatch):
    d = tmp_path / "lib"
    d.mkdir()
    monkeypatch.setattr(versions, "library_dirs", lambda: [str(tmp_path / "absent"), str(d)])
    return d


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory first on sys.path holding the pyverbs a test makes."""
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
        monkeypatch.delitem(sys.modules, name)
    return d


def make_pyverbs(site, version_file: str | None):
    (site / "pyverbs").mkdir()
    (site / "pyverbs/__init__.py").write_text("raise RuntimeError('imported')\n")
    if version_file is not None:
        (site / "pyverbs/__version__.py").write_text(version_file)


@pytest.mark.parametrize(
    "names, expected",
    [
        (["libibverbs.so.1", "libibverbs.so.1.14.44.0"], "44.0"),  # bookworm
        (["libibverbs.so.1.11.33.2"], "33.2"),  # bullseye
        (["libibverbs.so.1.18.65.0"], "65.0"),  # sid
        (["libibverbs.so", "libibverbs.so.1"], None),  # no versioned file
        (["libibverbs.so.1.x.y.z"], None),
    ],
)
def test_rdma_core_from_the_library_name(libs, names, expected):
    for n in names:
        (libs / n).write_text("")
    found = versions.rdma_core()
    assert (found[0] if found else None) == expected


def test_pyverbs_version_read_not_executed(site):
    make_pyverbs(site, '__version__ = "65.0"\n')
    version, where = versions.pyverbs()
    assert (version, where) == ("65.0", str(site / "pyverbs"))
    assert "pyverbs" not in sys.modules


@pytest.mark.parametrize(
    "text",
    [
        None,  # rdma-core 33 and 44: no __version__.py
        "import os\nos._exit(3)\n__version__ = os.environ['HOME']\n",  # code, not a constant
        "__version__ = 65\n",
        '__version__ = "65\\x1b[2J"\n',  # a terminal escape
        "this is not python (",
        "\0\0\0",
    ],
    ids=["absent", "code", "int", "escape", "syntax", "nul"],
)
def test_pyverbs_without_a_usable_version_is_named_by_its_place(site, text):
    make_pyverbs(site, text)
    assert versions.pyverbs() == (None, str(site / "pyverbs"))


def test_no_pyverbs(site, monkeypatch):
    monkeypatch.setattr(versions, "find_spec", lambda name: None)
    assert versions.pyverbs() is None


def test_report_lines(site, libs, monkeypatch):
    make_pyverbs(site, '__version__ = "65.0"\n')
    (libs / "libibverbs.so.1.18.65.0").write_text("")
    lines = versions.report("1.2.3")
    assert lines == [
        "ibtool 1.2.3",
        f"Python {sys.version.split()[0]} ({sys.executable})",
        f"pyverbs 65.0 ({site / 'pyverbs'})",
        "rdma-core 65.0 (libibverbs.so.1.18.65.0)",
        f"kernel {os.uname().release}",
    ]


def test_report_says_what_is_missing(site, libs, monkeypatch):
    monkeypatch.setattr(versions, "find_spec", lambda name: None)
    lines = versions.report("1.2.3")
    assert lines[2].startswith("pyverbs not found: ") and "python3-pyverbs" in lines[2]
    assert lines[3].startswith("rdma-core not found: ")


@pytest.mark.parametrize("argv", [["-V"], ["--version"], ["--root", "/nonexistent", "-V"]])
def test_version_lines_from_the_command(argv):
    out, err = io.StringIO(), io.StringIO()
    assert main(argv, stdout=out, stderr=err) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == f"ibtool {__version__}"
    assert [line.split()[0] for line in lines] == [
        "ibtool",
        "Python",
        "pyverbs",
        "rdma-core",
        "kernel",
    ]
    assert err.getvalue() == ""


def test_the_version_is_the_builds_not_a_constant():
    # setuptools-scm writes ibtool/_version.py at install time (pyproject.toml); without it the
    # version says it is unknown rather than pretending to be a release.
    from ibtool import _version

    assert _version.__version__ == __version__ and __version__ != "0+unknown"
    try:
        described = subprocess.run(
            ["git", "describe", "--tags", "--abbrev=0"],
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        pytest.skip("no git here (a release root's copy of the checkout)")
    if described.returncode != 0:
        pytest.skip("no git tag in this checkout (a clone without tags, or a copy without .git)")
    tag = described.stdout.strip().lstrip("v")

    def release(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("+")[0].split(".dev")[0].split("."))

    # at the tag: the tag's version; past it: the next one's .devN
    assert __version__ == tag or (".dev" in __version__ and release(__version__) > release(tag))


@pytest.fixture
def venv(tmp_path, monkeypatch):
    """This Python seen as a venv at tmp_path/venv over a base Python at tmp_path/base, with
    the distribution's pyverbs at tmp_path/dist-packages, out of its sight."""
    prefix, base, dist = tmp_path / "venv", tmp_path / "base", tmp_path / "dist-packages"
    prefix.mkdir()
    (dist / "pyverbs").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(sys, "base_prefix", str(base))
    monkeypatch.setattr(versions, "DISTRIBUTION_SITES", (str(tmp_path / "absent"), str(dist)))
    monkeypatch.setattr(versions, "find_spec", lambda name: None)

    def cfg(system_site: bool) -> None:
        (prefix / "pyvenv.cfg").write_text(
            f"home = {base}/bin\ninclude-system-site-packages = {str(system_site).lower()}\n"
        )

    return cfg, base, dist


def test_a_venv_with_system_site_packages_over_another_python_says_so(venv):
    # the flag was given: the cause is the base Python, not the flag
    cfg, base, dist = venv
    cfg(True)
    (line,) = [x for x in versions.report("1") if x.startswith("pyverbs")]
    assert "(in a venv: --system-site-packages)" not in line
    assert f"this venv's base Python, {sys.version.split()[0]} in {base}, is not the " in line
    assert f"whose pyverbs is in {dist}: run ibtool with that python3" in line


def test_a_venv_without_system_site_packages_is_told_to_add_it(venv):
    cfg, _, _ = venv
    cfg(False)
    (line,) = [x for x in versions.report("1") if x.startswith("pyverbs")]
    assert "was made without --system-site-packages: make it again" in line


def test_the_data_path_s_error_gives_the_same_cause(venv):
    from ibtool.sources import verbs

    cfg, base, _ = venv
    cfg(True)
    missing = ModuleNotFoundError("No module named 'pyverbs'", name="pyverbs")
    hint = verbs.unavailable("pyverbs", missing, verbs.PYVERBS_HINT).hint
    assert hint.startswith(verbs.PYVERBS_INSTALL + "; this venv's base Python, ")
    assert f"in {base}, is not the distribution's python3" in hint
