"""Save the guest's RDMA sysfs tree and raw RDMA netlink replies as unit-test fixtures.

Runs inside the testbed with the system python, stdlib only (`tests/testbed/testbed capture`):
    /usr/bin/python3 tests/testbed/capture.py OUT

OUT/rxe/ is the tree of rxe0 alone (on veth0, with its VLAN veth0.100), OUT/rxe-pair/ the tree of
every device (rxe0 and rxe1 on veth1). Each keeps sysfs's shape: sys/class/infiniband/<dev> is a
relative symlink to sys/devices/virtual/infiniband/<dev>, whose regular files hold what read()
returned. Symlinks inside a device (e.g. `device`, `subsystem`) are not followed. Files the
kernel refuses to read (gid_attrs of empty GID slots: EINVAL) become empty directories, so
reading them fails too, and are listed with the error in UNREADABLE at the tree's top.
sys/class/net/<netdev> (same symlink shape) has the plain attributes of each netdev in the GID
tables (the rxe netdevs and the VLAN); proc/net/vlan/config is copied.

OUT/resources/ holds the resource dumps (QP, CM ID, CQ, MR, PD, CTX, SRQ) of every device while
tests/testbed/res_holder.py and an rping server keep user objects alive, with `rdma -j res show`
of the same moment as the oracle (`capture.py OUT --resources` captures only those).

OUT/netlink/<name>.bin are the bytes recv() returned for one NETLINK_RDMA request, all parts of a
dump concatenated (through NLMSG_DONE or the error/ack); OUT/netlink/README says which request
produced which file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time

NETLINK_RDMA = 20
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x2, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
RDMA_NL_NLDEV = 5
CMD = {"GET": 1, "PORT_GET": 5, "SYS_GET": 6, "RES_GET": 9, "RES_QP_GET": 10, "STAT_GET": 17}
# The per-object resource dumps and the `rdma res show` object each answers.
RES_CMD = {
    "qp": ("RES_QP_GET", 10),
    "cm_id": ("RES_CM_ID_GET", 11),
    "cq": ("RES_CQ_GET", 12),
    "mr": ("RES_MR_GET", 13),
    "pd": ("RES_PD_GET", 14),
    "ctx": ("RES_CTX_GET", 22),
    "srq": ("RES_SRQ_GET", 23),
}
CMD.update(RES_CMD.values())
ATTR_DEV_INDEX, ATTR_DEV_NAME, ATTR_PORT_INDEX = 1, 2, 3
SKIP_DIRS = {"power"}
NET_ATTRS = (
    "address addr_len broadcast carrier dev_id dev_port flags ifalias ifindex iflink "
    "link_mode mtu name_assign_type operstate speed duplex type"
).split()


def _copy_dir(real: str, root: str, unreadable: list[str]) -> None:
    for dirpath, dirnames, filenames in os.walk(real):
        dirnames[:] = [
            d
            for d in sorted(dirnames)
            if d not in SKIP_DIRS and not os.path.islink(os.path.join(dirpath, d))
        ]
        target_dir = os.path.join(root, os.path.relpath(dirpath, "/"))
        os.makedirs(target_dir, exist_ok=True)
        for f in sorted(filenames):
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


def _class_link(root: str, cls: str, name: str) -> str:
    """Mirror /sys/class/CLS/NAME -> ../../devices/...: returns the real device path."""
    link = os.path.join("/sys/class", cls, name)
    real = os.path.realpath(link)
    os.makedirs(os.path.join(root, "sys/class", cls), exist_ok=True)
    os.symlink(
        os.path.relpath(real, os.path.dirname(link)), os.path.join(root, "sys/class", cls, name)
    )
    return real


def netdevs_of(devices: list[str]) -> list[str]:
    """The netdevs named in these devices' GID tables (the rxe netdevs and their VLANs)."""
    names = set()
    for dev in devices:
        ports = f"/sys/class/infiniband/{dev}/ports"
        for port in os.listdir(ports):
            ndevs = f"{ports}/{port}/gid_attrs/ndevs"
            for idx in os.listdir(ndevs):
                try:
                    with open(f"{ndevs}/{idx}") as fh:
                        names.add(fh.read().strip())
                except OSError:
                    pass
    return sorted(n for n in names if n and os.path.exists(f"/sys/class/net/{n}"))


