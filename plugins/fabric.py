"""`ibtool fabric`: the InfiniBand subnet beyond this host, discovered with MADs through
rdma-core's libibnetdisc: every switch, channel adapter and router, and every link with both
ends, as ibnetdiscover finds them; `links`: each link against what its ends enable and its
tier's norm; `errors`: every port's error counters over their thresholds, with the cable's
other end and their growth since the last run."""

from __future__ import annotations

import time

from ibtool.api import Invocation, UsageError, hookimpl, number

USAGE = "ibtool fabric [links | errors | sm | route SRC DST] [--via DEV[/PORT]]"
ACTIONS = ("links", "errors", "sm", "route")
STATE_CHECK = "fabric_errors"  # its entry in the state file
# How long `sm` gives the master to show activity: opensm sweeps every 10 s by default
# (opensm.conf sweep_interval), and its activity count moves as it polls and sweeps.
WAIT = 10.0


def _configure(parser) -> None:
    parser.add_argument(
        "words",
        nargs="*",
        metavar="links | errors | sm | route SRC DST",
        help="links: each link's width and speed against its ends and its tier's norm; "
        "errors: each port's error counters over their thresholds; sm: the subnet managers; "
        "route: the path from SRC to DST (LIDs, GUIDs or node descriptions) hop by hop "
        "(default: the subnet's nodes and links)",
    )
    parser.add_argument(
        "--wait",
        type=number(float, 0, 60, unit="seconds"),
        metavar="SECONDS",
        help="sm: how long the master's activity count may take to move (default 10; 0: "
        "not checked)",
    )
    parser.add_argument(
        "--against",
        metavar="SNAPSHOT",
        help="links: also name the links a snapshot saved with --fabric had up that are down now",
    )
    parser.add_argument(
        "--thresholds",
        metavar="FILE",
        help="errors: the thresholds, in infiniband-diags' error_thresholds format (default: "
        "/etc/infiniband-diags/error_thresholds where it exists, else none: any error counts)",
    )
    parser.add_argument(
        "--state",
        metavar="FILE",
        help="errors: where the counters are kept between runs (default: "
        "/var/lib/ibtool/fabric.json as root)",
    )
    parser.add_argument(
        "--all-ports",
        action="store_true",
        help="errors: read every port's counters, the 64-bit data counters too (default: a "
        "switch whose ports' sum is under the thresholds is not read port by port, as "
        "ibqueryerrors does)",
    )
    parser.add_argument(
        "--no-state",
        action="store_true",
        help="errors: keep no state (every counter over its threshold counts)",
    )
    parser.add_argument(
        "--via",
        metavar="DEV[/PORT]",
        help="the local InfiniBand port to scan through (default: the first active one)",
    )
    parser.add_argument(
        "--timeout",
        type=number(int, 1, 60000),
        default=200,
        metavar="MS",
        help="each MAD's timeout in milliseconds (default 200)",
    )
    parser.add_argument(
        "--retries",
        type=number(int, 0, 20),
        default=3,
        metavar="N",
        help="retries of a MAD that timed out (default 3)",
    )
    parser.add_argument(
        "--max-smps",
        type=number(int, 1, 64),
        default=2,
        metavar="N",
        help="SMPs outstanding at once (default 2, as ibnetdiscover)",
    )


