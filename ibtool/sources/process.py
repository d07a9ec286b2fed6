"""A process as `ibtool doctor --pid PID` judges it (its records: ibtool.model.system): a job
started by slurmd or a service manager has its own locked-memory limit, cgroup and CPUs, not
doctor's. Read from
/proc/PID and the cgroup filesystem under the host's root, every file read bounded
(RootedFiles: 64 KiB, never through a link out of the root). A value that is missing or
malformed is warned about and left unknown, never raised; only a process that is not there, or
whose /proc files cannot be read at all, is an error, before the checklist.

- /proc/PID/status: Name, CapEff and Cpus_allowed_list (fs/proc/array.c; proc(5)).
- /proc/PID/limits: "Max locked memory", soft and hard, "unlimited" for RLIM_INFINITY
  (fs/proc/base.c proc_pid_limits; proc(5)).
- /proc/PID/cgroup: "HIERARCHY-ID:CONTROLLERS:PATH" a line (cgroups(7)): "0::PATH" is the
  unified (v2) hierarchy, a v1 line with "rdma" among its controllers the v1 rdma hierarchy;
  a v2 path whose cgroup was removed ends in " (deleted)" (kernel/cgroup/cgroup.c,
  proc_cgroup_show).
- rdma.max and rdma.current of each cgroup on that path where the rdma controller is on
  (Documentation/admin-guide/cgroup-v2.rst, "RDMA"; cgroup-v1/rdma.rst): one line a registered
  device, "DEV hca_handle=N hca_object=N " with "max" for no limit (kernel/cgroup/rdma.c,
  print_rpool_values). A charge walks from the process's cgroup up to the root and fails with
  EAGAIN at the first one over its max (rdmacg_try_charge): every level's limit counts. The root
  cgroup has neither file (CFTYPE_NOT_ON_ROOT). Opening a device (a user context) takes one
  hca_handle; each PD, CQ, QP, MR, SRQ or AH one hca_object (drivers/infiniband/core/rdma_core.c,
  alloc_begin_idr_uobject).

The cgroup filesystem is looked for where systemd mounts it: v2 at /sys/fs/cgroup (or
/sys/fs/cgroup/unified beside v1 controllers), the v1 rdma controller at /sys/fs/cgroup/rdma.
"""

from __future__ import annotations

import os

from ibtool.errors import NotFoundError, PermissionDeniedError
from ibtool.model.names import printable
from ibtool.model.system import RDMA_RESOURCES, Cgroup, MemLock, Process, RdmaLevel
from ibtool.sources.proc import parse_memlock
from ibtool.sources.sysfs.fs import DISK
from ibtool.sources.sysfs.pci import parse_cpulist
from ibtool.sources.sysfs.rooted import RootedFiles
from ibtool.sources.sysfs.values import quoted

CAP_IPC_LOCK = 14  # linux/include/uapi/linux/capability.h
CGROUP = "sys/fs/cgroup"
MAX_LEVELS = 64  # cgroup paths nest far less deep (cgroup.max.depth is unlimited by default)
FIND_PID = "pgrep -f COMMAND; a Slurm job's: scontrol listpids JOBID"


# -- reading ---------------------------------------------------------------------------------


def read_strict(files: RootedFiles, path: str) -> str:
    """A /proc file the run cannot do without, read bounded: OSError as the kernel gives it."""
    real = files.inside(path)
    if real is None:
        raise PermissionError(13, "a link out of the root", path)
    data = files.fs.read(real, files.limit + 1)
    if len(data) > files.limit:
        raise OSError(27, f"larger than {files.limit} bytes", path)  # EFBIG
    return data.decode("utf-8", "surrogateescape")


def _shown(files: RootedFiles, path: str) -> str:
    """`path` as the running host names it (/proc/4242/status under any root)."""
    if files.root in ("/", ""):
        return path
    rel = os.path.relpath(path, files.root)
    return path if rel.startswith("..") else "/" + rel


