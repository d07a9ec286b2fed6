"""The data-path options declared once (ibtool.api.datapath): every command that drives the
data path takes them within the declared limits, the path they ask for is one function's, and
taking them costs no verbs module at start-up."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from ibtool_plugins import doctor, loopback, mesh
from ibtool_plugins.ping import options as ping

from ibtool.api.datapath import (
    DATAPATH_OPTIONS,
    MTU_CODES,
    PathSpec,
    add_datapath_option,
    path_spec,
)

COMMANDS = {"loopback": loopback, "ping": ping, "mesh": mesh, "doctor": doctor}


def _actions(command: str) -> dict:
    parser = argparse.ArgumentParser()
    COMMANDS[command].configure(parser)
    return {a.dest: a for a in parser._actions}


TAKEN = [
    (command, name, dest)
    for command in COMMANDS
    for name, dest in [(n, n) for n in DATAPATH_OPTIONS] + [("count", "iters")]
    if dest in _actions(command)
]


def _accepts(parse, text: str) -> bool:
    try:
        parse(text)
    except argparse.ArgumentTypeError:
        return False
    return True


def test_the_four_commands_take_the_shared_options():
    took = {(c, n) for c, n, _ in TAKEN}
    for name in ("size", "count", "timeout", "gid_index"):
        assert {(c, name) for c in COMMANDS} <= took
    assert {("loopback", "sl"), ("ping", "sl"), ("mesh", "sl")} <= took
    assert {("ping", "tclass"), ("mesh", "tclass"), ("doctor", "tclass")} <= took
    assert {("ping", "qp_timeout"), ("mesh", "qp_timeout"), ("ping", "mode")} <= took


@pytest.mark.parametrize(("command", "name", "dest"), TAKEN)
def test_no_command_takes_more_than_the_data_path_allows(command, name, dest):
    declared = DATAPATH_OPTIONS[name]
    action = _actions(command)[dest]
    if declared.kind is None:
        assert tuple(action.choices) == declared.choices
        return
    kind = declared.kind
    assert not _accepts(action.type, repr(kind(declared.high) + 1))
    below = declared.low if declared.low_open else declared.low - 1
    assert not _accepts(action.type, repr(kind(below)))
    if declared.choices is not None:
        assert tuple(action.choices) == declared.choices


def test_a_command_narrows_a_range_and_keeps_its_words():
    parser = argparse.ArgumentParser()
    add_datapath_option(parser, "count", flags=("--iters",), high=10, metavar=None, help="h")
    add_datapath_option(parser, "tclass", default=0, help="t")
    assert parser.parse_args(["--iters", "10"]).iters == 10
    assert parser.parse_args([]).tclass == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["--iters", "11"])
    help_text = parser.format_help()
    assert "--iters ITERS" in help_text and "--tclass N" in help_text
    assert "must be 0 to 255, not 256 (hint: for DSCP D give --tclass $((D << 2)))" in str(
        pytest.raises(argparse.ArgumentTypeError, parser._actions[-1].type, "256").value
    )


def test_the_path_the_options_ask_for():
    ns = argparse.Namespace
    # ping's: every field; MTU bytes to the ibv_mtu code
    asked = ns(sl=3, tclass=104, mtu=1024, pkey_index=1, qp_timeout=18)
    assert path_spec(asked) == PathSpec(3, 104, MTU_CODES[1024], 1, 18)
    # loopback's: no --tclass, --mtu or --qp-timeout, an SL left out; the P_Key index the
    # port's table resolved
    assert path_spec(ns(sl=None, pkey_index=None), pkey_index=2) == PathSpec(pkey_index=2)
    assert path_spec(ns(sl=5, pkey_index=None)) == PathSpec(sl=5)


def test_taking_the_options_loads_no_verbs_module():
    """Every command's configure runs at each start: the options cost no verbs module, which
    load when a path is first made."""
    probe = (
        "import sys, json; import ibtool.api.datapath as d; "
        "import argparse; d.add_datapath_option(argparse.ArgumentParser(), 'mtu', help='m'); "
        "before = sorted(m for m in sys.modules if m.startswith(('ibtool.rdma.ladder', "
        "'ibtool.sources', 'pyverbs'))); "
        "from ibtool.rdma.ladder import PathSpec; "
        "print(json.dumps([before, d.PathSpec is PathSpec]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [[], True]
