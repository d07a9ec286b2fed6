"""The plugin framework as a plugin author and an operator see it."""

from __future__ import annotations

import io
import json
import types
from pathlib import Path

import pytest

from ibtool import hookimpl
from ibtool.cli import main, split_plugin_blocks
from ibtool.errors import ExitCode
from ibtool.plugin.manager import ESSENTIAL, build_plugins


def run(argv, plugins=(), monkeypatch=None):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, plugins=plugins, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def make_hello_plugin():
    plugin = types.ModuleType("hello_plugin")

    def configure(parser):
        parser.add_argument("--who", default="world")

    def hello(inv):
        if inv.json:
            inv.emit_json({"hello": inv.args.who})
        else:
            inv.print(f"hello {inv.args.who}")

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("hello", hello, help="say hello", configure=configure)

    plugin.ibtool_register_commands = ibtool_register_commands
    return plugin


def test_inline_plugin_adds_a_subcommand():
    code, out, err = run(["hello", "--who", "rdma"], plugins=[make_hello_plugin()])
    assert (code, out, err) == (0, "hello rdma\n", "")


def test_inline_plugin_subcommand_gets_global_options_after_the_object():
    code, out, _ = run(["hello", "-j"], plugins=[make_hello_plugin()])
    assert code == 0 and json.loads(out) == {"hello": "world"}


def test_plugins_command_lists_first_party_plugins_with_versions_and_hooks():
    code, out, _ = run(["-j", "plugins"], plugins=[make_hello_plugin()])
    assert code == 0
    listed = {p["name"]: p for p in json.loads(out)}
    assert ESSENTIAL <= set(listed)
    assert listed["gids"]["distribution"] == "ibtool"
    assert listed["gids"]["version"]
    assert listed["gids"]["hooks"] == ["ibtool_register_commands"]
    assert listed["hello_plugin"]["hooks"] == ["ibtool_register_commands"]


def test_broken_plugin_is_one_warning_and_the_rest_works():
    broken = types.ModuleType("broken_plugin")

    @hookimpl
    def ibtool_register_commands(cli):
        raise RuntimeError("boom")

    broken.ibtool_register_commands = ibtool_register_commands
    code, out, err = run(["hello"], plugins=[broken, make_hello_plugin()])
    assert code == 0 and out == "hello world\n"
    assert err.count("\n") == 1 and "broken_plugin" in err and "boom" in err


def test_plugin_with_a_misspelt_hook_is_rejected_with_a_warning():
    typo = types.ModuleType("typo_plugin")

    @hookimpl
    def ibtool_register_comands(cli):  # noqa: ARG001 - the typo is the point
        pass

    typo.ibtool_register_comands = ibtool_register_comands
    warnings = []
    plugins = build_plugins(extra=[typo], warn=warnings.append)
    assert not plugins.pm.has_plugin("typo_plugin")
    assert len(warnings) == 1 and "typo_plugin" in warnings[0]


def test_unimportable_env_plugin_is_a_warning():
    warnings = []
    plugins = build_plugins(warn=warnings.append, environ={"IBTOOL_PLUGINS": "no_such_module_x"})
    assert "no_such_module_x" in warnings[0]
    assert ESSENTIAL <= {i.name for i in plugins.describe()}


def test_env_plugins_are_loaded_by_module_name():
    plugins = build_plugins(environ={"IBTOOL_PLUGINS": "json"})
    assert plugins.pm.has_plugin("json")


def test_blocking_a_plugin_removes_its_command(monkeypatch):
    code, _, err = run(["-p", "no:hello_plugin", "hello"], plugins=[make_hello_plugin()])
    assert code == ExitCode.USAGE and "invalid choice" in err


def test_essential_plugins_cannot_be_blocked():
    code, out, err = run(["-p", "no:gids", "gids"])
    assert code == ExitCode.USAGE and out == ""
    assert err.startswith("ibtool: error: plugin 'gids' is essential")


