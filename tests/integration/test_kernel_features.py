"""`ibtool -d system` on the live kernel: every feature asked (none unknown with a device), the
same answers as root (through the child's unprivileged socket) and without CAP_NET_ADMIN
(through its own socket), and each answer borne out by the command that needs the feature:
`res ctx`/`res srq`, `counters optional`, the settings `system` shows. Written to run on any
kernel from 5.10 on: nothing here names a release.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from ibtool.cli import main
from ibtool.errors import ExitCode

pytestmark = pytest.mark.integration


def ibtool(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def found() -> dict[str, dict]:
    code, out, err = ibtool("-j", "-d", "system")
    assert (code, err) == (0, ""), err
    return json.loads(out)["features"]


def test_every_feature_is_asked_with_a_device_there(found):
    assert {k: f["note"] for k, f in found.items() if f["supported"] is None} == {}


def test_without_cap_net_admin_the_answers_are_the_same(found):
    # One Python start: it costs about ten seconds in the emulated guest.
    code = (
        "import io, json; from ibtool.cli import main; out = io.StringIO(); "
        "main(['-j', '-d', 'system'], stdout=out, stderr=io.StringIO()); print(out.getvalue())"
    )
    proc = subprocess.run(
        ["setpriv", "--inh-caps=-all", "--bounding-set=-net_admin", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout)["features"]
    assert {k: f["supported"] for k, f in theirs.items()} == {
        k: f["supported"] for k, f in found.items()
    }


@pytest.mark.parametrize(("kind", "key"), [("ctx", "res-ctx-get"), ("srq", "res-srq-get")])
def test_res_lists_what_the_kernel_has_and_says_what_it_lacks(found, kind, key):
    code, out, err = ibtool("-j", "res", kind)
    if found[key]["supported"]:
        assert (code, err) == (0, "")
        assert isinstance(json.loads(out), list)
    else:
        assert (code, out) == (ExitCode.UNSUPPORTED, "")
        command = found[key]["netlink"]
        assert err.startswith(f"ibtool: error: this kernel has no {command} (")
        assert err.count("\n") == 1


def test_the_summary_counts_srq_where_the_kernel_lists_them(found):
    code, out, err = ibtool("-j", "res")
    assert code == 0
    counts = json.loads(out)
    assert counts, "no device in the summary"
    if found["res-srq-get"]["supported"]:
        assert err == "" and all(isinstance(c["srq"], int) for c in counts)
    else:
        assert all(c["srq"] is None for c in counts)
        assert "does not count srq" in err


def test_optional_counters_where_the_kernel_has_stat_get_status(found, testbed):
    code, out, err = ibtool("-j", "counters", "optional", f"{testbed['device']}/1")
    if found["stat-get-status"]["supported"]:
        assert code == 0, err
        assert json.loads(out) == []  # rxe has no optional counters
    else:
        assert (code, out) == (ExitCode.UNSUPPORTED, "")
        assert err.startswith("ibtool: error: this kernel has no RDMA_NLDEV_CMD_STAT_GET_STATUS")


def test_the_settings_shown_are_the_attributes_found(found):
    code, out, _ = ibtool("-j", "system")
    assert code == 0
    shown = json.loads(out)
    for setting, key in (
        ("privileged-qkey", "privileged-qkey-mode"),
        ("monitor", "monitor-mode"),
        ("copy-on-fork", "copy-on-fork"),
    ):
        assert (shown[setting] is not None) == found[key]["supported"], setting


def test_the_link_system_and_stat_commands_are_there(found):
    assert all(found[k]["supported"] for k in ("newlink", "dellink", "sys-set", "stat-get"))