def run(inv: Invocation) -> int:
    from ibtool.api.fabric import Bounds, view

    words = inv.args.words
    if words and words[0] not in ACTIONS:
        raise UsageError(f"unknown fabric action {words[0]!r}", USAGE)
    if words and words[0] == "route" and len(words) != 3:
        raise UsageError("ibtool fabric route needs a source and a destination", USAGE)
    if words and words[0] != "route" and len(words) > 1:
        raise UsageError(f"unknown fabric action {' '.join(words[1:])!r}", USAGE)
    bounds = Bounds(
        max_smps=inv.args.max_smps, timeout_ms=inv.args.timeout, retries=inv.args.retries
    )
    errors = words == ["errors"]
    for option, value, action in (
        ("--against", inv.args.against, "links"),
        ("--thresholds", inv.args.thresholds, "errors"),
        ("--state", inv.args.state, "errors"),
        ("--no-state", inv.args.no_state, "errors"),
        ("--all-ports", inv.args.all_ports, "errors"),
        ("--wait", inv.args.wait is not None, "sm"),
    ):
        if value and words != [action]:
            raise UsageError(f"{option} is for ibtool fabric {action}", USAGE)
    if inv.args.state and inv.args.no_state:
        raise UsageError("--state and --no-state: one or the other", USAGE)
    thresholds = _thresholds(inv.args.thresholds) if errors else None
    fabric = inv.host.fabric(inv.args.via, bounds)
    for line in fabric.unanswered:
        inv.warn(line)
    if errors:
        return _errors(inv, fabric, bounds, *thresholds)
    if words == ["sm"]:
        return _sm(inv, fabric, bounds)
    if words and words[0] == "route":
        return _route(inv, fabric, bounds, words[1], words[2])
    if words == ["links"]:
        gone = _gone_since(inv, fabric) if inv.args.against else None
        checked = view.links_checked(fabric)
        if inv.json:
            inv.emit_json(view.links_json(fabric, checked, gone))
        else:
            for line in view.links_text(fabric, checked, gone):
                inv.print(line)
        return int(view.links_status(checked[2], gone))
    if inv.json:
        inv.emit_json(view.as_json(fabric))
        return 0
    for line in view.text(fabric):
        inv.print(line)
    return 0


def _thresholds(path: str | None) -> tuple[dict[str, int], str | None, str]:
    """(thresholds, the file they came from, how to say where they came from)."""
    from ibtool.api import DataError
    from ibtool.api.fabric import THRESHOLDS_FILE, THRESHOLDS_MAX, parse_thresholds
    from ibtool.api.health import NotAFile, read_bounded

    given = path is not None
    path = path or THRESHOLDS_FILE
    try:
        raw = read_bounded(path, THRESHOLDS_MAX)
    except FileNotFoundError:
        if given:
            raise UsageError(f"--thresholds {path}: no such file") from None
        return {}, None, "none (any error counts, as ibqueryerrors without its file)"
    except NotAFile as e:
        raise DataError(f"thresholds {path}: {e.what}") from None
    except OSError as e:
        raise DataError(f"thresholds {path}: {e.strerror or e}") from None
    try:
        values = parse_thresholds(raw.decode("utf-8", "replace"), path)
    except ValueError as e:
        raise DataError(str(e), "infiniband-diags' format: Name=value, one a line") from None
    return values, path, path if values else f"{path} (none set: any error counts)"


def _errors(inv: Invocation, fabric, bounds, thresholds, thresholds_file, said) -> int:
    from ibtool.api.fabric import ERROR_COUNTERS, clean_sum, judge_counters, view
    from ibtool.api.health import StateFile, state_path

    clean = None if inv.args.all_ports else clean_sum(thresholds)
    read = inv.host.fabric_counters(fabric, bounds, clean=clean, data=inv.args.all_ports)
    ports, unanswered = read.counters, read.unanswered
    for line in unanswered:
        inv.warn(line)
    if inv.snapshot is not None:
        findings = judge_counters(ports, thresholds, None)
        baseline = f"as snapshot {inv.snapshot} saved them, no state kept"
    elif inv.args.no_state:
        findings = judge_counters(ports, thresholds, None)
        baseline = "no state kept: every counter over its threshold counts"
    else:
        state = StateFile(inv.args.state or state_path(name="fabric.json"), "ibtool fabric errors")
        with state.locked(10.0):
            saved = state.load()
            if saved.problem:
                inv.warn(saved.problem)
            data, _, when = saved.of(STATE_CHECK)
            before = _kept(data)
            findings = judge_counters(ports, thresholds, before)
            now = time.time()
            # What is kept: the ports of this fabric only (a node gone takes its ports with
            # it), each as this run read it, else as the last run did. A port left to its
            # switch's sum is known only to be at or under each threshold: exactly 0 where
            # the threshold is 0, unknown (no baseline) where it is more.
            kept = dict(before or {})
            zeros = {n: 0 for n in ERROR_COUNTERS if thresholds.get(n, 0) == 0}
            for node, _ in read.summed:
                for number in range(1, node.port_count + 1):
                    kept[node.guid, number] = zeros
            kept.update({(pc.node, pc.port): pc.values for pc in ports})
            here = {(node.guid, number) for node, number, _ in fabric.counter_ports()}
            saved_ports = {f"{g:#x}:{n}": v for (g, n), v in kept.items() if (g, n) in here}
            state.save({STATE_CHECK: {"data": {"ports": saved_ports}, "time": now}})
        if before is None:
            baseline = "first run: baseline taken"
        else:
            ago = f", {now - when:.0f} s ago" if isinstance(when, (int, float)) else ""
            baseline = f"compared with the last run{ago}"
    if inv.json:
        inv.emit_json(
            view.errors_json(fabric, read, findings, thresholds, thresholds_file, baseline)
        )
    else:
        for line in view.errors_text(fabric, read, findings, said, baseline):
            inv.print(line)
    return int(view.errors_status(findings, read.unanswered))


