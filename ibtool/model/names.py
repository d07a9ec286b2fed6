"""How names of devices and netdevs sort: as a person counts, not as strings compare."""

from __future__ import annotations

import re


def natural_key(name: str) -> list:
    """mlx5_2 sorts before mlx5_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
