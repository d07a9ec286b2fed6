"""`ibtool doctor --pid PID`: the memlock limit, rdma cgroup and CPUs of a job's process, not
doctor's own. Fixture trees hold /proc/PID and the cgroup filesystem as the kernel writes them
(fs/proc/base.c proc_pid_limits, fs/proc/array.c, kernel/cgroup/cgroup.c proc_cgroup_show,
kernel/cgroup/rdma.c print_rpool_values: each device line ends in a space), beside the mlx5
RoCE adapter's sysfs; then the reader against the real /proc of this test's own process."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from ibtool.errors import NotFoundError, PermissionDeniedError
from ibtool.host import Host
from ibtool.sources import process as proc
from tests.fixtures import sysfs_trees
from tests.unit.conftest import run_cli

PID = 4242
JOB = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0"
# mlx5_roce's adapter is on node 0 (its local_cpulist); the machine has two nodes
NODES = {0: "0-15,32-47", 1: "16-31,48-63"}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def cpumask(cpus: str) -> str:
    """Cpus_allowed ("%*pb"): 32-bit hex words, most significant first, comma-separated."""
    bits = 0
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        for c in range(int(lo), int(hi or lo) + 1):
            bits |= 1 << c
    words = []
    for _ in range(2):  # a 64-CPU machine
        words.append(f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
    return ",".join(reversed(words))


def proc_status(name: str, cpus: str, cap_eff: str = "0000000000000000") -> str:
    """/proc/PID/status of a job's process, as fs/proc/array.c prints it (fields cut to what
    doctor and a reader would meet around them)."""
    lines = [
        f"Name:\t{name}",
        "Umask:\t0022",
        "State:\tS (sleeping)",
        f"Tgid:\t{PID}",
        "Ngid:\t0",
        f"Pid:\t{PID}",
        "PPid:\t4230",
        "TracerPid:\t0",
        "Uid:\t1000\t1000\t1000\t1000",
        "Gid:\t1000\t1000\t1000\t1000",
        "FDSize:\t64",
        "Groups:\t1000 ",
        "VmPeak:\t  423112 kB",
        "VmLck:\t       0 kB",
        "VmPin:\t       0 kB",
        "VmRSS:\t   51200 kB",
        "Threads:\t9",
        "SigQ:\t0/1030541",
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        f"CapEff:\t{cap_eff}",
        "CapBnd:\t000001ffffffffff",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t0",
        "Seccomp:\t0",
        f"Cpus_allowed:\t{cpumask(cpus)}",
        f"Cpus_allowed_list:\t{cpus}",
        "Mems_allowed:\t00000000,00000003",
        "Mems_allowed_list:\t0-1",
        "voluntary_ctxt_switches:\t1811",
        "nonvoluntary_ctxt_switches:\t12",
    ]
    return "\n".join(lines) + "\n"


def proc_limits(soft: int | None, hard: int | None) -> str:
    """/proc/PID/limits with the given memlock (None: unlimited), as proc_pid_limits prints."""
    text = sysfs_trees.proc_limits(soft)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Max locked memory"):
            s, h = ("unlimited" if v is None else v for v in (soft, hard))
            lines[i] = f"{'Max locked memory':<25} {s:<20} {h:<20} {'bytes':<10}"
    return "\n".join(lines) + "\n"


def rdma_file(devices: dict[str, tuple]) -> str:
    """rdma.max / rdma.current: "DEV hca_handle=V hca_object=V \\n" a registered device."""
    out = ""
    for dev, (handles, objects) in devices.items():
        h = "max" if handles is None else handles
        o = "max" if objects is None else objects
        out += f"{dev} hca_handle={h} hca_object={o} \n"
    return out


V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"


def cgroup_v2(root: Path, path: str, levels: dict[str, tuple] | None = None,
              current: dict[str, tuple] | None = None,
              controllers: str = V2_CONTROLLERS) -> None:  # fmt: skip
    """The unified hierarchy at /sys/fs/cgroup with `path`'s directories; `levels`: cgroup ->
    mlx5_0's (hca_handle, hca_object) in its rdma.max (the rdma controller on there: every
    registered device listed, the others at max), `current` the same for rdma.current."""
    base = root / "sys" / "fs" / "cgroup"
    _write(base / "cgroup.controllers", controllers + "\n")
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts) + 1):
        (base.joinpath(*parts[:i])).mkdir(parents=True, exist_ok=True)
    for level, limits in (levels or {}).items():
        d = base / level.lstrip("/")
        _write(d / "rdma.max", rdma_file({"mlx5_0": limits, "mlx5_1": (None, None)}))
        used = (current or {}).get(level, (0, 0))
        _write(d / "rdma.current", rdma_file({"mlx5_0": used, "mlx5_1": (0, 0)}))


def job(tmp_path: Path, *, name: str = "python3", cpus: str = NODES[0],
        soft: int | None = None, hard: int | str | None = "soft",
        cap_eff: str = "0000000000000000",
        cgroup: str = f"0::{JOB}\n", levels: dict | None = None, current: dict | None = None,
        v2: bool = True) -> Path:  # fmt: skip
    """The mlx5 RoCE tree with process PID in it: its status, limits (memlock `soft`, and
    `hard` the same unless given; None: unlimited) and cgroup files, the cgroup tree (v2 unless
    told), and the NUMA nodes' CPU lists."""
    root = sysfs_trees.build("mlx5_roce", tmp_path / "root")
    d = root / "proc" / str(PID)
    _write(d / "status", proc_status(name, cpus, cap_eff))
    _write(d / "limits", proc_limits(soft, soft if hard == "soft" else hard))
    _write(d / "cgroup", cgroup)
    if v2:
        cgroup_v2(root, JOB, levels, current)
    for node, cpulist in NODES.items():
        _write(root / "sys" / "devices" / "system" / "node" / f"node{node}" / "cpulist",
               cpulist + "\n")  # fmt: skip
    return root


