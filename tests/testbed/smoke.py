"""The release smoke: every ibtool command and the data path once, on a real kernel, checked
against that release's own iproute2 `rdma` and sysfs.

Runs inside the testbed guest (`testbed [--release NAME] smoke`), with the ibtool the release
was given the way the README's Install section says (/opt/ibtool/install.json: the Debian
package, the wheel in a fresh venv, or the source tree; on this host's testbed the checkout's
.venv), as an operator would run it: one process per command.
Writes OUT/smoke.json (release facts and one row per check: PASS or FAIL, seconds,
what was wrong) and prints a line per check. Exit 0 when every check passed.

`smoke.py CHECK...` runs only those (a name, or its first word: `loopback`, `ping`).
On the host, `smoke.py --table DIR...` prints the release x check table of several runs.
Standard library only: it must run on every release's Python from 3.9.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALLED = Path("/opt/ibtool/install.json")  # a --release root's install (tests/testbed/testbed)


def the_install() -> dict:
    """{"kind", "ibtool", "version"} of the ibtool this smoke runs."""
    try:
        info = json.loads(INSTALLED.read_text())
    except (OSError, ValueError):
        info = {}
    if REPO != INSTALLED.parent / "src" or not info.get("ibtool"):
        return {"kind": "editable", "ibtool": str(REPO / ".venv" / "bin" / "ibtool"), "version": ""}
    return info


INSTALL = the_install()
IBTOOL = INSTALL["ibtool"]
SYS_IB = Path("/sys/class/infiniband")
OPS = ("send", "write", "write_imm", "read", "fetch_add", "cmp_swap", "ud_send")
PING_PORT = 18621
# Under TCG a fresh Python process takes 1-12 s depending on the kernel (5.10's 9p root is
# the slowest): generous bounds, the check fails only when a command hangs.
TIMEOUT = 240


class Failed(Exception):
    pass


def run(
    argv: list[str], timeout: float = TIMEOUT, check: bool = True
) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise Failed(f"{' '.join(argv[:4])} exit {proc.returncode}: {last_line(proc.stderr)}")
    return proc


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def ibtool(*args: str, timeout: float = TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    return run([IBTOOL, *args], timeout, check)


def ibtool_json(*args: str, timeout: float = TIMEOUT):
    return json.loads(ibtool("-j", *args, timeout=timeout).stdout)


def rdma_json(*args: str):
    return json.loads(run(["rdma", "-j", *args]).stdout or "[]")


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise Failed(f"timed out waiting for {what}")


def topology() -> dict[str, str]:
    return {
        k[len("IBTOOL_TB_") :].lower(): v
        for k, v in os.environ.items()
        if k.startswith("IBTOOL_TB_")
    }


# -- the checks: each returns a short detail for the report or raises Failed -------------------


def check_version(tb):
    out = ibtool("--version").stdout.strip()
    expect(out.startswith("ibtool "), f"--version printed {out!r}")
    return out


def upstream(debian_version: str) -> str:
    """1:44.0-2+b1 -> 44.0"""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def check_install(tb):
    """What the install put on the system: `--version`'s lines agree with the system (the
    rdma-core dpkg has, this kernel), the man pages and the completions are where `man` and the
    shells look, and the Debian package's units and defaults file."""
    kind = INSTALL["kind"]
    lines = ibtool("--version").stdout.splitlines()
    words = [line.split()[0] for line in lines if line.strip()]
    expect(words == ["ibtool", "Python", "pyverbs", "rdma-core", "kernel"], f"--version: {lines}")
    expect(lines[-1] == f"kernel {platform.release()}", f"--version: {lines[-1]!r}")
    want = INSTALL.get("version")
    if want:
        expect(lines[0] == f"ibtool {want}", f"--version: {lines[0]!r}, installed {want}")
    rdma = release_facts()["rdma-core"]
    if rdma != "?":
        expect(
            lines[3].split()[1] == upstream(rdma),
            f"--version: {lines[3]!r}, dpkg has rdma-core {rdma}",
        )
    if kind == "editable":
        return f"{lines[0]}; editable .venv (no man pages nor completions installed)"
    if kind == "deb":
        man, bash, zsh = (
            Path("/usr/share/man/man8"),
            Path("/usr/share/bash-completion/completions/ibtool"),
            Path("/usr/share/zsh/vendor-completions/_ibtool"),
        )
        pages = sorted(p.name for p in man.glob("ibtool*.8.gz"))
        units = [
            Path("/usr/lib/systemd/system", u)
            for u in ("ibtool-exporter.service", "ibtool-health.service", "ibtool-health.timer")
        ]
        missing = [
            str(u) for u in [*units, Path("/etc/default/ibtool-exporter")] if not u.is_file()
        ]
        expect(not missing, f"the package did not install {missing}")
        status = run(["dpkg-query", "-W", "-f=${Status} ${Version}", "ibtool"]).stdout
        expect(status.startswith("install ok installed"), f"dpkg: ibtool {status!r}")
    else:
        prefix = Path(IBTOOL).parent.parent
        man = prefix / "share/man/man8"
        bash = prefix / "share/bash-completion/completions/ibtool.bash"
        zsh = prefix / "share/zsh/site-functions/_ibtool"
        pages = sorted(p.name for p in man.glob("ibtool*.8"))
    ours = sorted(p.name for p in (REPO / "man").glob("*.8"))
    shipped = [p.replace(".gz", "") for p in pages]
    expect(shipped == ours, f"{man} holds {shipped}, man/ has {ours}")
    expect(bash.is_file() and zsh.is_file(), f"no completion at {bash} or {zsh}")
    return f"{lines[0]} from the {kind} ({IBTOOL}): {len(pages)} man pages, both completions"


