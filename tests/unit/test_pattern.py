"""The payloads of loopback and ping: each iteration's differs from the last, and the ping's hot
loop slices them off a wheel that must give the very bytes pattern() builds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ibtool.rdma.loopback.pattern import pattern, pattern_wheel


@given(seed=st.integers(0, 1 << 32), size=st.integers(1, 5000))
def test_a_slice_of_the_wheel_is_the_pattern(seed, size):
    wheel, start = pattern_wheel(size), seed * 31 % 256
    assert wheel[start : start + size] == pattern(seed, size)


def test_the_wheel_covers_the_largest_ping():
    size = 1 << 20
    assert len(pattern_wheel(size)) >= 255 + size


@given(seed=st.integers(0, 1 << 32), size=st.integers(1, 600))
def test_consecutive_payloads_differ(seed, size):
    assert pattern(seed, size) != pattern(seed + 1, size)