def doctor(root: Path, *argv: str):
    return run_cli(["--root", str(root), "doctor", *argv])


def checks(result) -> dict[str, tuple]:
    return {c["check"]: (c["status"], c["evidence"], c["fix"]) for c in result.json["checks"]}


# -- without --pid: as before ----------------------------------------------------------------


def test_without_pid_the_output_is_what_it_was(tmp_path):
    """A job's files in the tree change nothing without --pid: doctor's own process counts,
    and there is no cgroup line."""
    plain = sysfs_trees.build("mlx5_roce", tmp_path / "plain")
    with_job = job(tmp_path, soft=65536, cpus=NODES[1], levels={JOB: (0, 0)})
    for argv in ((), ("-j",)):
        a, b = doctor(plain, *argv), doctor(with_job, *argv)
        assert (a.code, a.out.replace(str(plain), "")) == (b.code, b.out.replace(str(with_job), ""))
    got = checks(doctor(with_job, "-j"))
    assert "cgroup" not in got and got["memlock"][:2] == ("PASS", "memlock unlimited")
    assert "process" not in doctor(with_job, "-j").json


# -- memlock ---------------------------------------------------------------------------------


def test_a_job_with_a_low_memlock_fails_though_doctor_is_unlimited(tmp_path):
    r = doctor(job(tmp_path, soft=65536), "--pid", str(PID), "-j")
    status, evidence, fix = checks(r)["memlock"]
    assert (status, evidence) == (
        "FAIL", "PID 4242 (python3): memlock 64 KiB: memory registration beyond it fails (ENOMEM)"
    )  # fmt: skip
    assert fix.startswith("prlimit --memlock=unlimited --pid 4242 (now); for its next start:")
    assert "LimitMEMLOCK=infinity" in fix and "slurmd" in fix
    assert r.code == 2
    assert r.json["local"]["memlock_soft"] == 65536 and r.json["local"]["ipc_lock"] is False


def test_the_hard_limit_is_named_when_it_differs(tmp_path):
    r = doctor(job(tmp_path, soft=64 << 20, hard=None), "--pid", str(PID), "-j")
    status, evidence, _ = checks(r)["memlock"]
    assert status == "WARN"
    assert evidence.startswith("PID 4242 (python3): memlock 64 MiB (hard limit unlimited): ")


def test_cap_ipc_lock_makes_the_limit_not_binding(tmp_path):
    r = doctor(job(tmp_path, soft=65536, cap_eff="0000000000004000"), "--pid", str(PID), "-j")
    assert checks(r)["memlock"][:2] == (
        "PASS", "PID 4242 (python3): memlock 64 KiB, not binding: it has CAP_IPC_LOCK"
    )  # fmt: skip


