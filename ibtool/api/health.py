"""`ibtool health`: the run's report (failed, as_json, nagios, unknown, status_families), the
config (load_config) and the checks it selects, the state file kept between runs (StateFile,
boot_id, state_path), a bounded read of a small file (read_bounded, NotAFile), the Slurm
drain (apply_slurm) and the textfile collector's files; an error counter's growth judged
against its thresholds (counter_growth)."""

from __future__ import annotations

from ibtool.health.config import load_config
from ibtool.health.files import NotAFile
from ibtool.health.files import read as read_bounded
from ibtool.health.run import as_json, failed, nagios, select_checks, status_families, unknown
from ibtool.health.slurm import apply as apply_slurm
from ibtool.health.state import StateFile, boot_id
from ibtool.health.state import default_path as state_path
from ibtool.health.textfile import check_path, collected, write_text, write_textfile
from ibtool.model.health import counter_growth

__all__ = [
    "NotAFile",
    "StateFile",
    "apply_slurm",
    "as_json",
    "boot_id",
    "check_path",
    "collected",
    "counter_growth",
    "failed",
    "load_config",
    "nagios",
    "read_bounded",
    "select_checks",
    "state_path",
    "status_families",
    "unknown",
    "write_text",
    "write_textfile",
]
