"""How ibtool is installed: the wheel's and the Debian package's files, and what a release
whose Debian package is too old (textual) gets from `ibtool tui`."""

from __future__ import annotations

from importlib import metadata

import pytest
from ibtool_plugins import tui

from ibtool.errors import ExitCode, UnsupportedError


@pytest.mark.parametrize(
    "version, ok",
    [
        ("8.2.8", True),  # Debian sid, the tested one
        ("8.0.0", True),
        ("10.1.0a1", True),
        ("2.1.2", False),  # Debian 13
        ("0.1.13", False),  # Debian 12
        ("7.99.0", False),
        ("garbage", False),
    ],
)
def test_the_dashboard_names_a_textual_too_old(monkeypatch, version, ok):
    monkeypatch.setattr(metadata, "version", lambda name: version)
    if ok:
        tui._need_textual()
        return
    with pytest.raises(UnsupportedError) as e:
        tui._need_textual()
    assert e.value.exit_code == ExitCode.UNSUPPORTED
    assert f"needs textual 8 or later; this Python has textual {version}" in str(e.value)


def test_no_textual_is_left_to_the_import(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    tui._need_textual()  # the import of the app says "needs the textual package"
