"""A plugin cannot take over: ibtool's own commands, checks and metrics keep their names against a
newcomer, the first of two plugins keeps a name against the second, and whatever a plugin raises
while loading or registering, SystemExit included, costs that plugin only; Ctrl-C still
interrupts."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import pytest

from ibtool import hookimpl
from ibtool.api import HealthResult, MetricFamily, Status
from ibtool.cli import main
from ibtool.errors import ExitCode
from ibtool.host import Host
from ibtool.plugin.hooks import collect_metrics, health_checks, metric_collectors
from ibtool.plugin.manager import build_plugins
from tests.fixtures import sysfs_trees


def run(argv, plugins=()):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, plugins=plugins, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def said(inv, text):
    inv.print(text)


def commands_plugin(name, *commands, **hooks):
    """A plugin module `name` adding each (command, aliases) of `commands`, which prints
    "<plugin> <command>", and the other hook implementations given by keyword."""
    plugin = types.ModuleType(name)

    @hookimpl
    def ibtool_register_commands(cli):
        for command, aliases in commands:
            cli.add(
                command,
                lambda inv, c=command: said(inv, f"{name} {c}"),
                help=f"{name}'s {command}",
                aliases=aliases,
            )

    if commands:
        plugin.ibtool_register_commands = ibtool_register_commands
    for hook, function in hooks.items():
        setattr(plugin, hook, hookimpl(function))
    return plugin


@pytest.fixture
def root(tmp_path) -> str:
    return str(sysfs_trees.build("mlx5_ib_hca", tmp_path / "root"))


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """write(files, directory='lib') puts modules (and dist-info directories) in a directory on
    sys.path; those modules are forgotten afterwards (ibtool's own, imported meanwhile, are
    not: their classes must stay the ones the other tests hold)."""

    def write(files: dict[str, str], directory: str = "lib") -> Path:
        where = tmp_path / directory
        for name, text in files.items():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            (where / name).write_text(text)
        monkeypatch.syspath_prepend(str(where))
        return where

    yield write
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def distribution(name: str, entry_points: dict[str, str]) -> dict[str, str]:
    """The dist-info files of an installed distribution `name` with these `ibtool` entry
    points."""
    info = f"{name.replace('-', '_')}-1.0.dist-info"
    lines = "".join(f"{ep} = {module}\n" for ep, module in entry_points.items())
    return {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/entry_points.txt": f"[ibtool]\n{lines}",
    }


COMMAND_MODULE = """
from ibtool import hookimpl

@hookimpl
def ibtool_register_commands(cli):
    cli.add("hello", lambda inv: inv.print({said!r}), help="say hello")
