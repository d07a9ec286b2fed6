"""`ibtool tui`: the live dashboard. Textual is imported when the command runs, never when the
CLI loads its plugins."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator

from ibtool.api import Invocation, UnsupportedError, UsageError, hookimpl, number

INTERVAL = (0.2, 10.0)  # as rdmatop's refresh bounds
# The checks run at a poll: more often than every second is every poll at the default
# --interval; a day apart, the port and device changes that also start them say the rest.
HEALTH_INTERVAL = (1.0, 86400.0)
# The fabric screen's scans (each a discovery and every port's PMA counters, ibtool fabric
# errors' MADs): a scan that outlasts the interval is followed by the next, never two at once.
FABRIC_INTERVAL = (1.0, 86400.0)
FABRIC_INTERVAL_DEFAULT = 10.0


def configure(parser) -> None:
    parser.add_argument(
        "--interval",
        type=number(float, *INTERVAL, unit="seconds"),
        default=1.0,
        metavar="SECONDS",
        help="time between two reads of the host, 0.2-10 (default 1; < and > change it)",
    )
    parser.add_argument(
        "--health-interval",
        type=number(float, *HEALTH_INTERVAL, unit="seconds"),
        default=60.0,
        metavar="SECONDS",
        help="run the health checks this often, and at once when a port changes (default 60)",
    )
    parser.add_argument(
        "--fabric-interval",
        type=number(float, *FABRIC_INTERVAL, unit="seconds"),
        default=FABRIC_INTERVAL_DEFAULT,
        metavar="SECONDS",
        help="scan the InfiniBand fabric this often once its screen (f) is opened (default 10)",
    )
    parser.add_argument("--config", metavar="FILE", help="the health checks' file, as for health")


TEXTUAL_FLOOR = (8,)  # the dashboard's widgets and stylesheet as tested (pyproject.toml)
TEXTUAL_HINT = (
    "apt install python3-textual where the distribution's is 8 or later (Debian 14), else "
    "pip install 'textual>=8' in a venv made with --system-site-packages and run ibtool from "
    "there; every other command works without it"
)


def need_textual() -> None:
    """textual 8 or later, or one line saying which textual this Python has: the Debian
    package only recommends python3-textual, which Debian 12 ships as 0.1 and Debian 13 as 2.1,
    and the dashboard written for 8 fails inside either."""
    from importlib import metadata

    try:
        version = metadata.version("textual")
    except metadata.PackageNotFoundError:
        return  # no textual at all: the import below says so
    major = re.match(r"\d+", version)  # "8.2.8", "10.1.0a1"
    if major is None or (int(major.group()),) < TEXTUAL_FLOOR:
        raise UnsupportedError(
            f"ibtool tui needs textual 8 or later; this Python has textual {version}",
            TEXTUAL_HINT,
        )


def _feed(inv: Invocation, closing: list):
    """The dashboard's face of the Engine, on the hosts the options name."""
    from ibtool.api import health as healthstate
    from ibtool.api import health_checks
    from ibtool.api.health import load_config
    from ibtool.api.live import Feed, hosts_for

    checks = health_checks(inv.plugins, inv.warn)
    feed: Feed | None = None

    def note(message: str) -> None:
        (inv.warn if feed is None else feed.note)(message)  # on stderr before the app starts

    hosts = hosts_for(inv, note)
    closing.append(hosts.close)
    config = load_config(inv.args.config, hosts.counter_names, checks)
    feed = Feed(
        hosts,
        checks=checks,
        config=config,
        health_every=inv.args.health_interval,
        boot_id=lambda h: healthstate.boot_id(h.root, h.fs),
    )
    return feed


def _has_fabric(feed) -> bool:
    """Whether the dashboard offers the fabric screen: on this host, an InfiniBand port to
    scan it through; on a snapshot, a fabric it saved (snapshot save --fabric); a --root tree
    holds none."""
    from ibtool.api import IbtoolError, LinkLayer

    hosts = feed.engine.hosts
    host = hosts.open()
    try:
        if feed.live:
            ports = host.ports(fields=("link_layer",))
            return any(p.link_layer == LinkLayer.INFINIBAND for p in ports)
        host.fabric()  # a capture's saved one, or NotLiveError: no MAD is sent
        return True
    except IbtoolError:
        return False
    finally:
        hosts.done(host)


def fabric_watch(inv: Invocation, feed):
    """The fabric screen's FabricWatch, not started, or None where there is no fabric: on
    this host a Host opened for each scan; on a snapshot the capture the polls read, its
    saved fabric scanned once."""
    from ibtool.api.live import FabricWatch, watch_for

    if (inv.snapshot is None and inv.root != "/") or not _has_fabric(feed):
        return None
    interval = inv.args.fabric_interval
    if feed.live:
        return watch_for(inv, None, interval=interval)
    hosts = feed.engine.hosts
    return FabricWatch(lambda note: hosts.open(), hosts.done, interval=interval, live=False)