def _sm(inv: Invocation, fabric, bounds) -> int:
    from ibtool.api.fabric import judge_sms, view

    wait = WAIT if inv.args.wait is None else inv.args.wait
    scan = inv.host.fabric_sms(fabric, bounds, wait)
    findings = judge_sms(scan.sms, scan.silent, scan.local_sm_lid, scan.moved, scan.waited)
    if inv.json:
        inv.emit_json(view.sm_json(fabric, scan, findings))
    else:
        for line in view.sm_text(fabric, scan, findings):
            inv.print(line)
    return int(view.sm_status(findings))


def _route(inv: Invocation, fabric, bounds, source: str, dest: str) -> int:
    from ibtool.api.fabric import NodeType, view

    route = inv.host.fabric_route(fabric, source, dest, bounds)
    ends = []
    for hop in route.hops:
        for node, port in ((hop.node, hop.port), (hop.far, hop.far_port)):
            lid = node.lid if node.type == NodeType.SWITCH else port.lid
            ends.append((node, port.number, lid))
    read = inv.host.fabric_counters(fabric, bounds, ends)
    for line in read.unanswered:
        inv.warn(line)
    counters = {(pc.node, pc.port): pc for pc in read.counters}
    thresholds = _thresholds(None)[0]
    if inv.json:
        inv.emit_json(view.route_json(route, counters, thresholds))
    else:
        for line in view.route_text(route, counters, thresholds):
            inv.print(line)
    return int(view.route_findings(route, counters, thresholds)[0])


def _gone_since(inv: Invocation, fabric) -> list[str]:
    """The links the --against snapshot's fabric had that this one has not (each named)."""
    from ibtool.api import DataError
    from ibtool.api.fabric import fabric_changes, fabric_from_data
    from ibtool.api.snapshot import load

    path = inv.args.against
    data = load(path, **inv.snapshot_kwargs())
    if data.get("fabric") is None:
        raise DataError(
            f"{path} holds no fabric scan", "save one with ibtool snapshot save FILE --fabric"
        )
    try:
        saved = fabric_from_data(data["fabric"])[0]
    except ValueError as e:
        raise DataError(f"{path} is damaged: its {e}") from None
    return [c.what for c in fabric_changes(saved, fabric) if c.kind == "link_down"]


def _kept(data) -> dict[tuple[int, int], dict[str, int]] | None:
    """The counters the last run kept, as far as they are what this command writes."""
    ports = data.get("ports") if isinstance(data, dict) else None
    if not isinstance(ports, dict):
        return None
    found = {}
    for key, values in ports.items():
        guid, _, port = key.partition(":") if isinstance(key, str) else ("", "", "")
        try:
            where = (int(guid, 16), int(port))
        except ValueError:
            continue
        if isinstance(values, dict):
            found[where] = {
                k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)
            }
    return found


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "fabric",
        run,
        help="the InfiniBand subnet: its switches, channel adapters, routers and links",
        configure=_configure,
    )


# -- ibtool health: the far end of this host's cables, and the subnet manager ----------------

HEALTH_OPTIONS = {
    "timeout": (int, 1, 60000),  # each MAD's, in milliseconds
    "retries": (int, 0, 20),
    "sm": (bool, None, None),  # whether the SM is checked
    "sm_idle": (float, 1, 86400),  # seconds a master's activity may stand still
}


