"""Every read-only command's output, frozen: byte for byte what was recorded.

tests/fixtures/frozen/<command>.json.gz hold the standard output, standard error and exit code
of each case (a command's text, -j and -d forms on every fixture tree, on the trees captured
from a real kernel and on the testbed's snapshot), recorded by tests/fixtures/frozen/record.py
before the restructuring of the modules. A case that differs fails with a unified diff of it.
Re-record only when an issue asks for a changed output, reviewing the diff (see record.py).

The cases run in-process through ibtool.cli.main, grouped per tree, in a process per core
(record.run_groups), once per session; each test compares one case. What the machine could
change (time zone, terminal width, third-party plugins, /etc/ibtool/health.toml, the clock in
`health -j`, ibtool's version, where the trees are built) is pinned or normalised by record.py
the same way when recording and here.
"""

from __future__ import annotations

import pytest

from tests.fixtures.frozen import record

RECORDED = record.load_all()
CASES = [
    pytest.param(command, case, id=case) for command, cases in RECORDED.items() for case in cases
]


@pytest.fixture(scope="session")
def outputs(request, tmp_path_factory) -> dict[str, dict]:
    """case id -> what the case prints now: each tree built once, each selected case run once
    (all of them, unless -k or a node id chose some)."""
    selected = {
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_output_is_what_was_recorded"
    }
    chosen = {
        command: {case: got for case, got in cases.items() if case in selected}
        for command, cases in RECORDED.items()
    }
    base = tmp_path_factory.mktemp("frozen")
    return {case: got for _, case, got in record.run_groups(record.tasks_of(chosen, base))}


def test_every_command_has_recorded_cases():
    assert {c: len(cases) for c, cases in RECORDED.items() if not cases} == {}


@pytest.mark.parametrize(("command", "case"), CASES)
def test_output_is_what_was_recorded(outputs, command, case):
    want, got = RECORDED[command][case], outputs[case]
    if got != want:
        pytest.fail(f"{case}: not what was recorded\n{record.diff(case, want, got)}", False)
