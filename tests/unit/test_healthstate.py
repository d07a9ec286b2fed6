"""The health state file: where it lives, what a broken one becomes, the lock and the atomic
replace."""

from __future__ import annotations

import json
import os
import threading

import pytest

from ibtool.errors import PermissionDeniedError
from ibtool.health import state as healthstate
from ibtool.health.state import StateFile, StateLocked


def test_root_keeps_it_in_var_lib_and_others_in_their_state_home(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert healthstate.default_path({}) == "/var/lib/ibtool/health.json"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert healthstate.default_path({"XDG_STATE_HOME": "/home/u/.st"}) == (
        "/home/u/.st/ibtool/health.json"
    )
    assert healthstate.default_path({}).endswith("/.local/state/ibtool/health.json")


def test_what_is_saved_is_loaded_per_check(tmp_path):
    state = StateFile(str(tmp_path / "d" / "health.json"))
    with state.locked(1):
        state.save({"port": {"data": {"ports": {}}, "boot_id": "b", "time": 5.0}})
    saved = state.load()
    assert saved.problem is None
    assert saved.of("port") == ({"ports": {}}, "b", 5.0)
    assert saved.of("counters") == (None, None, None)
    assert json.loads((tmp_path / "d" / "health.json").read_text())["version"] == 1
    assert sorted(os.listdir(tmp_path / "d")) == ["health.json", "health.json.lock"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "is not JSON"),
        ('{"format": "other"}', "is not an ibtool health state"),
        ('{"format": "ibtool-health-state", "version": 9, "checks": {}}', "another format version"),
    ],
)
def test_a_file_that_is_not_our_state_is_a_fresh_start_with_the_reason(tmp_path, text, problem):
    path = tmp_path / "health.json"
    path.write_text(text)
    saved = StateFile(str(path)).load()
    assert saved.checks == {} and problem in saved.problem


def test_the_lock_makes_a_second_run_wait_then_give_up(tmp_path):
    path = str(tmp_path / "health.json")
    held, release = threading.Event(), threading.Event()

    def first():
        with StateFile(path).locked(1):
            held.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    held.wait(10)
    try:
        with pytest.raises(StateLocked, match="locked by another ibtool health run"):
            with StateFile(path).locked(0.1):
                pass
    finally:
        release.set()
        t.join()
    with StateFile(path).locked(0.1):  # free again
        pass


def test_a_save_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "health.json"
    state = StateFile(str(path))
    state.save({"a": {"data": 1}})
    before = path.read_bytes()

    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(Exception, match="No space left on device"):
        state.save({"a": {"data": 2}})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["health.json"]


def test_an_unwritable_directory_is_a_permission_error(tmp_path, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")  # what a non-root user gets in /var/lib

    monkeypatch.setattr(healthstate.tempfile, "mkstemp", denied)
    with pytest.raises(PermissionDeniedError, match="Permission denied") as e:
        StateFile(str(tmp_path / "health.json")).save({})
    assert e.value.hint == "give another with --state FILE, or --no-state"
