"""What user space's RDMA configuration says, under a root: the libibverbs providers rdma-core
installs (/etc/libibverbs.d/NAME.driver, each "driver NAME"; rdma-core
buildlib/rdma_functions.cmake rdma_provider writes them, libibverbs/init.c read_config_file
reads them: lines "driver NAME", '#' comments and blank lines ignored).
"""

from __future__ import annotations

import os

from ibtool.sources.sysfs.rooted import RootedFiles
from ibtool.sources.sysfs.values import quoted

CONFIG_DIR = "etc/libibverbs.d"
MAX_FILES = 256  # rdma-core ships about 25 providers


def verbs_providers(files: RootedFiles) -> tuple[str, ...]:
    """The provider names the .driver files declare, sorted and once each; () without the
    directory (rdma-core not installed, or a tree that did not capture /etc)."""
    d = files.path(CONFIG_DIR)
    if not files.isdir(d):
        return ()
    names: set[str] = set()
    entries = sorted(e for e in files.listdir(d) if e.endswith(".driver"))
    for entry in entries[:MAX_FILES]:
        path = os.path.join(d, entry)
        text = files.read(path)
        if text is None:
            continue
        for line in text.splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if len(words) == 2 and words[0] == "driver" and words[1].isprintable():
                names.add(words[1])
            else:
                files.bad(path, f"malformed line {quoted(line)}")
    return tuple(sorted(names))