def _health_options(options) -> dict:
    """[checks.fabric] of health.toml, checked: a ValueError naming the key at fault."""
    known = ", ".join(HEALTH_OPTIONS)
    found = {}
    for key, value in options.items():
        if key not in HEALTH_OPTIONS:
            raise ValueError(f"[checks.fabric] names no option {key!r} ({known})")
        kind, low, high = HEALTH_OPTIONS[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"[checks.fabric] {key} must be true or false")
        elif (
            isinstance(value, bool)
            or not isinstance(value, (int, float) if kind is float else int)
            or not low <= value <= high
        ):
            raise ValueError(f"[checks.fabric] {key} must be a number from {low} to {high}")
        found[key] = value
    return found


def check_fabric(ctx):
    """Each InfiniBand port's cable to its far end (a switch port, as a rule): both ends'
    width and speed, the far port's error counters' growth since the last run against the
    local counters' thresholds; and the SM its SM LID names: answering, the master, its
    activity moving between runs. A few MADs a port (6 SMPs and 2 PMA MADs; 3 SMPs for
    the SM). Nothing on a host with no InfiniBand port, or on a capture."""
    from ibtool.api import HealthResult, IbtoolError, Status, UnsupportedError
    from ibtool.api.fabric import Bounds, judge_cable, judge_sm

    host = ctx.host
    if not host.live:
        return  # a capture holds no cable's far end
    try:
        options = _health_options(ctx.options)
    except ValueError as e:
        yield HealthResult(Status.UNKNOWN, "", f"far ends not checked: {e}")
        return
    bounds = Bounds(timeout_ms=options.get("timeout", 200), retries=options.get("retries", 3))
    try:
        cables = host.cables(bounds=bounds)
    except UnsupportedError as e:
        if _has_infiniband(host):
            hint = f" ({e.hint})" if e.hint else ""
            yield HealthResult(Status.UNKNOWN, "", f"far ends not checked: {e.message}{hint}")
        return  # no InfiniBand port, and no MAD library either: nothing to check
    except IbtoolError as e:
        hint = f" ({e.hint})" if e.hint else ""
        yield HealthResult(Status.UNKNOWN, "", f"far ends not checked: {e.message}{hint}")
        return
    previous = ctx.previous if isinstance(ctx.previous, dict) else {}
    old_cables = previous.get("cables") if isinstance(previous.get("cables"), dict) else {}
    old_sms = previous.get("sms") if isinstance(previous.get("sms"), dict) else {}
    kept: dict = {"cables": {}, "sms": {}}
    active = []
    for c in cables:
        subject = f"{c.ca}/{c.port}"
        if ctx.config.expect(c.ca, c.port).ignore:
            continue
        results, keep = judge_cable(
            c,
            old_cables.get(subject),
            lambda name: ctx.config.threshold(name, "pma"),
            _no_baseline(ctx),
        )
        yield from results
        if keep is not None:
            kept["cables"][subject] = keep
        if c.far is not None:
            active.append(c)
    if options.get("sm", True):
        asked = set()
        for c in active:
            subject = f"{c.ca}/{c.port}"
            try:
                sm_lid, sm = host.subnet_manager(subject, bounds)
            except IbtoolError as e:
                yield HealthResult(Status.UNKNOWN, subject, f"subnet manager: {e.message}")
                continue
            key = str(sm.guid) if sm is not None else f"lid{sm_lid}"
            if key in asked:
                continue  # the same SM, seen through another port
            asked.add(key)
            results, keep = judge_sm(
                subject, sm_lid, sm, old_sms.get(key), ctx.now, options.get("sm_idle", 30.0)
            )
            yield from results
            if keep is not None:
                kept["sms"][key] = keep
    if kept["cables"] or kept["sms"]:  # nothing judged (no InfiniBand port): nothing kept
        ctx.keep(kept)


def _has_infiniband(host) -> bool:
    from ibtool.api import IbtoolError, LinkLayer

    try:
        ports = host.ports(fields=("link_layer",))
        return any(p.link_layer == LinkLayer.INFINIBAND for p in ports)
    except IbtoolError:
        return False


def _no_baseline(ctx) -> str:
    if not ctx.stateful:
        return "no state kept: error counters not compared"
    return "first run: baseline taken"


@hookimpl
def ibtool_health_checks(register):
    register("fabric", check_fabric)
