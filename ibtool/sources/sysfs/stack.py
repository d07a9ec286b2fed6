"""The kernel's RDMA stack as files show it: which modules are there, the uverbs ABI, each RDMA
device's uverbs char device and its /dev/infiniband node.

A module's function shows also when it is built into the kernel (a built-in module has no
/sys/module entry unless it has parameters): by its class or device
(drivers/infiniband/core/uverbs_main.c registers infiniband_verbs, ucma.c the misc device
rdma_cm, user_mad.c infiniband_mad).
"""

from __future__ import annotations

import os

from ibtool.sources.sysfs.fs import DISK

MODULE_SIGNS = {
    "ib_core": "sys/class/infiniband",
    "ib_uverbs": "sys/class/infiniband_verbs/abi_version",
    "rdma_ucm": "sys/class/misc/rdma_cm",
    "ib_umad": "sys/class/infiniband_mad/abi_version",
}
# What a capture that holds module state has: a --root tree or a snapshot without them says
# nothing about modules, which is not the same as none loaded.
CAPTURED = ("sys/module", "sys/class/infiniband_verbs")


def module_sign(module: str) -> str:
    """The file whose presence shows `module`'s function, relative to the root."""
    return MODULE_SIGNS.get(module, f"sys/module/{module}")


class StackFiles:
    """The RDMA stack's files under `root` (/ for the running kernel, or a tree), read from
    `fs` (the disk, or a snapshot's tree in memory)."""

    def __init__(self, root: str, fs=DISK) -> None:
        self.root = root
        self.fs = fs

    def _text(self, path: str) -> str:
        # One page at most (a sysfs attribute), never waiting on a FIFO planted in a tree.
        return self.fs.read(path, 8192).decode("utf-8", "replace").strip()

    def captured(self) -> bool:
        return any(self.fs.isdir(os.path.join(self.root, d)) for d in CAPTURED)

    def module_loaded(self, module: str) -> bool:
        return self.fs.exists(os.path.join(self.root, module_sign(module)))

    def uverbs_abi(self) -> str | None:
        """The uverbs ABI version (infiniband_verbs/abi_version); None without ib_uverbs."""
        try:
            return self._text(os.path.join(self.root, MODULE_SIGNS["ib_uverbs"]))
        except OSError:
            return None

    def uverbs_devices(self) -> dict[str, str]:
        """RDMA device -> its uverbs char device (infiniband_verbs/uverbsN/ibdev)."""
        base = os.path.join(self.root, "sys/class/infiniband_verbs")
        found = {}
        for entry in sorted(self.fs.listdir(base)) if self.fs.isdir(base) else ():
            try:
                found[self._text(os.path.join(base, entry, "ibdev"))] = entry
            except OSError:
                continue
        return found