def test_an_unlimited_job_passes(tmp_path):
    r = doctor(job(tmp_path), "--pid", str(PID), "-j")
    assert checks(r)["memlock"][:2] == ("PASS", "PID 4242 (python3): memlock unlimited")


# -- NUMA ------------------------------------------------------------------------------------


def test_a_job_with_no_cpu_on_the_adapters_node_warns_naming_both(tmp_path):
    r = doctor(job(tmp_path, cpus=NODES[1]), "--pid", str(PID), "-j")
    status, evidence, fix = checks(r)["numa"]
    assert (status, evidence) == (
        "WARN",
        "mlx5_0 on NUMA node 0 (CPUs 0-15,32-47); PID 4242 (python3) runs on CPUs "
        "16-31,48-63, none of them on node 0",
    )
    assert "numactl --cpunodebind=0 --membind=0 COMMAND" in fix
    assert "taskset -apc 0-15,32-47 4242" in fix
    assert r.json["local"]["allowed_cpus"] == "16-31,48-63"


def test_a_job_on_the_adapters_node_passes(tmp_path):
    r = doctor(job(tmp_path, cpus="0-3"), "--pid", str(PID), "-j")
    assert checks(r)["numa"][:2] == (
        "PASS",
        "mlx5_0 on NUMA node 0 (CPUs 0-15,32-47); PID 4242 (python3) runs on CPUs 0-3, all on "
        "node 0",
    )


def test_the_nodes_cpulist_is_what_the_job_is_judged_against(tmp_path):
    root = job(tmp_path, cpus="16-17")
    # the node's own list (sysfs-devices-node) differs from the function's local_cpulist
    _write(root / "sys/devices/system/node/node0/cpulist", "0-17\n")
    r = doctor(root, "--pid", str(PID), "-j")
    assert checks(r)["numa"][0] == "PASS"
    assert r.json["local"]["local_cpus"] == "0-17"


# -- the rdma cgroup -------------------------------------------------------------------------


def test_the_cgroup_line_follows_memlock_only_with_pid(tmp_path):
    r = doctor(job(tmp_path), "--pid", str(PID))
    names = [x.split()[1] for x in r.out.splitlines()[1:-1] if not x.startswith(" ")]
    assert names[names.index("memlock") + 1] == "cgroup"


def test_no_rdma_controller_on_the_path_passes(tmp_path):
    r = doctor(job(tmp_path), "--pid", str(PID), "-j")
    assert checks(r)["cgroup"][:2] == (
        "PASS",
        f"PID 4242 (python3) in {JOB}: no rdma.max on its cgroup path, nothing limits its RDMA "
        "handles or objects",
    )


def test_limits_that_leave_room_pass_naming_them(tmp_path):
    root = job(tmp_path, levels={JOB: (2, 2000)}, current={JOB: (1, 20)})
    r = doctor(root, "--pid", str(PID), "-j")
    assert checks(r)["cgroup"][:2] == (
        "PASS",
        f"PID 4242 (python3) in {JOB}: mlx5_0 limited to hca_handle=2 (1 in use), "
        "hca_object=2000 (20 in use)",
    )
    rdma = r.json["process"]["rdma"]
    assert rdma == [{"cgroup": JOB,
                     "max": {"mlx5_0": {"hca_handle": 2, "hca_object": 2000},
                             "mlx5_1": {"hca_handle": "max", "hca_object": "max"}},
                     "current": {"mlx5_0": {"hca_handle": 1, "hca_object": 20},
                                 "mlx5_1": {"hca_handle": 0, "hca_object": 0}}}]  # fmt: skip


def test_max_everywhere_is_no_limit(tmp_path):
    r = doctor(job(tmp_path, levels={JOB: (None, None)}), "--pid", str(PID), "-j")
    assert checks(r)["cgroup"][:2] == (
        "PASS", f"PID 4242 (python3) in {JOB}: no rdma limit on mlx5_0 (rdma.max: max on its path)"
    )  # fmt: skip