def copy_tree(out: str, name: str, devices: list[str]) -> None:
    """OUT/NAME/: the sysfs tree of these RDMA devices (and their netdevs)."""
    root = os.path.join(out, name)
    shutil.rmtree(root, ignore_errors=True)
    unreadable: list[str] = []
    for dev in devices:
        _copy_dir(_class_link(root, "infiniband", dev), root, unreadable)
    for netdev in netdevs_of(devices):
        real = _class_link(root, "net", netdev)
        target = os.path.join(root, os.path.relpath(real, "/"))
        os.makedirs(target, exist_ok=True)
        for attr in NET_ATTRS:
            try:
                with open(os.path.join(real, attr), "rb") as fh:
                    data = fh.read()
            except OSError as e:
                # speed/duplex fail with EINVAL on a down link; ifalias may be absent
                if not isinstance(e, FileNotFoundError):
                    unreadable.append(f"{os.path.relpath(real, '/')}/{attr}\t{e.strerror}")
                continue
            with open(os.path.join(target, attr), "wb") as fh:
                fh.write(data)
    vlan = "/proc/net/vlan/config"
    if os.path.exists(vlan):
        os.makedirs(os.path.join(root, "proc/net/vlan"), exist_ok=True)
        shutil.copy(vlan, os.path.join(root, "proc/net/vlan/config"))
    with open(os.path.join(root, "UNREADABLE"), "w") as fh:
        fh.write("".join(line + "\n" for line in sorted(unreadable)))


def nla_u32(attr: int, value: int) -> bytes:
    return struct.pack("=HHI", 8, attr, value)


