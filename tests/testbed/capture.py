"""Save the guest's RDMA sysfs tree and raw RDMA netlink replies as unit-test fixtures.

Runs inside the testbed (`tests/testbed/testbed capture`). The tree keeps sysfs's shape under
OUT/rxe/sys/... (class symlink to the device directory); files the kernel refuses to read
(gid_attrs of empty slots: EINVAL) become directories, so reading them fails too, and are
listed in OUT/rxe/UNREADABLE. Netlink
replies are the bytes recv() returned, all parts of a dump concatenated, one file each.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import sys

NETLINK_RDMA = 20
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
RDMA_NL_NLDEV = 5
CMD = {"GET": 1, "PORT_GET": 5, "SYS_GET": 6, "RES_GET": 9, "RES_QP_GET": 10, "STAT_GET": 17}
ATTR_DEV_INDEX, ATTR_PORT_INDEX = 1, 3
SKIP_DIRS = {"power"}


def copy_tree(out: str) -> None:
    root = os.path.join(out, "rxe")
    shutil.rmtree(root, ignore_errors=True)
    unreadable = []
    for name in sorted(os.listdir("/sys/class/infiniband")):
        link = os.path.join("/sys/class/infiniband", name)
        real = os.path.realpath(link)
        rel_real = os.path.relpath(real, "/")
        os.makedirs(os.path.join(root, "sys/class/infiniband"), exist_ok=True)
        os.symlink(
            os.path.relpath(os.path.join("/", rel_real), "/sys/class/infiniband"),
            os.path.join(root, "sys/class/infiniband", name),
        )
        for dirpath, dirnames, filenames in os.walk(real):
            dirnames[:] = [
                d
                for d in dirnames
                if d not in SKIP_DIRS and not os.path.islink(os.path.join(dirpath, d))
            ]
            target_dir = os.path.join(root, os.path.relpath(dirpath, "/"))
            os.makedirs(target_dir, exist_ok=True)
            for f in filenames:
                src = os.path.join(dirpath, f)
                if os.path.islink(src) or f == "uevent":
                    continue
                try:
                    with open(src, "rb") as fh:
                        data = fh.read()
                except OSError as e:
                    # Kept as a directory: open() fails on it, as the kernel's read did.
                    unreadable.append(f"{os.path.relpath(src, '/')}\t{e.strerror}")
                    os.makedirs(os.path.join(target_dir, f), exist_ok=True)
                    continue
                with open(os.path.join(target_dir, f), "wb") as fh:
                    fh.write(data)
    vlan = "/proc/net/vlan/config"
    if os.path.exists(vlan):
        os.makedirs(os.path.join(root, "proc/net/vlan"), exist_ok=True)
        shutil.copy(vlan, os.path.join(root, "proc/net/vlan/config"))
    with open(os.path.join(root, "UNREADABLE"), "w") as fh:
        fh.write("".join(line + "\n" for line in unreadable))


def nla(attr: int, value: int) -> bytes:
    return struct.pack("=HHI", 8, attr, value)


def request(cmd: str, flags: int, attrs: bytes = b"") -> bytes:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    sock.settimeout(5)
    with sock:
        msg_type = (RDMA_NL_NLDEV << 10) + CMD[cmd]
        sock.send(struct.pack("=IHHII", 16 + len(attrs), msg_type, flags, 1, 0) + attrs)
        chunks = []
        while True:
            data = sock.recv(65536)
            chunks.append(data)
            offset, done = 0, False
            while offset < len(data):
                length, mtype, mflags = struct.unpack_from("=IHH", data, offset)
                if mtype in (NLMSG_DONE, NLMSG_ERROR) or not mflags & 0x2:
                    done = True
                offset += (length + 3) & ~3
            if done:
                return b"".join(chunks)


def capture_netlink(out: str) -> None:
    nl = os.path.join(out, "netlink")
    os.makedirs(nl, exist_ok=True)
    dev = nla(ATTR_DEV_INDEX, 0)  # rxe0 is the only device: index 0 in the testbed
    captures = {
        "get_dump": ("GET", NLM_F_REQUEST | NLM_F_DUMP, b""),
        "get_rxe0": ("GET", NLM_F_REQUEST | NLM_F_ACK, dev),
        "port_get_dump_rxe0": ("PORT_GET", NLM_F_REQUEST | NLM_F_DUMP, dev),
        "port_get_rxe0_1": ("PORT_GET", NLM_F_REQUEST | NLM_F_ACK, dev + nla(ATTR_PORT_INDEX, 1)),
        "res_get_dump": ("RES_GET", NLM_F_REQUEST | NLM_F_DUMP, b""),
        "res_qp_get_dump_rxe0": ("RES_QP_GET", NLM_F_REQUEST | NLM_F_DUMP, dev),
        "stat_get_rxe0_1": ("STAT_GET", NLM_F_REQUEST | NLM_F_ACK, dev + nla(ATTR_PORT_INDEX, 1)),
        "sys_get": ("SYS_GET", NLM_F_REQUEST | NLM_F_ACK, b""),
    }
    readme = [
        "Raw RDMA netlink replies captured in the testbed (kernel "
        f"{os.uname().release}), rxe0 on veth0.",
        "",
    ]
    for name, (cmd, flags, attrs) in captures.items():
        with open(os.path.join(nl, f"{name}.bin"), "wb") as fh:
            fh.write(request(cmd, flags, attrs))
        readme.append(
            f"{name}.bin: RDMA_NLDEV_CMD_{cmd} flags {flags:#x} attrs {attrs.hex() or '-'}"
        )
    with open(os.path.join(nl, "README"), "w") as fh:
        fh.write("\n".join(readme) + "\n")


if __name__ == "__main__":
    target = sys.argv[1]
    copy_tree(target)
    capture_netlink(target)
    print(f"captured into {target}")
