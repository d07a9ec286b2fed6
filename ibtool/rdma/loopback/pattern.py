"""The payloads the self-test and the native ping send: each iteration's differs from the
last, so stale data cannot pass a check."""

from __future__ import annotations

_BASE = bytes((i * 7 + 1) & 0xFF for i in range(256)) * 2


def pattern(seed: int, size: int) -> bytes:
    """A payload that differs from the previous iteration's, so stale data cannot pass."""
    start = (seed * 31) % 256
    block = _BASE[start : start + 256]
    return (block * (size // 256 + 1))[:size]


def pattern_wheel(size: int) -> bytes:
    """What every pattern(seed, size) is a slice of, from (seed * 31) % 256 on: a hot loop
    slices it instead of building each payload."""
    return _BASE[:256] * (size // 256 + 2)