def open_process(root: str, warn, pid: int, fs=DISK) -> tuple[str, str | None]:
    """/proc/PID/status and /proc/PID/limits of `pid` under the host's root, or the error that
    ends the run: NotFoundError when there is no such process (or /proc hides it), and
    PermissionDeniedError when its files cannot be read. A limits file missing where the status
    is there (a captured tree: the kernel has both) is None, warned about later."""
    files = RootedFiles(root, warn, fs=fs)
    texts: list[str | None] = []
    for name in ("status", "limits"):
        path = files.path("proc", str(pid), name)
        try:
            texts.append(read_strict(files, path))
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
            if name == "limits":
                texts.append(None)
                continue
            where = "" if root == "/" else f" in {os.path.join(root, 'proc')}"
            raise NotFoundError(
                f"no process {pid}{where}",
                f"give the PID of a running process ({FIND_PID}); /proc mounted with hidepid "
                "hides other users' processes",
            ) from None
        except OSError as e:
            raise PermissionDeniedError(
                f"process {pid}: {_shown(files, path)}: {e.strerror or e}",
                "run doctor as the process's user or as root (/proc mounted with hidepid=1 "
                "lets only them read it)",
                errno=e.errno,
            ) from None
    return texts[0], texts[1]


def read_process(root: str, warn, pid: int, status: str, limits: str | None, fs=DISK) -> Process:
    """What doctor judges of process `pid`, from its status and limits (open_process's) and
    its cgroup; each value that cannot be read or parsed is warned about and left None."""
    files = RootedFiles(root, warn, fs=fs)
    notes: list[str] = []
    base = files.path("proc", str(pid))
    fields = _status_fields(status)
    name = fields.get("Name")
    lock = None
    if limits is None:
        files.bad(os.path.join(base, "limits"), "missing")
    else:
        lock = files.parse(os.path.join(base, "limits"), limits.rstrip("\n"), parse_memlock)
    if lock is None:
        notes.append(f"{_shown(files, os.path.join(base, 'limits'))}: memlock limit not known")
        lock = MemLock(None, None, known=False)
    ipc = None
    if "CapEff" in fields:
        ipc = files.parse(os.path.join(base, "status"), fields["CapEff"], _cap_ipc_lock)
    if ipc is None:
        notes.append(f"{_shown(files, os.path.join(base, 'status'))}: CapEff not known")
    cpus = None
    if "Cpus_allowed_list" in fields:
        cpus = files.parse(os.path.join(base, "status"), fields["Cpus_allowed_list"],
                           parse_cpulist)  # fmt: skip
    else:
        files.bad(os.path.join(base, "status"), "no Cpus_allowed_list line")
    if cpus is None:
        notes.append(f"{_shown(files, os.path.join(base, 'status'))}: CPUs not known")
    cgroup, why = read_cgroup(files, os.path.join(base, "cgroup"))
    if why is not None:
        notes.append(why)
    return Process(
        pid=pid,
        name=printable(name, 64) if name else None,
        memlock=lock,
        ipc_lock=ipc,
        cpus=cpus,
        cgroup=cgroup,
        cgroup_why=why,
        notes=tuple(notes),
    )


def _status_fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key not in out:
            out[key] = value.strip()
    return out


def _cap_ipc_lock(text: str) -> bool:
    if not text or len(text) > 32 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise ValueError(text)
    return bool(int(text, 16) >> CAP_IPC_LOCK & 1)


# -- the cgroup ------------------------------------------------------------------------------


def parse_cgroup_file(text: str) -> list[tuple[str, tuple[str, ...], str]]:
    """/proc/PID/cgroup -> [(hierarchy id, controllers, path)]; ValueError for a line that is
    not "ID:CONTROLLERS:PATH" with PATH absolute."""
    out = []
    for line in text.splitlines():
        if not line:
            continue
        hid, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hid.isdigit() and path.startswith("/")):
            raise ValueError(line)
        out.append((hid, tuple(c for c in controllers.split(",") if c), path))
    return out


def _clean(path: str) -> str | None:
    """A cgroup path safe to join under the mount: absolute, no '.' or '..' components (the
    kernel never writes them; a captured file might)."""
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts) or len(parts) > MAX_LEVELS:
        return None
    return "/" + "/".join(parts)