def check_plugins(tb):
    names = {p["name"] for p in ibtool_json("plugins")}
    want = {"devices", "ports", "gids", "counters", "res", "system", "monitor", "loopback", "ping"}
    want |= {"health"}
    expect(want <= names, f"plugins missing: {sorted(want - names)}")
    return f"{len(names)} plugins"


def check_dev(tb):
    ours = {d["ifname"]: d for d in ibtool_json("dev")}
    theirs = {d["ifname"]: d for d in rdma_json("dev", "show")}
    expect(set(ours) == set(theirs), f"devices {sorted(ours)} vs rdma {sorted(theirs)}")
    for name, d in theirs.items():
        expect(ours[name]["node_guid"] == d["node_guid"], f"{name} node_guid differs from rdma")
    return ", ".join(sorted(ours))


def check_dev_details(tb):
    dev = next(d for d in ibtool_json("-d", "dev") if d["ifname"] == tb["device"])
    caps = dev.get("caps") or dev
    expect(caps.get("max_qp"), f"no verbs capabilities in dev -d: {sorted(dev)}")
    return f"max_qp {caps['max_qp']}"


def check_port(tb):
    ours = {f"{p['ifname']}/{p['port']}": p for p in ibtool_json("port")}
    theirs = {f"{p['ifname']}/{p['port']}": p for p in rdma_json("link", "show")}
    expect(set(ours) == set(theirs), f"ports {sorted(ours)} vs rdma {sorted(theirs)}")
    for key, p in theirs.items():
        for field in ("state", "physical_state"):
            rdma_value = p.get(field)
            # iproute2 names phys state 5 LINK_UP like us; older ones print the same words.
            expect(
                str(ours[key][field]).replace("_", "").upper()
                == str(rdma_value).replace("_", "").upper(),
                f"{key} {field} {ours[key][field]} vs rdma {rdma_value}",
            )
    return ", ".join(f"{k} {p['state']}" for k, p in sorted(ours.items()))


def check_port_details(tb):
    port = next(p for p in ibtool_json("-d", "port") if p["ifname"] == tb["device"])
    expect(port.get("active_mtu"), f"no active_mtu in port -d: {sorted(port)}")
    return f"active_mtu {port['active_mtu']}"


def check_gids(tb):
    gids = ibtool_json("gids", tb["device"])
    index = int(tb["ipv4_gid_index"])
    row = next((g for g in gids if g["index"] == index), None)
    expect(row is not None and row["ip"] == tb["ipv4"], f"GID {index} is not {tb['ipv4']}: {row}")
    sysfs = (SYS_IB / tb["device"] / "ports/1/gids" / str(index)).read_text().strip()
    expect(row["gid"] == sysfs, f"GID {index} {row['gid']} vs sysfs {sysfs}")
    return f"{len(gids)} GIDs on {tb['device']}"


