"""The packages, found rather than listed: setuptools' `packages.find` cannot rename a folder,
and the first-party plugins in plugins/ install as the package `ibtool_plugins`."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["ibtool", "ibtool.*"])
    + ["ibtool_plugins" + p.removeprefix("plugins") for p in find_packages(include=["plugins*"])],
    package_dir={"ibtool_plugins": "plugins"},
)