def request(cmd: str, flags: int, attrs: bytes = b"", seq: int = 1) -> bytes:
    """Send one NLDEV request; the raw replies up to the end of the dump or the ack/error."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    sock.settimeout(5)
    with sock:
        msg_type = (RDMA_NL_NLDEV << 10) + CMD[cmd]
        sock.send(struct.pack("=IHHII", 16 + len(attrs), msg_type, flags, seq, 0) + attrs)
        chunks = []
        while True:
            data = sock.recv(1 << 20)
            chunks.append(data)
            offset, done = 0, False
            while offset + 16 <= len(data):
                length, mtype, mflags = struct.unpack_from("=IHH", data, offset)
                if mtype in (NLMSG_DONE, NLMSG_ERROR) or not mflags & NLM_F_MULTI:
                    done = True
                offset += max((length + 3) & ~3, 16)
            if done:
                return b"".join(chunks)


def message_types(reply: bytes) -> list[int]:
    types, offset = [], 0
    while offset + 16 <= len(reply):
        length, mtype = struct.unpack_from("=IH", reply, offset)
        types.append(mtype)
        offset += max((length + 3) & ~3, 16)
    return types


def devices(reply: bytes) -> dict[str, int]:
    """{name: index} from a RDMA_NLDEV_CMD_GET dump reply."""
    found: dict[str, int] = {}
    offset = 0
    while offset + 16 <= len(reply):
        length, mtype = struct.unpack_from("=IH", reply, offset)
        if mtype >> 10 == RDMA_NL_NLDEV:
            attrs, pos, end = {}, offset + 16, offset + length
            while pos + 4 <= end:
                alen, atype = struct.unpack_from("=HH", reply, pos)
                if alen < 4:
                    break
                attrs[atype & 0x3FFF] = reply[pos + 4 : pos + alen]
                pos += (alen + 3) & ~3
            if ATTR_DEV_INDEX in attrs and ATTR_DEV_NAME in attrs:
                name = attrs[ATTR_DEV_NAME].rstrip(b"\0").decode()
                found[name] = struct.unpack("=I", attrs[ATTR_DEV_INDEX][:4])[0]
        offset += max((length + 3) & ~3, 16)
    return found


def capture_netlink(out: str) -> None:
    nl = os.path.join(out, "netlink")
    shutil.rmtree(nl, ignore_errors=True)
    os.makedirs(nl)
    dump, ack = NLM_F_REQUEST | NLM_F_DUMP, NLM_F_REQUEST | NLM_F_ACK
    captures: dict[str, tuple[str, int, bytes]] = {
        "get_dump": ("GET", dump, b""),
        "sys_get": ("SYS_GET", ack, b""),
        "res_get_dump": ("RES_GET", dump, b""),
    }
    for name, index in devices(request("GET", dump)).items():
        dev = nla_u32(ATTR_DEV_INDEX, index)
        port1 = dev + nla_u32(ATTR_PORT_INDEX, 1)
        captures[f"get_{name}"] = ("GET", ack, dev)
        captures[f"port_get_dump_{name}"] = ("PORT_GET", dump, dev)
        captures[f"port_get_{name}_1"] = ("PORT_GET", ack, port1)
        captures[f"res_qp_get_dump_{name}"] = ("RES_QP_GET", dump, dev)
        captures[f"stat_get_{name}_1"] = ("STAT_GET", ack, port1)
    readme = [
        f"Raw RDMA netlink replies captured in the testbed (kernel {os.uname().release}) by",
        "tests/testbed/capture.py: one request each on a NETLINK_RDMA socket, the bytes of every",
        "recv() concatenated until NLMSG_DONE, NLMSG_ERROR or a reply without NLM_F_MULTI.",
        "Request type = (RDMA_NL_NLDEV 5 << 10) + RDMA_NLDEV_CMD_*; flags 0x301 = REQUEST|DUMP,",
        "0x5 = REQUEST|ACK; attrs are the request's netlink attributes in hex",
        "(08000100 + u32 = RDMA_NLDEV_ATTR_DEV_INDEX,",
        " 08000300 + u32 = RDMA_NLDEV_ATTR_PORT_INDEX).",
        "",
    ]
    for seq, (name, (cmd, flags, attrs)) in enumerate(sorted(captures.items()), start=1):
        reply = request(cmd, flags, attrs, seq)
        with open(os.path.join(nl, f"{name}.bin"), "wb") as fh:
            fh.write(reply)
        msg_type = (RDMA_NL_NLDEV << 10) + CMD[cmd]
        readme.append(
            f"{name}.bin: RDMA_NLDEV_CMD_{cmd} (type {msg_type}) flags {flags:#x} "
            f"attrs {attrs.hex() or '-'} -> {len(reply)} bytes, message types "
            + " ".join(str(t) for t in message_types(reply))
        )
    readme += [
        "",
        "Message type 3 is NLMSG_DONE. The kernel answers a PORT_GET doit with type 5121 (GET),",
        "not 5125. The acks the REQUEST|ACK requests asked for arrive in a later recv() and are",
        "not part of the files.",
    ]
    with open(os.path.join(nl, "README"), "w") as fh:
        fh.write("\n".join(readme) + "\n")


def _start_objects(repo: str) -> list[subprocess.Popen]:
    """Live objects of user processes: res_holder.py (QPs in RESET, INIT and RTS, an SRQ, a
    CQ, an MR, a PD, a context) on rxe0 and an rping server's listening CM ID."""
    holder = subprocess.Popen(
        [sys.executable, os.path.join(repo, "tests/testbed/res_holder.py"), "rxe0", "--rc", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    rping = subprocess.Popen(
        ["rping", "-s", "-a", "192.168.77.1", "-p", "7471"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ready = holder.stdout.readline()
    if not ready:
        raise SystemExit("res_holder.py did not start")
    for _ in range(100):  # rping listens once its CM ID is bound
        out = subprocess.run(
            ["rdma", "res", "show", "cm_id"], capture_output=True, text=True, check=False
        ).stdout
        if "LISTEN" in out:
            break
        time.sleep(0.1)
    return [holder, rping]


def capture_resources(out: str, repo: str) -> None:
    """OUT/resources/: each resource dump of each device while user objects are alive, and
    `rdma -j res show OBJECT` of the same moment (the objects are idle: nothing changes)."""
    target = os.path.join(out, "resources")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    processes = _start_objects(repo)
    try:
        dump = NLM_F_REQUEST | NLM_F_DUMP
        readme = [
            f"RDMA resource dumps captured in the testbed (kernel {os.uname().release}) by",
            "tests/testbed/capture.py while tests/testbed/res_holder.py held verbs objects on rxe0",
            "and an rping server listened (a CM ID). <cmd>_dump_<dev>.bin: the raw recv() bytes of",
            "one REQUEST|DUMP with DEV_INDEX; rdma_res_show_<object>.json: `rdma -j res show",
            "<object>` right after; comm.json: /proc/PID/comm of every pid in the dumps.",
            "",
        ]
        seq = 100
        for name, index in sorted(devices(request("GET", dump)).items()):
            for cmd, _ in RES_CMD.values():
                seq += 1
                reply = request(cmd, dump, nla_u32(ATTR_DEV_INDEX, index), seq)
                fname = f"{cmd.lower()}_dump_{name}.bin"
                with open(os.path.join(target, fname), "wb") as fh:
                    fh.write(reply)
                readme.append(
                    f"{fname}: RDMA_NLDEV_CMD_{cmd} dev {name} (index {index}) -> {len(reply)} "
                    "bytes, message types " + " ".join(str(t) for t in message_types(reply))
                )
        for obj in RES_CMD:
            shown = subprocess.run(
                ["rdma", "-j", "res", "show", obj], capture_output=True, text=True, check=True
            ).stdout
            with open(os.path.join(target, f"rdma_res_show_{obj}.json"), "w") as fh:
                fh.write(shown)
        comm = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) in {p.pid for p in processes}:
                with open(f"/proc/{pid}/comm") as fh:
                    comm[pid] = fh.read().strip()
        with open(os.path.join(target, "comm.json"), "w") as fh:
            json.dump(comm, fh, indent=2, sort_keys=True)
            fh.write("\n")
        with open(os.path.join(target, "README"), "w") as fh:
            fh.write("\n".join(readme) + "\n")
    finally:
        processes[0].stdin.close()
        processes[1].terminate()
        for p in processes:
            p.wait(timeout=30)


if __name__ == "__main__":
    target = sys.argv[1]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if sys.argv[2:] == ["--resources"]:
        capture_resources(target, repo)
        print(f"captured resources into {target}")
        sys.exit(0)
    everything = sorted(os.listdir("/sys/class/infiniband"))
    # rxe/: rxe0 alone, the one-device tree the unit tests describe; rxe-pair/: every device.
    copy_tree(target, "rxe", [d for d in everything if d == "rxe0"])
    copy_tree(target, "rxe-pair", everything)
    capture_netlink(target)
    capture_resources(target, repo)
    print(f"captured into {target}")
