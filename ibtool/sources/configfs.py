"""The RDMA CM's per-port RoCE defaults in configfs (drivers/infiniband/core/cma_configfs.c).

/sys/kernel/config/rdma_cm exists while rdma_cm is loaded (built with
CONFIG_INFINIBAND_ADDR_TRANS_CONFIGFS) and configfs is mounted; a device's directory under it
exists only after someone made it (mkdir /sys/kernel/config/rdma_cm/mlx5_0: that creates
kernel state, so it is never made here). Then ports/PORT/ holds:

    default_roce_mode   "%s\\n" of ib_cache_gid_type_str(): "IB/RoCE v1" or "RoCE v2"
    default_roce_tos    "%u\\n" (0-255)

Without the directory cma.c's defaults apply (cma_add_one): RoCE v2 where the port supports it,
ToS 0.
"""

from __future__ import annotations

from ibtool.model.system import ROCE_MODES, RoceDefaults
from ibtool.sources.sysfs.rooted import RootedFiles

CONFIGFS = "sys/kernel/config"
# A mount table is a few KiB; a container host's can be long.
MOUNTS_LIMIT = 1 << 20


def _parse_mode(text: str) -> str:
    if text not in ROCE_MODES:
        raise ValueError(text)
    return text


def _parse_tos(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) > 255:
        raise ValueError(text)
    return int(text)


def configfs_mounted(files: RootedFiles) -> bool | None:
    """Whether configfs is mounted at /sys/kernel/config, from /proc/self/mounts (fstab(5)
    fields: device, mount point, type, ...); None where the root has no mount table (a
    captured tree) and no rdma_cm directory tells."""
    path = files.path("proc/self/mounts")
    if not files.exists(path):
        return True if files.isdir(files.path(CONFIGFS, "rdma_cm")) else None
    saved = files.limit
    files.limit = MOUNTS_LIMIT
    try:
        text = files.read(path)
    finally:
        files.limit = saved
    if text is None:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "configfs" and fields[1] == "/" + CONFIGFS:
            return True
    return False


def roce_defaults(files: RootedFiles, device: str, port: int) -> RoceDefaults:
    """The RoCE mode and ToS rdma_cm gives new connections on device/port."""
    mounted = configfs_mounted(files)
    rdma_cm = files.isdir(files.path(CONFIGFS, "rdma_cm"))
    port_dir = files.path(CONFIGFS, "rdma_cm", device, "ports", str(port))
    if not files.isdir(files.path(CONFIGFS, "rdma_cm", device)):
        return RoceDefaults(None, None, configured=False, mounted=mounted, rdma_cm=rdma_cm)
    mode = files.parsed(f"{port_dir}/default_roce_mode", _parse_mode)
    tos = files.parsed(f"{port_dir}/default_roce_tos", _parse_tos)
    return RoceDefaults(mode, tos, configured=True, mounted=mounted, rdma_cm=rdma_cm)
