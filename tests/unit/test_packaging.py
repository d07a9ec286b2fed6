"""How ibtool is installed: the wheel's and the Debian package's files, and what a release
whose Debian package is too old (textual) gets from `ibtool tui`."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

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
        tui.need_textual()
        return
    with pytest.raises(UnsupportedError) as e:
        tui.need_textual()
    assert e.value.exit_code == ExitCode.UNSUPPORTED
    assert f"needs textual 8 or later; this Python has textual {version}" in str(e.value)


def test_no_textual_is_left_to_the_import(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    tui.need_textual()  # the import of the app says "needs the textual package"


# -- the Debian package and the wheel's files stay in step with the project ------------------

CHECKOUT = Path(__file__).resolve().parents[2]


def control_fields() -> dict[str, str]:
    """debian/control's binary package stanza, fields joined (comments dropped)."""
    text = (CHECKOUT / "debian/control").read_text()
    stanza = text.split("\n\n")[1]
    fields: dict[str, str] = {}
    key = ""
    for line in stanza.splitlines():
        if line.startswith("#"):
            continue
        if line[:1] in (" ", "\t"):
            fields[key] += " " + line.strip()
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def relations(field: str) -> dict[str, str]:
    """{package: version constraint} of a Depends-like field."""
    found = {}
    for item in control_fields()[field].split(","):
        item = item.strip()
        if item and not item.startswith("$"):
            name, _, constraint = item.partition(" ")
            found[name] = constraint.strip("()")
    return found


def pyproject_dependencies() -> dict[str, str]:
    """{distribution: lower bound} of pyproject.toml's runtime dependencies (no markers)."""
    text = (CHECKOUT / "pyproject.toml").read_text()
    block = text.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    found = {}
    for m in re.finditer(r'^\s*"([A-Za-z0-9_.-]+)>=([0-9.]+)"', block, re.M):
        found[m.group(1).lower().replace("_", "-")] = m.group(2)
    return found


# pyproject.toml's name -> Debian's package, and where the package puts it
DEBIAN_NAMES = {
    "pluggy": "python3-pluggy",
    "pyroute2": "python3-pyroute2",
    "prometheus-client": "python3-prometheus-client",
    "textual": "python3-textual",
}


def test_the_package_depends_on_what_pyproject_needs_at_its_versions():
    deps = pyproject_dependencies()
    assert set(deps) == set(DEBIAN_NAMES), "a new dependency: map it to its Debian package"
    depends, recommends = relations("Depends"), relations("Recommends")
    for name, floor in deps.items():
        debian = DEBIAN_NAMES[name]
        # textual is imported by `ibtool tui` only: recommended (debian/control says why)
        where = recommends if name == "textual" else depends
        assert where.get(debian) == f">= {floor}", (debian, where.get(debian), floor)
    assert {"python3-pyverbs", "rdma-core", "ibverbs-providers"} <= set(recommends)


def test_the_package_installs_every_unit_and_the_wheel_every_man_page():
    units = sorted(
        p.name for p in (CHECKOUT / "systemd").iterdir() if p.suffix in (".service", ".timer")
    )
    assert units == ["ibtool-exporter.service", "ibtool-health.service", "ibtool-health.timer"]
    installed = (CHECKOUT / "debian/ibtool.install").read_text().split()
    assert [Path(p).name for p in installed[::2]] == units
    assert set(installed[1::2]) == {"usr/lib/systemd/system"}
    rules = (CHECKOUT / "debian/rules").read_text()
    assert "systemd/ibtool-exporter.default $(D)/etc/default/ibtool-exporter" in rules
    setup = (CHECKOUT / "setup.py").read_text()
    assert '("share/man/man8", sorted(glob("man/*.8")))' in setup
    for shipped in ("completion/ibtool.bash", "completion/_ibtool"):
        assert (CHECKOUT / shipped).is_file() and f'glob("{shipped}")' in setup
        assert shipped.split("/")[1] in rules  # moved where Debian keeps completions


def test_the_changelog_is_a_version_setuptools_scm_could_give():
    top = (CHECKOUT / "debian/changelog").read_text().splitlines()[0]
    m = re.match(r"ibtool \(([0-9][0-9a-z.~+]*)\) unstable; urgency=medium$", top)
    assert m, top
    assert "-" not in m.group(1)  # a native package: no Debian revision
    assert (CHECKOUT / "debian/source/format").read_text().strip() == "3.0 (native)"