def test_disable_autoload_keeps_first_party_plugins_only(monkeypatch):
    monkeypatch.setenv("IBTOOL_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = {i.name for i in build_plugins().describe()}
    assert ESSENTIAL <= names


@pytest.mark.parametrize(
    ("argv", "rest", "blocked"),
    [
        (["-p", "gids"], ["-p", "gids"], []),
        (["-p", "no:x", "gids"], ["gids"], ["x"]),
        (["-pno:x", "-pno:y", "dev", "-p"], ["dev", "-p"], ["x", "y"]),
        (["gids", "--", "-p", "no:x"], ["gids", "--", "-p", "no:x"], []),
    ],
)
def test_dash_p_is_pretty_unless_followed_by_no_colon(argv, rest, blocked):
    assert split_plugin_blocks(argv) == (rest, blocked)


def test_no_object_prints_usage_and_exits_usage():
    code, out, err = run([])
    assert code == ExitCode.USAGE and out == "" and "usage: ibtool" in err


def test_unknown_object_exits_usage():
    code, _, err = run(["frobnicate"])
    assert code == ExitCode.USAGE and "invalid choice" in err


def test_version():
    code, out, _ = run(["--version"])
    assert code == 0 and out.startswith("ibtool ")


def test_plugin_exception_is_one_line_not_a_traceback():
    plugin = types.ModuleType("crashy")

    def crash(inv):
        raise ZeroDivisionError("oops")

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("crash", crash, help="crash")

    plugin.ibtool_register_commands = ibtool_register_commands
    code, out, err = run(["crash"], plugins=[plugin])
    assert code == ExitCode.INTERNAL and "Traceback" not in err and err.count("\n") == 1
    code, _, err = run(["--debug", "crash"], plugins=[plugin])
    assert code == ExitCode.INTERNAL and "Traceback" in err


# -- ibtool's own plugins, by name ------------------------------------------------------------


LAUNCHER = """
import sys

class NotInstalled:
    # ibtool_plugins as a clone has it: not installed (where the suite runs on an installed
    # ibtool, in the release roots, the site-packages added below hold a copy)
    def find_spec(self, name, path=None, target=None):
        if name == "ibtool_plugins":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

if HIDE:
    sys.meta_path.insert(0, NotInstalled())
sys.path[:0] = PYTHONPATH
sys.path += LIBRARIES
code = sys.argv.pop(1)
exec(compile(code, "<test>", "exec"))
"""


def _python_without_ibtool_installed(code: str, pythonpath: str, cwd: str, hide: bool = True):
    """`python -c code` as in a clone nobody installed: the venv's libraries on sys.path, but
    not its .pth files (which hold an editable install of ibtool and ibtool_plugins), nor an
    installed ibtool_plugins."""
    import subprocess
    import sys
    import sysconfig

    libraries = [sysconfig.get_paths()["purelib"], "/usr/lib/python3/dist-packages"]
    launcher = Path(cwd) / "launcher.py"
    launcher.write_text(
        f"PYTHONPATH = {pythonpath.split(':')!r}\nLIBRARIES = {libraries!r}\nHIDE = {hide}\n"
        + LAUNCHER
    )
    return subprocess.run(
        [sys.executable, "-S", str(launcher), code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_a_clone_runs_with_pythonpath_alone(tmp_path):
    from tests.fixtures.sysfs_trees import mlx5_roce

    checkout = str(Path(__file__).resolve().parents[2])
    mlx5_roce(tmp_path / "root")
    root = str(tmp_path / "root")
    run_ibtool = (
        f"import runpy; sys.argv = ['ibtool', '--root', {root!r}, 'dev']; "
        "runpy.run_module('ibtool', run_name='__main__')"
    )
    done = _python_without_ibtool_installed(run_ibtool, checkout, str(tmp_path))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("mlx5_0: node_type ca protocol RoCE")
    check = "import ibtool.plugin.manager as m; print(m.builtin_package().__file__)"
    done = _python_without_ibtool_installed(check, checkout, str(tmp_path))
    assert done.stdout.split() == [f"{checkout}/plugins/__init__.py"]


def test_an_own_plugin_that_fails_to_load_is_an_error_that_says_how_to_reinstall(tmp_path):
    checkout = str(Path(__file__).resolve().parents[2])
    package = tmp_path / "ibtool_plugins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "completion.py").write_text("")  # loaded before counters, and loads
    (package / "counters.py").write_text("import a_module_that_is_not_there\n")
    run_ibtool = (
        "import runpy; sys.argv = ['ibtool', 'dev']; "
        "runpy.run_module('ibtool', run_name='__main__')"
    )
    pythonpath = f"{tmp_path}:{checkout}"  # this broken ibtool_plugins first
    done = _python_without_ibtool_installed(run_ibtool, pythonpath, str(tmp_path), hide=False)
    assert done.returncode == ExitCode.FAILED
    assert done.stdout == ""
    assert done.stderr == (
        "ibtool: error: ibtool's own plugin counters failed to load: ModuleNotFoundError: "
        "No module named 'a_module_that_is_not_there' (hint: reinstall ibtool "
        "(pip install ./ibtool, or the distribution's package); from a clone, run it as "
        "PYTHONPATH=<the clone> python3 -m ibtool)\n"
    )


def test_own_plugins_are_registered_by_name_not_by_entry_point():
    from ibtool.plugin.manager import BUILTIN

    plugins = build_plugins(environ={"IBTOOL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    names = [name for name, _ in plugins.pm.list_name_plugin()]
    assert names == list(BUILTIN)
    assert all(plugins.builtin(n) == f"ibtool_plugins.{n}" for n in names)