def read_cgroup(files: RootedFiles, path: str) -> tuple[Cgroup | None, str | None]:
    """The process's rdma cgroup and the limits on its path, or None and why not."""
    shown = _shown(files, path)
    text = files.read(path)
    if text is None:
        return None, f"{shown} not read"
    lines = files.parse(path, text, parse_cgroup_file)
    if lines is None:
        return None, f"{shown} malformed"
    v1 = next((ln for ln in lines if "rdma" in ln[1]), None)
    v2 = next((ln for ln in lines if ln[0] == "0" and not ln[1]), None)
    if v1 is not None:
        version, cg_path, mount = 1, v1[2], os.path.join(CGROUP, "rdma")
    elif v2 is not None:
        version, cg_path = 2, v2[2]
        unified = os.path.join(CGROUP, "unified")
        mount = CGROUP
        if not files.exists(files.path(CGROUP, "cgroup.controllers")) and files.exists(
            files.path(unified, "cgroup.controllers")
        ):
            mount = unified  # systemd's hybrid layout: v1 controllers, v2 beside them
    else:
        return None, f"{shown}: no rdma controller (v1) and no unified hierarchy (v2) line"
    deleted = cg_path.endswith(" (deleted)")
    if deleted:
        cg_path = cg_path.removesuffix(" (deleted)")
    clean = _clean(cg_path)
    shown_mount = "/" + mount
    if clean is None:
        files.bad(path, f"not a cgroup path: {quoted(cg_path)}")
        return None, f"{shown}: not a cgroup path {quoted(cg_path)}"
    cg = Cgroup(version, clean, shown_mount, None)
    if deleted:
        return _with(cg, None, "its cgroup was removed (deleted)"), None
    if version == 2 and clean != "/" and not _rdma_available(files, mount):
        return _with(cg, (), "no rdma controller in the cgroup v2 hierarchy"), None
    top = files.path(mount, clean.lstrip("/"))
    if not files.isdir(top):
        why = f"{cg.directory(clean)} not found (another cgroup namespace or mount)"
        return _with(cg, None, why), None
    levels = []
    level = clean
    while level != "/":
        d = files.path(mount, level.lstrip("/"))
        limits_path = os.path.join(d, "rdma.max")
        if files.exists(limits_path):
            levels.append(_level(files, level, d))
        level = os.path.dirname(level)
    return _with(cg, tuple(levels), None), None


def _with(cg: Cgroup, levels, why) -> Cgroup:
    return Cgroup(cg.version, cg.path, cg.mount, levels, why)


def _rdma_available(files: RootedFiles, mount: str) -> bool:
    """Whether the v2 root offers the rdma controller (cgroup.controllers); True when that
    file cannot be read (the walk then finds what is there)."""
    text = files.read(files.path(mount, "cgroup.controllers"), required=False)
    return text is None or "rdma" in text.split()


def parse_rdma(text: str) -> dict[str, tuple[int | None, int | None]]:
    """rdma.max or rdma.current -> {device: (hca_handle, hca_object)}, None for "max";
    ValueError naming the first line that is not "DEV hca_handle=V hca_object=V"."""
    out: dict[str, tuple[int | None, int | None]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        values: dict[str, int | None] = {}
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep:
                raise ValueError(line)
            if key in RDMA_RESOURCES:
                values[key] = _rdma_value(value, line)
        if any(r not in values for r in RDMA_RESOURCES) or words[0] in out:
            raise ValueError(line)
        out[words[0]] = (values["hca_handle"], values["hca_object"])
    return out


def _rdma_value(text: str, line: str) -> int | None:
    if text == "max":
        return None
    digits = text[1:] if text.startswith("-") else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > 20:
        raise ValueError(line)
    return int(text)


def _level(files: RootedFiles, level: str, d: str) -> RdmaLevel:
    limits_path = os.path.join(d, "rdma.max")
    text = files.read(limits_path)
    if text is None:
        return RdmaLevel(level, {}, {}, f"{_shown(files, limits_path)} not read")
    limits = files.parse(limits_path, text, parse_rdma)
    if limits is None:
        return RdmaLevel(level, {}, {}, f"{_shown(files, limits_path)} malformed")
    used_path = os.path.join(d, "rdma.current")
    used_text = files.read(used_path)
    used = files.parse(used_path, used_text, parse_rdma) if used_text is not None else None
    return RdmaLevel(level, limits, used or {})