def fabric_thresholds(warn) -> dict[str, int]:
    """The error counters' thresholds: infiniband-diags' error_thresholds file where it
    exists (as ibqueryerrors and ibtool fabric errors read it), else none (any error counts);
    a file that cannot be read or parsed is said once and none are used."""
    from ibtool.api.fabric import THRESHOLDS_FILE, THRESHOLDS_MAX, parse_thresholds
    from ibtool.api.health import NotAFile, read_bounded

    try:
        raw = read_bounded(THRESHOLDS_FILE, THRESHOLDS_MAX)
        return parse_thresholds(raw.decode("utf-8", "replace"), THRESHOLDS_FILE)
    except FileNotFoundError:
        return {}
    except NotAFile as e:
        warn(f"thresholds {THRESHOLDS_FILE}: {e.what}; any error counts")
    except OSError as e:
        warn(f"thresholds {THRESHOLDS_FILE}: {e.strerror or e}; any error counts")
    except ValueError as e:
        warn(f"{e}; any error counts")
    return {}


def loopback_runner(host_gid_index: Callable[[str, int], int | None]):
    """The dashboard's loopback test: ibtool loopback's, on the live host's verbs, as the
    screen's Runner (SIZE bytes, ITERS iterations, TIMEOUT seconds per operation)."""
    from ibtool.api.tui import ITERS, SIZE, TIMEOUT

    def runner(device, port, ops, report, cancelled) -> None:
        from ibtool.api.loopback import Loopback, run_op

        gid_index = host_gid_index(device, port)
        with Loopback(device, port, gid_index, SIZE, 16) as lb:
            for op in ops:
                if cancelled():
                    return
                report(run_op(lb, op, ITERS, TIMEOUT, bandwidth_iters=128))

    return runner


def doctor_runner(
    open_host: Callable[[], object], done: Callable[[object], None], live: bool, warn
):
    """The dashboard's doctor: ibtool doctor's checklist of one port, as the screen's Runner.
    `open_host()` gives the Host to read and `done(host)` is called after; `live`: the running
    host, where a peer given is probed as ibtool doctor probes it; a capture is only checked
    (as `ibtool --root DIR doctor PEER`: no RDMA round trip from a capture). ibtool doctor's
    defaults otherwise: 3 round trips, 2 s."""

    def runner(device: str, port: int, peer, cancelled):
        from ibtool.api.doctor import Options, diagnose

        opts = Options(peer=peer or None, probe=live and bool(peer), count=3, timeout=2.0)
        host = open_host()
        try:
            return diagnose(host, f"{device}/{port}", opts, warn)
        finally:
            done(host)

    return runner


@contextlib.contextmanager
def screen_of_its_own() -> Iterator[None]:
    """The terminal on a descriptor of the dashboard's own while inside. Textual draws on
    sys.__stderr__ (its Linux driver's output file), that is fd 2; and where a MAD is sent
    (the fabric screen's scans, the doctor on InfiniBand) ibtool.sources.mad points fd 2 at a
    file for as long as libibmad runs, to make its messages notes: from the scan's thread,
    that took the screen's own writes too (the screen froze, and its escape sequences came
    back as a note). A dup of fd 2 is the same terminal, and nothing points it elsewhere."""
    original = sys.__stderr__
    try:
        fd = os.dup(original.fileno())
    except (AttributeError, ValueError, OSError):  # no stderr, or not a file: as it is
        yield
        return
    screen = os.fdopen(fd, "w", encoding=original.encoding, errors=original.errors)
    sys.__stderr__ = screen
    try:
        yield
    finally:
        sys.__stderr__ = original
        screen.close()


def run(inv: Invocation) -> int:
    if inv.json:
        raise UsageError("ibtool tui has no JSON output", "use ibtool port/counters -j")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            "ibtool tui needs a terminal",
            "in scripts use ibtool counters --watch, ibtool monitor or ibtool health",
        )
    need_textual()
    try:
        from ibtool.api.tui import Dashboard
    except ImportError as e:
        raise UnsupportedError(
            f"ibtool tui needs the textual package ({e})", TEXTUAL_HINT
        ) from None
    from ibtool.api import open_host, panel_factories

    closing: list = []
    try:
        feed = _feed(inv, closing)
        fabric = fabric_watch(inv, feed)
        if fabric is not None:
            closing.insert(0, lambda: fabric.stop(timeout=1.0))  # before the hosts close
        loopback = None
        if feed.live:

            def live_host():
                return open_host(inv, feed.note, details=False).host

            def gid_index(device: str, port: int):
                host = live_host()
                try:
                    return host.roce_gid_index(device, port)
                finally:
                    host.close()

            loopback = loopback_runner(gid_index)
            doctor = doctor_runner(live_host, lambda h: h.close(), True, feed.note)
        else:  # the capture's one host, as the polls read it (Hosts.done closes no capture)
            hosts = feed.engine.hosts
            doctor = doctor_runner(hosts.open, hosts.done, False, feed.note)
        with screen_of_its_own():
            app = Dashboard(
                feed,
                interval=inv.args.interval,
                panels=panel_factories(inv.plugins, inv.warn),
                loopback=loopback,
                doctor=doctor,
                peers=feed.engine.config.peers,
                fabric=fabric,
                thresholds=fabric_thresholds(feed.note) if fabric is not None else None,
            )
            app.run()
    finally:
        for close in closing:
            close()
    return app.return_code or 0


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "tui",
        run,
        help="the live dashboard: every port, its traffic, counters, GIDs, health and events",
        configure=configure,
    )
