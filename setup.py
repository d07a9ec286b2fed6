"""The packages, found rather than listed: setuptools' `packages.find` cannot rename a folder,
and the first-party plugins in plugins/ install as the package `ibtool_plugins`.

data_files: the man pages and the shell completions, under the install's prefix (a venv's
share/ too): man-db's manpath finds <prefix>/share/man beside each <prefix>/bin on PATH, and
bash-completion looks in <dir>/../share/bash-completion/completions for each <dir> on PATH. The
Debian and RPM packages install their own copies of the same files (debian/, rpm/).
"""

from glob import glob

from setuptools import find_packages, setup

setup(
    data_files=[
        ("share/man/man8", sorted(glob("man/*.8"))),
        ("share/bash-completion/completions", sorted(glob("completion/ibtool.bash"))),
        ("share/zsh/site-functions", sorted(glob("completion/_ibtool"))),
    ],
    # ibtool/data holds no module (the NHC check file): a package only for its data
    packages=find_packages(include=["ibtool", "ibtool.*"])
    + ["ibtool.data"]
    + ["ibtool_plugins" + p.removeprefix("plugins") for p in find_packages(include=["plugins*"])],
    package_dir={"ibtool_plugins": "plugins"},
)