@pytest.mark.parametrize(
    "limits,said",
    [
        ((0, 2000), "hca_handle=0: it cannot open the device at all (ibv_open_device fails: "
                    "EAGAIN)"),
        ((2, 0), "hca_object=0: fewer than one RC connection holds (4: a PD, a CQ, a QP and an "
                 "MR), so creating them fails (EAGAIN)"),
        ((2, 3), "hca_object=3: fewer than one RC connection holds"),
    ],
)  # fmt: skip
def test_a_limit_below_one_connection_fails_with_the_fix(tmp_path, limits, said):
    r = doctor(job(tmp_path, levels={JOB: limits}), "--pid", str(PID), "-j")
    status, evidence, fix = checks(r)["cgroup"]
    assert status == "FAIL" and r.code == 2
    assert evidence.startswith(f"PID 4242 (python3) in {JOB}: its rdma.max gives mlx5_0 ")
    assert said in evidence
    assert fix == (
        f"echo 'mlx5_0 hca_handle=max hca_object=max' > /sys/fs/cgroup{JOB}/rdma.max (or "
        "raise it where the job's manager sets it)"
    )


def test_a_parent_cgroups_limit_counts(tmp_path):
    parent = "/system.slice/slurmstepd.scope/job_7"
    root = job(tmp_path, levels={JOB: (None, None), parent: (0, None)})
    status, evidence, fix = checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"]
    assert status == "FAIL" and f"the rdma.max of {parent} gives mlx5_0 hca_handle=0" in evidence
    assert f"/sys/fs/cgroup{parent}/rdma.max" in fix


def test_a_parents_limit_with_room_passes_naming_where_it_is_set(tmp_path):
    parent = "/system.slice/slurmstepd.scope"
    root = job(tmp_path, levels={JOB: (None, None), parent: (8, None)}, current={parent: (3, 40)})
    assert checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"][:2] == (
        "PASS",
        f"PID 4242 (python3) in {JOB}: mlx5_0 limited to hca_handle=8 (set by {parent}, 3 in use "
        "there)",
    )


def test_a_cgroup_at_its_limit_warns(tmp_path):
    root = job(tmp_path, levels={JOB: (1, 100)}, current={JOB: (1, 3)})
    status, evidence, _ = checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"]
    assert (status, evidence) == (
        "WARN",
        f"PID 4242 (python3) in {JOB}: mlx5_0 hca_handle 1 of 1 in use, its limit: its next "
        "open of the device fails (EAGAIN)",
    )


def test_the_v1_rdma_hierarchy(tmp_path):
    v1 = "/slurm/uid_1000/job_7/step_0"
    lines = (f"12:rdma:{v1}\n11:pids:/system.slice/slurmd.service\n"
             "4:memory:/slurm/uid_1000/job_7/step_0\n1:name=systemd:/system.slice/slurmd.service\n"
             "0::/system.slice/slurmd.service\n")  # fmt: skip
    root = job(tmp_path, cgroup=lines, v2=False)
    base = root / "sys/fs/cgroup/rdma"
    _write(base / v1.lstrip("/") / "rdma.max", rdma_file({"mlx5_0": (4, 2)}))
    _write(base / v1.lstrip("/") / "rdma.current", rdma_file({"mlx5_0": (0, 0)}))
    for level in ("/slurm/uid_1000/job_7", "/slurm/uid_1000", "/slurm"):
        _write(base / level.lstrip("/") / "rdma.max", rdma_file({"mlx5_0": (None, None)}))
    status, evidence, fix = checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"]
    assert status == "FAIL" and evidence.startswith(f"PID 4242 (python3) in {v1} (cgroup v1): ")
    assert "hca_object=2" in evidence and f"/sys/fs/cgroup/rdma{v1}/rdma.max" in fix


def test_a_hybrid_host_reads_the_unified_hierarchy_beside_v1(tmp_path):
    lines = "4:memory:/user.slice\n1:name=systemd:/user.slice\n0::/user.slice\n"
    root = job(tmp_path, cgroup=lines, v2=False)
    unified = root / "sys/fs/cgroup/unified"
    _write(unified / "cgroup.controllers", "rdma\n")
    _write(unified / "user.slice/rdma.max", rdma_file({"mlx5_0": (1, None)}))
    _write(unified / "user.slice/rdma.current", rdma_file({"mlx5_0": (0, 0)}))
    evidence = checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"][1]
    assert evidence == (
        "PID 4242 (python3) in /user.slice: mlx5_0 limited to hca_handle=1 (0 in use)"
    )


