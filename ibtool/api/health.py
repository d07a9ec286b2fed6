"""`ibtool health`: the run's report (failed, as_json, nagios, unknown, status_families), the
config (load_config) and the checks it selects, the state file kept between runs (StateFile,
boot_id, state_path), the Slurm drain (apply_slurm) and the textfile collector's files."""

from __future__ import annotations

from ibtool.health.config import load_config
from ibtool.health.run import as_json, failed, nagios, select_checks, status_families, unknown
from ibtool.health.slurm import apply as apply_slurm
from ibtool.health.state import StateFile, boot_id
from ibtool.health.state import default_path as state_path
from ibtool.health.textfile import check_path, collected, write_text, write_textfile

__all__ = [
    "StateFile",
    "apply_slurm",
    "as_json",
    "boot_id",
    "check_path",
    "collected",
    "failed",
    "load_config",
    "nagios",
    "select_checks",
    "state_path",
    "status_families",
    "unknown",
    "write_text",
    "write_textfile",
]