def check_gids_best(tb):
    out = ibtool("gids", "--best", tb["netdev"]).stdout.strip()
    expect(
        out == tb["ipv4_gid_index"], f"--best {tb['netdev']} = {out}, want {tb['ipv4_gid_index']}"
    )
    return f"{tb['netdev']} -> {out}"


def check_counters(tb):
    ours = {c["counter"] for c in ibtool_json("counters", f"{tb['device']}/1")}
    stats = rdma_json("statistic", "show", "link", f"{tb['device']}/1")
    theirs = {k for s in stats for k in s if k not in ("ifname", "port")}
    theirs |= {c for s in stats for c in (s.get("counters") or {})}  # newer iproute2 nests them
    missing = theirs - ours
    expect(not missing, f"counters rdma shows but ibtool does not: {sorted(missing)}")
    return f"{len(ours)} counters"


def check_counters_errors(tb):
    proc = ibtool("counters", "--errors", check=False)
    expect(proc.returncode in (0, 1), f"exit {proc.returncode}: {last_line(proc.stderr)}")
    return f"exit {proc.returncode}"


def check_res(tb):
    ours = {s["ifname"]: s for s in ibtool_json("res")}
    theirs = {s["ifname"]: s for s in rdma_json("res", "show")}
    expect(set(ours) == set(theirs), f"devices {sorted(ours)} vs rdma {sorted(theirs)}")
    for name, s in theirs.items():
        for key in ("pd", "cq", "qp", "mr"):
            if key in s:
                expect(
                    ours[name].get(key) == s[key],
                    f"{name} {key} {ours[name].get(key)} vs rdma {s[key]}",
                )
    return ", ".join(f"{n} qp {s.get('qp')}" for n, s in sorted(ours.items()))


def check_res_qp(tb):
    ours = sorted((q["ifname"], q["lqpn"]) for q in ibtool_json("res", "qp"))
    theirs = sorted((q["ifname"], q["lqpn"]) for q in rdma_json("res", "show", "qp"))
    expect(ours == theirs, f"QPs {ours} vs rdma {theirs}")
    return f"{len(ours)} QPs"


def rdma_system() -> dict:
    """`rdma system show`: JSON where iproute2 prints it (5.10's prints text only under -j:
    "netns shared"), else its words in pairs."""
    out = run(["rdma", "-j", "system", "show"]).stdout
    try:
        theirs = json.loads(out)
        return theirs[0] if isinstance(theirs, list) else theirs
    except ValueError:
        words = run(["rdma", "system", "show"]).stdout.split()
        return dict(zip(words[::2], words[1::2]))


def check_system(tb):
    ours = ibtool_json("system")
    theirs = rdma_system()
    expect(
        ours.get("netns") == theirs.get("netns"),
        f"netns {ours.get('netns')} vs rdma {theirs.get('netns')}",
    )
    return " ".join(
        f"{k} {v}" for k, v in ours.items() if v is not None and not isinstance(v, (dict, list))
    )


def check_system_features(tb):
    """system -d asks the kernel for every RDMA netlink feature: report what this one lacks
    (None is a feature that could not be probed)."""
    features = ibtool_json("-d", "system").get("features") or {}
    expect(features, "system -d reported no features")
    expect(features.get("res-get", {}).get("supported"), "RES_GET reported missing")
    lacking = sorted(k for k, f in features.items() if not f.get("supported"))
    return f"{len(features) - len(lacking)}/{len(features)}; lacks " + (
        ", ".join(lacking) or "none"
    )


