"""The small ones found while trying ibtool as an attacker would (issue 25): a FIFO in a --root
tree, an InfiniBand port with no subnet manager, a value that could not be read in an event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ibtool.model.events import Event
from ibtool.views.events import event_line

REPO = Path(__file__).resolve().parents[2]


def test_a_fifo_in_a_root_tree_is_a_warning_not_a_hang(mlx5_ib_hca):
    state = (mlx5_ib_hca.root / "sys/class/infiniband/mlx5_0/ports/1/state").resolve()
    state.unlink()
    os.mkfifo(state)  # no writer: open(O_RDONLY) would wait for one for ever
    r = subprocess.run(
        [sys.executable, "-m", "ibtool", "--root", str(mlx5_ib_hca.root), "port"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r
    assert r.stdout.startswith("mlx5_0/1: state unknown physical_state LINK_UP")
    assert "mlx5_0/ports/1/state: malformed value ''" in r.stderr


def test_an_infiniband_port_up_with_no_subnet_manager_shows_sm_lid_0(mlx5_ib_hca):
    port = (mlx5_ib_hca.root / "sys/class/infiniband/mlx5_0/ports/1").resolve()
    (port / "state").write_text("2: INIT\n")
    (port / "sm_lid").write_text("0x0\n")
    r = mlx5_ib_hca("-j", "port", "mlx5_0/1")
    assert (r.json[0]["state"], r.json[0]["sm_lid"], r.json[0]["sm_sl"]) == ("INIT", 0, None)
    assert " sm_lid 0 " in mlx5_ib_hca("port", "mlx5_0/1").out
    down = mlx5_ib_hca("-j", "port", "mlx5_0/2").json[0]  # DOWN: no SM to name
    assert (down["state"], down["sm_lid"]) == ("DOWN", None)


def test_a_value_that_could_not_be_read_is_unknown_in_an_event():
    e = Event("port_state", "mlx5_0", 1, changes=(("state", "ACTIVE", None),), time="t")
    assert event_line(e) == "t port_state mlx5_0/1 state unknown (was ACTIVE)"
    assert json.dumps(e.changes) == '[["state", "ACTIVE", null]]'