def test_no_rdma_controller_in_v2_passes_saying_so(tmp_path):
    root = job(tmp_path)
    _write(root / "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    assert checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"][:2] == (
        "PASS",
        f"PID 4242 (python3) in {JOB}: no rdma controller in the cgroup v2 hierarchy, nothing "
        "limits its RDMA handles or objects",
    )


def test_a_removed_cgroup_or_one_not_found_is_a_skip(tmp_path):
    root = job(tmp_path, cgroup=f"0::{JOB} (deleted)\n")
    assert checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"][:2] == (
        "SKIP", f"PID 4242 (python3) in {JOB}: its cgroup was removed (deleted)"
    )  # fmt: skip
    root = job(tmp_path / "b", cgroup="0::/elsewhere/job\n")
    assert checks(doctor(root, "--pid", str(PID), "-j"))["cgroup"][:2] == (
        "SKIP",
        "PID 4242 (python3) in /elsewhere/job: /sys/fs/cgroup/elsewhere/job not found (another "
        "cgroup namespace or mount)",
    )


# -- what cannot be read or is malformed: warned about, never raised -------------------------


@pytest.mark.parametrize(
    "text,warned",
    [
        ("mlx5_0 hca_handle=two hca_object=2000 \n", "rdma.max: malformed value"),
        ("mlx5_0 hca_handle=2 \n", "rdma.max: malformed value"),
        ("mlx5_0 hca_handle 2 hca_object 2000 \n", "rdma.max: malformed value"),
        ("mlx5_0 hca_handle=2 hca_object=2000 \nmlx5_0 hca_handle=2 hca_object=2000 \n",
         "rdma.max: malformed value"),
    ],
)  # fmt: skip
def test_a_malformed_rdma_max_is_warned_about_and_skipped(tmp_path, text, warned):
    root = job(tmp_path, levels={JOB: (2, 2000)})
    _write(root / "sys/fs/cgroup" / JOB.lstrip("/") / "rdma.max", text)
    r = doctor(root, "--pid", str(PID), "-j")
    status, evidence, _ = checks(r)["cgroup"]
    assert status == "SKIP"
    assert evidence.endswith(f"/sys/fs/cgroup{JOB}/rdma.max malformed: its rdma limits not known")
    assert any(warned in w for w in r.warnings), r.err
    assert r.code == 1  # the rest is judged: the adapter's PCIe link still warns


def test_malformed_proc_files_are_warned_about_and_not_known(tmp_path):
    root = job(tmp_path)
    d = root / "proc" / str(PID)
    _write(d / "limits", "Limit Soft Limit Hard Limit Units\nMax locked memory lots\n")
    _write(d / "status", proc_status("python3", "0-3").replace("0-3", "0-x", 1)
           .replace("CapEff:\t0000000000000000", "CapEff:\tzz"))  # fmt: skip
    _write(d / "cgroup", "garbage\n")
    r = doctor(root, "--pid", str(PID), "-j")
    got = checks(r)
    assert got["memlock"][:2] == ("SKIP", "PID 4242 (python3): memlock limit not known")
    assert got["numa"][:2] == (
        "SKIP", "mlx5_0 on NUMA node 0 (CPUs 0-15,32-47); the CPUs of PID 4242 (python3) not known"
    )  # fmt: skip
    assert got["cgroup"][:2] == (
        "SKIP", "PID 4242 (python3): cgroup not known (/proc/4242/cgroup malformed)"
    )  # fmt: skip
    warned = "\n".join(r.warnings)
    for path in ("/proc/4242/limits", "/proc/4242/status", "/proc/4242/cgroup"):
        assert path in warned, warned
    assert r.json["process"]["notes"] == [
        "/proc/4242/limits: memlock limit not known",
        "/proc/4242/status: CapEff not known",
        "/proc/4242/status: CPUs not known",
        "/proc/4242/cgroup malformed",
    ]