"""


# -- commands and aliases -------------------------------------------------------------------------


def test_a_plugin_command_named_as_a_builtin_leaves_the_builtin_and_is_named_once(root):
    _, builtin, _ = run(["--root", root, "port"])
    acme = commands_plugin("acme", ("port", ()), ("acme", ()))
    code, out, err = run(["--root", root, "port"], plugins=[acme])
    assert (code, out) == (0, builtin)
    assert err == (
        "ibtool: warning: plugin acme: command 'port' is ibtool's own (ibtool_plugins.ports): "
        "acme's is not registered\n"
    )
    assert run(["acme"], plugins=[acme]) == (0, "acme acme\n", err)


def test_a_plugin_alias_named_as_a_builtin_command_is_dropped_and_its_command_kept(root):
    _, builtin, _ = run(["--root", root, "dev"])
    acme = commands_plugin("acme", ("acme", ("dev", "ac")))
    code, out, err = run(["--root", root, "dev"], plugins=[acme])
    assert (code, out) == (0, builtin)
    assert err == (
        "ibtool: warning: plugin acme: command 'dev' is ibtool's own (ibtool_plugins.devices): "
        "acme's command 'acme' is registered without that alias\n"
    )
    assert run(["ac"], plugins=[acme]) == (0, "acme acme\n", err)


def test_a_plugin_cannot_take_the_core_plugins_command():
    code, out, err = run(["-j", "plugins"], plugins=[commands_plugin("acme", ("plugins", ()))])
    assert code == 0 and "acme" in {p["name"] for p in json.loads(out)}
    assert err == (
        "ibtool: warning: plugin acme: command 'plugins' is ibtool's own (core): "
        "acme's is not registered\n"
    )


def test_a_plugin_alias_named_as_the_core_command_is_given_up_and_its_command_kept():
    acme = commands_plugin("acme", ("acme", ("plugins", "ac")))
    code, out, err = run(["-j", "plugins"], plugins=[acme])
    assert code == 0 and "acme" in {p["name"] for p in json.loads(out)}
    assert err == (
        "ibtool: warning: plugin acme: command 'plugins' is ibtool's own (core): "
        "acme's command 'acme' is registered without that alias\n"
    )
    assert run(["ac"], plugins=[acme]) == (0, "acme acme\n", err)


def test_a_plugin_called_first_by_pluggy_still_cannot_take_a_builtin_command(root):
    _, builtin, _ = run(["--root", root, "port"])
    eager = types.ModuleType("eager")

    @hookimpl(tryfirst=True)
    def ibtool_register_commands(cli):
        cli.add("port", lambda inv: said(inv, "eager port"), help="mine")

    eager.ibtool_register_commands = ibtool_register_commands
    code, out, err = run(["--root", root, "port"], plugins=[eager])
    assert (code, out) == (0, builtin)
    assert "plugin eager: command 'port' is ibtool's own" in err and err.count("\n") == 1


def test_of_two_plugins_the_first_loaded_keeps_a_command_and_the_second_is_named():
    alpha = commands_plugin("alpha", ("hello", ()))
    beta = commands_plugin("beta", ("hello", ("hi",)), ("beta", ()))
    assert run(["hello"], plugins=[alpha, beta]) == (
        0,
        "alpha hello\n",
        "ibtool: warning: plugin beta: command 'hello' is plugin alpha's, loaded first: "
        "beta's is not registered\n",
    )
    assert run(["beta"], plugins=[alpha, beta])[:2] == (0, "beta beta\n")
    assert run(["hello"], plugins=[beta, alpha])[1] == "beta hello\n"


@pytest.mark.parametrize("zeta_first", [True, False])
def test_entry_point_plugins_load_in_name_order_whatever_sys_path_says(on_path, zeta_first):
    alpha = {
        **distribution("alpha-ibtool", {"alpha": "alpha_mod"}),
        "alpha_mod.py": COMMAND_MODULE.format(said="alpha hello"),
    }
    zeta = {
        **distribution("zeta-ibtool", {"zeta": "zeta_mod"}),
        "zeta_mod.py": COMMAND_MODULE.format(said="zeta hello"),
    }
    # The directory written last is first on sys.path.
    for files, directory in [(alpha, "a"), (zeta, "z")][:: 1 if zeta_first else -1]:
        on_path(files, directory)
    code, out, err = run(["hello"])
    assert (code, out) == (0, "alpha hello\n")
    assert err == (
        "ibtool: warning: plugin zeta: command 'hello' is plugin alpha's, loaded first: "
        "zeta's is not registered\n"
    )


def test_a_plugin_that_repeats_its_own_command_registers_none():
    twice = commands_plugin("twice", ("one", ()), ("one", ()))
    code, _, err = run(["one"], plugins=[twice])
    assert code == ExitCode.USAGE and "invalid choice" in err
    assert err.startswith(
        "ibtool: warning: plugin twice failed to register commands: "
        "ValueError: command 'one' already registered by plugin twice\n"
    )


def _clashing_option(parser):
    parser.add_argument("--json")  # a global option of every command's


def _exiting_options(parser):
    parser.error("no options today")


@pytest.mark.parametrize(
    ("configure", "fault"),
    [
        (_clashing_option, "ArgumentError: argument --json: conflicting option string: --json"),
        (_exiting_options, "SystemExit: 2"),
    ],
)
def test_a_plugin_command_whose_options_fail_is_one_warning_and_the_rest_works(
    root, configure, fault
):
    _, builtin, _ = run(["--root", root, "port"])
    acme = types.ModuleType("acme")

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("broken", print, help="broken", configure=configure)
        cli.add("acme", lambda inv: said(inv, "acme acme"), help="acme")

    acme.ibtool_register_commands = ibtool_register_commands
    warning = (
        f"ibtool: warning: plugin acme: command 'broken' not registered: its options: {fault}\n"
    )
    assert run(["--root", root, "port"], plugins=[acme]) == (0, builtin, warning)
    assert run(["acme"], plugins=[acme]) == (0, "acme acme\n", warning)


# -- health checks and metrics --------------------------------------------------------------------


def _collected(*extra):
    warnings: list[str] = []
    plugins = build_plugins(extra=extra, warn=warnings.append)
    checks = health_checks(plugins, warnings.append)
    collectors = metric_collectors(plugins, warnings.append)
    return checks, collectors, warnings


def _no_results(ctx):
    return []


def test_a_plugin_check_named_as_a_builtin_leaves_the_builtin_and_keeps_its_others():
    def checks(register):
        register("port", _no_results)
        register("acme_fan", _no_results)

    checks, _, warnings = _collected(commands_plugin("acme", ibtool_health_checks=checks))
    assert checks["port"].__module__ == "ibtool_plugins.ports"
    assert checks["acme_fan"] is _no_results
    assert warnings == [
        "plugin acme: health check 'port' is ibtool's own (ibtool_plugins.ports): "
        "acme's is not registered"
    ]


def test_a_plugin_collector_named_as_a_builtin_leaves_the_builtin():
    def metrics(register):
        register("counters", lambda host: [])

    _, collectors, warnings = _collected(commands_plugin("acme", ibtool_metrics=metrics))
    assert collectors["counters"].__module__ == "ibtool_plugins.counters"
    assert warnings == [
        "plugin acme: metric collector 'counters' is ibtool's own (ibtool_plugins.counters): "
        "acme's is not registered"
    ]


def test_of_two_plugins_the_first_loaded_keeps_a_check_and_the_second_keeps_its_others():
    first = commands_plugin("first", ibtool_health_checks=lambda register: register("x", print))

    def second_checks(register):
        register("x", _no_results)
        register("y", _no_results)

    second = commands_plugin("second", ibtool_health_checks=second_checks)
    checks, _, warnings = _collected(first, second)
    assert (checks["x"], checks["y"]) == (print, _no_results)
    assert warnings == [
        "plugin second: health check 'x' is plugin first's, loaded first: "
        "second's is not registered"
    ]


def test_a_plugin_metric_family_named_as_a_builtin_one_is_left_out(tmp_path):
    host = Host(root=str(sysfs_trees.build("broken_device", tmp_path)))

    def impostor(host):
        fake = MetricFamily("ibtool_port_state_id", "mine", "gauge")
        fake.add({"device": "mlx5_0", "port": "1"}, 4)
        return [fake, MetricFamily("acme_fans", "fans", "gauge")]

    # "aaa" sorts before every collector of ibtool's own.
    acme = commands_plugin("acme", ibtool_metrics=lambda register: register("aaa", impostor))
    _, collectors, warnings = _collected(acme)
    families = collect_metrics(collectors, host, warnings.append)
    by_name = {f.exposed_name: f for f in families}
    assert by_name["ibtool_port_state_id"].documentation.startswith("Port state")
    assert "acme_fans" in by_name
    assert warnings == [
        "plugin acme: metric family 'ibtool_port_state_id' is ibtool's own "
        "(ibtool_plugins.ports): acme's is left out"
    ]


def test_a_hook_that_exits_at_registration_costs_its_plugin_only(root):
    def exits(register):
        register("early", _no_results)
        sys.exit(5)

    checks, _, warnings = _collected(commands_plugin("quitter", ibtool_health_checks=exits))
    assert "early" not in checks and "port" in checks
    assert warnings == ["plugin quitter failed to register health checks: SystemExit: 5"]

    quitter = types.ModuleType("quitter")

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("early", print, help="early")
        sys.exit(5)

    quitter.ibtool_register_commands = ibtool_register_commands
    _, builtin, _ = run(["--root", root, "port"])
    assert run(["--root", root, "port"], plugins=[quitter]) == (
        0,
        builtin,
        "ibtool: warning: plugin quitter failed to register commands: SystemExit: 5\n",
    )
    code, _, err = run(["early"], plugins=[quitter])
    assert code == ExitCode.USAGE and "invalid choice: 'early'" in err


def test_a_check_or_collector_that_exits_is_its_own_failure(tmp_path):
    host = Host(root=str(sysfs_trees.build("broken_device", tmp_path)))
    from ibtool.api import CheckContext
    from ibtool.plugin.hooks import run_health_checks

    def exits(_):
        sys.exit(5)

    results = run_health_checks({"quits": exits}, lambda name: CheckContext(host, config=None))
    assert results == [HealthResult(Status.UNKNOWN, "", "SystemExit: 5", check="quits")]
    warnings: list[str] = []
    assert collect_metrics({"quits": exits}, host, warnings.append) == []
    assert warnings == ["metric collector quits failed: SystemExit: 5"]


# -- loading ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "warning"),
    [
        ("import sys\nsys.exit(5)\n", "SystemExit: 5"),
        ("raise SystemExit\n", "SystemExit"),
        ("class Odd(BaseException):\n    pass\nraise Odd('odd\\nthing')\n", "Odd: odd thing"),
        ("raise GeneratorExit\n", "GeneratorExit"),
    ],
)
def test_whatever_a_plugin_raises_at_import_is_one_warning_and_the_rest_works(
    on_path, monkeypatch, root, body, warning
):
    _, builtin, _ = run(["--root", root, "port"])
    on_path(
        {
            **distribution("quitter-ibtool", {"quitter_ep": "quitter_ep_mod"}),
            "quitter_ep_mod.py": body,
            "quitter_env_mod.py": body,
        }
    )
    assert run(["--root", root, "port"]) == (
        0,
        builtin,
        f"ibtool: warning: plugin quitter_ep not loaded: {warning}\n",
    )
    monkeypatch.setenv("IBTOOL_PLUGINS", "quitter_env_mod")
    monkeypatch.setenv("IBTOOL_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert run(["--root", root, "port"]) == (
        0,
        builtin,
        f"ibtool: warning: plugin quitter_env_mod not loaded: {warning}\n",
    )


def test_ctrl_c_while_a_plugin_imports_still_interrupts(on_path, monkeypatch):
    on_path({"slow_mod.py": "raise KeyboardInterrupt\n"})
    monkeypatch.setenv("IBTOOL_PLUGINS", "slow_mod")
    assert run(["plugins"]) == (ExitCode.INTERRUPTED, "", "ibtool: interrupted\n")


def test_ctrl_c_while_a_plugin_registers_still_interrupts():
    def interrupted(cli):
        raise KeyboardInterrupt

    plugin = commands_plugin("slow", ibtool_register_commands=interrupted)
    assert run(["plugins"], plugins=[plugin]) == (ExitCode.INTERRUPTED, "", "ibtool: interrupted\n")


def test_naming_a_builtin_module_in_ibtool_plugins_changes_nothing(monkeypatch, root):
    _, builtin, _ = run(["--root", root, "port"])
    _, listed, _ = run(["plugins"])
    monkeypatch.setenv("IBTOOL_PLUGINS", "ibtool_plugins.ports")
    assert run(["--root", root, "port"]) == (0, builtin, "")
    assert run(["plugins"]) == (0, listed, "")


def test_a_blocked_builtin_stays_blocked_when_ibtool_plugins_names_its_module(monkeypatch):
    monkeypatch.setenv("IBTOOL_PLUGINS", "ibtool_plugins.loopback")
    code, _, err = run(["-p", "no:loopback", "loopback"])
    assert code == ExitCode.USAGE and "invalid choice: 'loopback'" in err


def test_a_module_named_twice_or_under_a_taken_name_is_loaded_once(on_path, monkeypatch):
    on_path({"ports.py": COMMAND_MODULE.format(said="impostor")})
    monkeypatch.setenv("IBTOOL_PLUGINS", "json,json,ports")
    code, out, err = run(["-j", "plugins"])
    assert code == 0 and [p["name"] for p in json.loads(out)].count("json") == 1
    assert err == (
        "ibtool: warning: plugin ports not loaded: a plugin of that name is loaded already "
        "(ibtool_plugins.ports)\n"
    )