def check_health(tb):
    """The node check on the healthy testbed: OK, and the textfile node_exporter would read."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        textfile = os.path.join(d, "ibtool.prom")
        proc = ibtool("health", "--no-state", "--textfile", textfile, check=False)
        first = proc.stdout.splitlines()[0] if proc.stdout else last_line(proc.stderr)
        expect(proc.returncode == 0, f"exit {proc.returncode}: {first}")
        with open(textfile) as f:
            text = f.read()
    expect("\nibtool_health_status 0.0\n" in text, "the textfile has no OK ibtool_health_status")
    return first.split(" | ")[0]


def textual_of_the_install():
    """The textual release the Debian package's Python sees, () without one; None for a venv
    install (its pip brought textual 8)."""
    if INSTALL["kind"] != "deb":
        return None
    proc = run(
        [
            "/usr/bin/python3",
            "-c",
            "from importlib import metadata\n"
            "try: print(metadata.version('textual'))\n"
            "except metadata.PackageNotFoundError: print('')",
        ]
    )
    release = []
    for part in proc.stdout.strip().split(".")[:3]:
        if not part.isdigit():
            break
        release.append(int(part))
    return tuple(release)


def check_tui(tb):
    """The dashboard as an operator opens it, in a pseudo-terminal of 80x24: its first frame
    shows the port ACTIVE, and q quits with exit 0 (the terminal handed back)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    env = dict(os.environ, TERM="xterm-256color")
    textual = textual_of_the_install()
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(IBTOOL, [IBTOOL, "tui"], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    screen = b""
    if textual is not None and textual < (8,):
        # The Debian package where Debian's textual is older (it only recommends it): the
        # dashboard says so in one line, exit 6 (ibtool(8)), the other commands work.
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                screen += chunk
        _, status = os.waitpid(pid, 0)
        said = screen.decode(errors="replace").strip()
        expect(os.WEXITSTATUS(status) == 6 and "textual" in said, f"textual {textual}: {said!r}")
        return f"textual {'.'.join(map(str, textual)) or 'none'} here: {said.splitlines()[-1]}"
    want = (f"{tb['device']}/1".encode(), b"ACTIVE")

    def read(until: float) -> bool:
        nonlocal screen
        while time.monotonic() < until:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    return False  # the terminal closed: the app exited
            if all(w in screen for w in want):
                return True
        return False

    try:
        if not read(time.monotonic() + TIMEOUT):
            raise Failed(f"no frame showing {want[0].decode()} ACTIVE in {TIMEOUT} s")
        os.write(fd, b"q")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pid = 0
                code = (
                    os.waitstatus_to_exitcode(status)
                    if hasattr(os, "waitstatus_to_exitcode")
                    else status >> 8
                )
                expect(code == 0, f"ibtool tui exit {code} after q")
                return f"first frame shown, q quit ({len(screen)} bytes drawn)"
            read(time.monotonic() + 0.5)
        raise Failed("ibtool tui still running 60 s after q")
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def check_missing_or_works(argv, netlink: str, since: str):
    """A command that needs a newer kernel's netlink command: exit 0 where the kernel has it,
    else exit 6 (unsupported) with one line naming the command and the release adding it."""

    def check(tb):
        proc = ibtool(*(a.replace("DEV", tb["device"]) for a in argv), check=False)
        if proc.returncode == 0:
            return "exit 0 (the kernel has it)"
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        expect(proc.returncode == 6, f"exit {proc.returncode}: {last_line(proc.stderr)}")
        expect(
            len(lines) == 1 and netlink in lines[0] and since in lines[0],
            f"not one line naming {netlink} and {since}: {proc.stderr.strip()[:300]}",
        )
        return f"exit 6: {lines[0][len('ibtool: error: ') :][:90]}"

    return check


SPARE, SPARE_PEER, NEW, MONITORED = "smk0", "smk1", "rxe9", "rxe8"


def check_link(tb):
    run(["ip", "link", "add", SPARE, "type", "veth", "peer", "name", SPARE_PEER])
    try:
        run(["ip", "link", "set", SPARE, "up"])
        run(["ip", "link", "set", SPARE_PEER, "up"])
        ibtool("link", "add", NEW, "type", "rxe", "netdev", SPARE)
        links = {link["ifname"]: link for link in rdma_json("link", "show")}
        expect(
            NEW in links and links[NEW].get("netdev") == SPARE,
            f"rdma link show lacks {NEW} on {SPARE}",
        )
        ibtool("link", "delete", NEW)
        wait_for(lambda: not (SYS_IB / NEW).exists(), f"{NEW} to go", timeout=60)
        expect(
            NEW not in {link["ifname"] for link in rdma_json("link", "show")}, f"{NEW} still listed"
        )
    finally:
        if (SYS_IB / NEW).exists():
            run(["rdma", "link", "delete", NEW], check=False)
        run(["ip", "link", "delete", SPARE], check=False)
    return f"{NEW} on {SPARE} added and deleted"


def check_monitor(tb):
    """`ibtool -j monitor` sees an rxe device come and go (kernel events on 6.12+, polling
    before), the peer port go DOWN and come back ACTIVE where the kernel shows that in sysfs,
    and ends with 130 on SIGINT. The device is added again until its event is seen: a new
    process under emulation may not have taken its first look yet."""
    peer, device = tb["peer_netdev"], tb["peer_device"]
    proc = subprocess.Popen(
        [IBTOOL, "-j", "monitor", "--interval", "0.5", "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # The guest runs this script as a background job of a non-interactive shell, which
        # starts with SIGINT ignored, and children inherit that: give Ctrl-C back, as a
        # terminal would deliver it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    said: list[str] = []  # its stderr, read as it comes: the note of its first look
    reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)
    reader.start()
    events: list[dict] = []

    def saw(match, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if any(match(e) for e in events):
                return True
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                return False
            try:
                events.append(json.loads(lines.get(timeout=min(left, 1.0))))
            except queue.Empty:
                pass

    def event(name: str, ifname: str, **fields):
        return lambda e: (
            (e.get("event"), e.get("ifname")) == (name, ifname)
            and all(e.get(k) == v for k, v in fields.items())
        )

    def port_state(state: str) -> bool:
        return state in (SYS_IB / device / "ports/1/state").read_text()

    def stop() -> str:
        """SIGINT (SIGKILL after 60 s), as a terminal's Ctrl-C; what it said on stderr."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=10)
        return "".join(said)

    notes = []
    err = ""
    # Before 6.12 the kernel sends no device events: monitor polls, and says so once its first
    # look is taken. A device added before that look is in its baseline, never an event, and
    # under emulation a fresh process can take a minute to get there: wait for the note.
    release = tuple(int(n) for n in platform.release().split("-")[0].split(".")[:2])
    if release < (6, 12):
        deadline = time.monotonic() + TIMEOUT
        while not any("polling" in line for line in said):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise Failed(f"monitor never took its first look: {last_line(stop())}")
            time.sleep(0.5)
    run(["ip", "link", "add", SPARE, "type", "veth", "peer", "name", SPARE_PEER])
    try:
        run(["ip", "link", "set", SPARE, "up"])
        for _ in range(4):
            run(["rdma", "link", "add", MONITORED, "type", "rxe", "netdev", SPARE])
            added = saw(event("register", MONITORED), 45)
            run(["rdma", "link", "delete", MONITORED])
            if added:
                expect(saw(event("unregister", MONITORED), 60), f"no unregister of {MONITORED}")
                break
        else:
            raise Failed(f"no register event for {MONITORED} after adding it 4 times: {events}")
        run(["ip", "link", "set", peer, "down"])
        try:
            wait_for(lambda: port_state("DOWN"), f"{device} DOWN", timeout=20)
        except Failed:
            notes.append(f"{device} stays ACTIVE with {peer} down on this kernel")
        else:
            expect(saw(event("port_state", device, state="DOWN"), 45), f"no DOWN of {device}")
        run(["ip", "link", "set", peer, "up"])
        # Taking a netdev down deletes the routes through it, table 77's too (guest.sh), and
        # bringing it up does not bring them back: without it the kernel routes the peer's
        # traffic to this end's address through lo, and the checks after this one (mesh
        # --local: "the kernel routes ... through lo") meet a topology this check broke.
        run(["ip", "route", "replace", tb["ipv4"], "dev", peer, "src", tb["peer_ipv4"],
             "table", "77"])  # fmt: skip
        wait_for(lambda: port_state("ACTIVE"), f"{device} ACTIVE again")
        if not notes:
            expect(saw(event("port_state", device, state="ACTIVE"), 60), f"no ACTIVE of {device}")
    except Failed as e:
        raise Failed(f"{e}; monitor exit {proc.poll()}: {last_line(err or stop())}") from None
    finally:
        err = err or stop()
        if (SYS_IB / MONITORED).exists():
            run(["rdma", "link", "delete", MONITORED], check=False)
        run(["ip", "link", "delete", SPARE], check=False)
    expect(
        proc.returncode == 130,
        f"monitor exit {proc.returncode} on SIGINT, want 130: {last_line(err)}",
    )
    sources = sorted({str(e.get("source")) for e in events})
    return f"{len(events)} events ({', '.join(sources)})" + "".join(f"; {n}" for n in notes)


def _stop(proc) -> str:
    """SIGINT (then SIGKILL after 60 s) to a process started in its own session; its stderr."""
    if proc.returncode is not None:
        return ""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[1]


def loopback_report(tb):
    if "loopback" not in CACHE:
        proc = ibtool(
            "-j", "loopback", f"{tb['device']}/1", "--iters", "5", "--size", "4096", check=False
        )
        try:
            CACHE["loopback"] = json.loads(proc.stdout)
        except ValueError:
            raise Failed(f"loopback exit {proc.returncode}: {last_line(proc.stderr)}") from None
    return CACHE["loopback"]


CACHE: dict = {}


def check_loopback_op(op):
    def check(tb):
        results = {r["op"]: r for r in loopback_report(tb)["results"]}
        r = results.get(op)
        expect(r is not None, f"no {op} result")
        expect(r["status"] == "PASS", f"{op} {r['status']}: {r.get('error')}")
        p50 = r.get("lat_p50_us")
        return f"p50 {p50:.1f} us" if isinstance(p50, (int, float)) else "p50 unknown"

    check.__name__ = f"loopback {op}"
    return check


def check_ping(mode):
    def check(tb):
        server = subprocess.Popen(
            [IBTOOL, "ping", "--server", "--port", str(PING_PORT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:

            def listening() -> bool:
                if server.poll() is not None:
                    raise Failed(
                        f"ping server exit {server.returncode}: {last_line(server.stderr.read())}"
                    )
                with socket.socket() as s:
                    return s.connect_ex(("127.0.0.1", PING_PORT)) == 0

            wait_for(listening, "the ping server", timeout=180)
            report = ibtool_json(
                "ping", "127.0.0.1", "--port", str(PING_PORT), "-c", "20", "-i", "0", "--mode", mode
            )
            expect(
                (report["sent"], report["received"]) == (20, 20),
                f"{report['received']}/{report['sent']} replies",
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.communicate()
        rtt = report.get("rtt_us") or report.get("rtt") or {}
        median = rtt.get("median") if isinstance(rtt, dict) else None
        return f"20/20, median {median} us" if median is not None else "20/20"

    check.__name__ = f"ping {mode}"
    return check


def _tcp_listening(port: int) -> bool:
    """From /proc/net/tcp{,6}: a connection to find out would be the one client a stock
    ibv_rc_pingpong server accepts."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def _cm_listening(pid: int) -> bool:
    return any(
        c.get("pid") == pid and "LISTEN" in json.dumps(c) for c in rdma_json("res", "show", "cm_id")
    )


def _stock(argv: list[str], ready=None) -> subprocess.Popen:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    if ready is not None:
        wait_for(lambda: proc.poll() is not None or ready(proc), f"{argv[0]} to listen", 180)
        if proc.poll() is not None:
            raise Failed(f"{argv[0]} exited {proc.returncode}: {last_line(proc.stderr.read())}")
    return proc


def _finish(proc, what: str, timeout: float = TIMEOUT) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise Failed(f"{what} did not end: {last_line(err or out or '')}") from None
    expect(proc.returncode == 0, f"{what} exit {proc.returncode}: {last_line(err or out or '')}")
    return out


def check_ping_rc_pingpong(tb):
    """Both ways with rdma-core's own ibv_rc_pingpong of this release."""
    stock = ["ibv_rc_pingpong", "-d", tb["device"], "-g", tb.get("ipv4_gid_index", "1")]
    stock += ["-p", str(PING_PORT), "-s", "64", "-n", "10"]
    server = _stock(stock, lambda p: _tcp_listening(PING_PORT))
    try:
        report = ibtool_json(
            "ping", "--compat", "rc_pingpong", "127.0.0.1", "--port", str(PING_PORT),
            "-s", "64", "-c", "10", "--dev", tb["device"],
        )  # fmt: skip
    except BaseException:
        os.killpg(server.pid, signal.SIGKILL)  # it would wait for the pings forever
        server.communicate()
        raise
    said = _finish(server, "ibv_rc_pingpong -s")
    expect(report["received"] == 10, f"{report['received']}/10 replies from ibv_rc_pingpong")
    expect("10 iters in" in said, f"ibv_rc_pingpong server said {last_line(said)!r}")
    ours = _stock(
        [IBTOOL, "ping", "--server", "--compat", "rc_pingpong", "--port", str(PING_PORT),
         "--dev", tb["device"], "--max-clients", "1"],
        lambda p: _tcp_listening(PING_PORT),
    )  # fmt: skip
    client = run([*stock, "127.0.0.1"], timeout=TIMEOUT, check=False)
    log = _finish(ours, "ibtool ping --server --compat rc_pingpong")
    expect(client.returncode == 0, f"ibv_rc_pingpong client: {last_line(client.stderr)}")
    expect("done: 10 pings of 64 bytes answered" in log, f"ibtool server: {last_line(log)!r}")
    return f"10/10 both ways, median {report['rtt_us']['median']} us"


def check_ping_rping(tb):
    """Both ways with librdmacm's own rping of this release, over rdma_cm."""
    addr = tb["ipv4"]
    server = _stock(["rping", "-s", "-a", addr, "-C", "10", "-v"], lambda p: _cm_listening(p.pid))
    try:
        report = ibtool_json("ping", "--compat", "rping", addr, "-c", "10", "-i", "0")
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # rping -s serves on after its client
        server.communicate(timeout=60)
    expect(report["received"] == 10, f"{report['received']}/10 replies from rping -s")
    ours = _stock(
        [IBTOOL, "ping", "--server", "--compat", "rping", "--bind", addr, "--max-clients", "1"],
        lambda p: _cm_listening(p.pid),
    )
    client = run(["rping", "-c", "-a", addr, "-C", "10", "-V", "-v"], timeout=TIMEOUT, check=False)
    log = _finish(ours, "ibtool ping --server --compat rping")
    expect(client.returncode == 0, f"rping -c -V: {last_line(client.stderr or client.stdout)}")
    expect("done: 10 pings answered" in log, f"ibtool server: {last_line(log)!r}")
    return f"10/10 both ways, median {report['rtt_us']['median']} us"


def check_mesh_local(tb):
    """rxe0 and rxe1 of this guest as the two rails of one node, pinging each other through
    the veth pair: the agent, its ping servers in their own processes, the counters."""
    proc = ibtool("-j", "mesh", "--local", "--all-rails", "-c", "5", "--qp-timeout", "18",
                  "--no-save", timeout=600, check=False)  # fmt: skip
    expect(proc.returncode in (0, 1, 2), f"exit {proc.returncode}: {last_line(proc.stderr)}")
    report = json.loads(proc.stdout)  # exit 1 and 2 (WARN, FAIL) print the mesh too: say why
    probed = [p for p in report["pairs"] if p["state"] == "PROBED"]
    # A FAIL is a real fault here (a path that does not answer, a port down); a WARN on two
    # endpoints of one guest under TCG is the emulation's timing (a guest stalled past the
    # slow rule, seen once in CI on sid and not again in four runs): shown, not failed.
    failed = [v for v in report["verdicts"] if v.get("level") != "WARN"]
    said = f"exit {proc.returncode}: {report['verdicts']}"
    expect(proc.returncode in (0, 1) and not failed, said)
    expect(len(probed) >= 2, f"{len(probed)} pairs probed of {len(report['pairs'])}")
    expect(all(p["received"] == 5 for p in probed), "a pair lost pings")
    warned = f"; WARN (TCG timing): {report['verdicts']}" if report["verdicts"] else ""
    return f"{len(report['endpoints'])} endpoints, {len(probed)} pairs, every ping answered{warned}"


CHECKS = [
    ("--version", check_version),
    ("install", check_install),
    ("plugins", check_plugins),
    ("dev", check_dev),
    ("dev -d", check_dev_details),
    ("port", check_port),
    ("port -d", check_port_details),
    ("gids", check_gids),
    ("gids --best", check_gids_best),
    ("counters", check_counters),
    ("counters --errors", check_counters_errors),
    ("res", check_res),
    ("res qp", check_res_qp),
    ("res ctx", check_missing_or_works(["res", "ctx"], "RDMA_NLDEV_CMD_RES_CTX_GET", "5.13")),
    ("res srq", check_missing_or_works(["res", "srq"], "RDMA_NLDEV_CMD_RES_SRQ_GET", "5.13")),
    (
        "counters optional",
        check_missing_or_works(
            ["counters", "optional", "DEV/1"], "RDMA_NLDEV_CMD_STAT_GET_STATUS", "5.16"
        ),
    ),
    ("system", check_system),
    ("system -d", check_system_features),
    ("link add/delete", check_link),
    ("monitor", check_monitor),
    ("health", check_health),
    ("tui", check_tui),
    *((f"loopback {op}", check_loopback_op(op)) for op in OPS),
    ("ping send", check_ping("send")),
    ("ping write-imm", check_ping("write-imm")),
    ("ping rc_pingpong", check_ping_rc_pingpong),
    ("ping rping", check_ping_rping),
    ("mesh --local", check_mesh_local),
]


def release_facts() -> dict[str, str]:
    facts = {"kernel": platform.release(), "python": platform.python_version()}
    try:
        with open("/etc/os-release") as f:
            os_release = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        facts["os"] = os_release.get("PRETTY_NAME", "").strip('"')
    except OSError:
        pass
    for package in ("rdma-core", "iproute2"):
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
        )
        facts[package] = proc.stdout.strip() if proc.returncode == 0 else "?"
    return facts


def smoke(out: Path, only: list[str]) -> int:
    tb = topology()
    checks = [(n, c) for n, c in CHECKS if not only or n in only or n.split()[0] in only]
    report = {
        "release": os.environ.get("IBTOOL_TB_RELEASE", ""),
        **release_facts(),
        "install": INSTALL["kind"],
        "checks": [],
    }
    print(
        f"smoke on {report.get('os')} kernel {report['kernel']} Python {report['python']} "
        f"rdma-core {report['rdma-core']}; ibtool from the {INSTALL['kind']} ({IBTOOL})",
        flush=True,
    )
    t_all = time.monotonic()
    for name, check in checks:
        t0 = time.monotonic()
        try:
            status, detail = "PASS", check(tb)
        except Failed as e:
            status, detail = "FAIL", str(e)
        except Exception as e:  # a smoke check must report, never stop the others
            status, detail = "FAIL", f"{type(e).__name__}: {e}"
        seconds = round(time.monotonic() - t0, 1)
        report["checks"].append(
            {"check": name, "status": status, "seconds": seconds, "detail": detail}
        )
        print(f"{status:4}  {name:18} {seconds:6.1f} s  {detail}", flush=True)
    report["seconds"] = round(time.monotonic() - t_all, 1)
    (out / "smoke.json").write_text(json.dumps(report, indent=2) + "\n")
    failed = [c["check"] for c in report["checks"] if c["status"] != "PASS"]
    total = len(report["checks"])
    print(
        f"{total - len(failed)}/{total} passed in {report['seconds']} s"
        + (f"; failed: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


def table(paths: list[str]) -> int:
    """The release x check table of several smoke runs (each DIR holds a smoke.json, or the
    file itself); a run that left no smoke.json is a column of its own error."""
    runs = []
    for p in paths:
        path = Path(p)
        path = path / "smoke.json" if path.is_dir() else path
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            runs.append({"release": path.parent.name, "checks": [], "error": str(e)})
    names = list(dict.fromkeys(c["check"] for r in runs for c in r["checks"])) or [
        n for n, _ in CHECKS
    ]
    head = ["check"] + [r.get("release") or r.get("os", "?") for r in runs]
    rows = [
        ["kernel", *(r.get("kernel", "?") for r in runs)],
        ["python", *(r.get("python", "?") for r in runs)],
        ["rdma-core", *(r.get("rdma-core", "?").split("-")[0] for r in runs)],
        ["iproute2", *(r.get("iproute2", "?").split("-")[0] for r in runs)],
        ["install", *(r.get("install", "?") for r in runs)],
    ]
    for name in names:
        row = [name]
        for r in runs:
            c = next((c for c in r["checks"] if c["check"] == name), None)
            row.append(c["status"] if c else "-")
        rows.append(row)
    rows.append(["smoke seconds", *(str(r.get("seconds", "-")) for r in runs)])
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    bad = [
        (r.get("release"), c["check"], c["detail"])
        for r in runs
        for c in r["checks"]
        if c["status"] != "PASS"
    ]
    for release, check, detail in bad:
        print(f"{release}: {check}: {detail}")
    for r in runs:
        if r.get("error"):
            print(f"{r['release']}: no smoke report ({r['error']})")
    return 1 if bad or any(r.get("error") for r in runs) else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        sys.exit(table(sys.argv[2:]))
    sys.exit(smoke(Path(os.environ.get("IBTOOL_TB_OUT", ".")), sys.argv[1:]))