def test_a_cgroup_path_with_dot_dot_is_refused(tmp_path):
    root = job(tmp_path, cgroup="0::/../../etc\n")
    r = doctor(root, "--pid", str(PID), "-j")
    assert checks(r)["cgroup"][0] == "SKIP" and "not a cgroup path" in checks(r)["cgroup"][1]


def test_a_huge_file_is_not_read_whole(tmp_path):
    root = job(tmp_path)
    _write(root / "proc" / str(PID) / "cgroup", "0::/" + "a" * 70000 + "\n")
    r = doctor(root, "--pid", str(PID), "-j")
    assert checks(r)["cgroup"][0] == "SKIP"
    assert any("larger than 65536 bytes" in w for w in r.warnings), r.err


# -- a PID that is not there, or not readable: one line, a documented exit code --------------


def test_a_pid_that_does_not_exist_is_one_error_line(tmp_path):
    r = doctor(job(tmp_path), "--pid", "4343")
    assert (r.code, r.out) == (4, "")
    assert len(r.err.splitlines()) == 1
    assert r.err.startswith(f"ibtool: error: no process 4343 in {tmp_path / 'root' / 'proc'} ")
    assert "scontrol listpids" in r.err and "hidepid" in r.err


def test_a_pid_whose_files_cannot_be_read_is_one_error_line(tmp_path, monkeypatch):
    # as root (these tests' user) chmod does not stop a read: the kernel's refusal is faked
    def refused(files, path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(proc, "read_strict", refused)
    r = doctor(job(tmp_path), "--pid", str(PID))
    assert (r.code, r.out) == (5, "")
    assert r.err == (
        "ibtool: error: process 4242: /proc/4242/status: Permission denied (hint: run doctor as "
        "the process's user or as root (/proc mounted with hidepid=1 lets only them read it))\n"
    )


@pytest.mark.parametrize("pid", ["0", "-1", "abc", "4194304"])
def test_a_pid_that_is_no_pid_is_a_usage_error(tmp_path, pid):
    r = doctor(job(tmp_path), "--pid", pid)
    assert r.code == 2 and r.out == "" and "--pid" in r.err


# -- the real /proc: this test's own process -------------------------------------------------


def test_the_reader_on_this_process(tmp_path):
    host = Host("/", lambda m: pytest.fail(m))
    status, limits = host.open_process(os.getpid())
    p = host.read_process(os.getpid(), status, limits)
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    unlimited = resource.RLIM_INFINITY
    assert p.memlock.soft == (None if soft == unlimited else soft)
    assert p.memlock.hard == (None if hard == unlimited else hard)
    assert p.cpus == frozenset(os.sched_getaffinity(0))
    with open("/proc/self/status") as f:
        cap = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    assert p.ipc_lock == bool(int(cap, 16) >> 14 & 1)
    with open("/proc/self/cgroup") as f:
        lines = proc.parse_cgroup_file(f.read())
    assert p.cgroup is not None, p.cgroup_why
    rdma = next((ln[2] for ln in lines if "rdma" in ln[1]), None)
    unified = next((ln[2] for ln in lines if ln[0] == "0" and not ln[1]), None)
    assert p.cgroup.path == (rdma or unified).removesuffix(" (deleted)")
    assert p.cgroup.version == (1 if rdma else 2)
    if p.cgroup.levels:  # a host whose rdma controller is on along this test's cgroup path
        for level in p.cgroup.levels:
            assert level.bad is None and level.limits, level
    assert p.name == "pytest" or p.name.startswith("python")


def test_a_pid_this_kernel_never_gives_is_not_found():
    with open("/proc/sys/kernel/pid_max") as f:
        never = int(f.read())  # PIDs are below pid_max
    with pytest.raises(NotFoundError) as e:
        Host("/", lambda m: None).open_process(never)
    assert e.value.message == f"no process {never}"
    r = run_cli(["doctor", "--pid", str(never)]) if never < 4194304 else None
    if r is not None:  # before anything else: this host needs no RDMA device for it
        assert (r.code, r.out, len(r.err.splitlines())) == (4, "", 1)


def test_permission_denied_is_its_own_error(tmp_path, monkeypatch):
    def refused(files, path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(proc, "read_strict", refused)
    with pytest.raises(PermissionDeniedError) as e:
        Host("/", lambda m: None).open_process(os.getpid())
    assert e.value.exit_code == 5 and e.value.errno == 13
