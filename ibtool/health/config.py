"""The health check's configuration: /etc/ibtool/health.toml, what this node should look like.

Every key is optional: without a file the checks use their defaults (every port ACTIVE at the
best rate it has shown, infiniband-diags' error thresholds). A mistake is one error naming the
file and line, never a half-read configuration: a typo in a key must not silently disable a
check.
"""

from __future__ import annotations

import ipaddress
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from typing import Any

from ibtool.errors import DataError, UnsupportedError
from ibtool.health import files
from ibtool.model.deferred import dataclass
from ibtool.model.health import Range
from ibtool.model.names import valid_netdev_name

DEFAULT_PATH = "/etc/ibtool/health.toml"

# Deltas between two runs above which an error counter is a WARNING: infiniband-diags'
# error_thresholds (ibqueryerrors), under the sysfs names of drivers/infiniband/core/sysfs.c.
# port_xmit_wait counts congestion, not errors: reported, alarmed only where configured.
PMA_THRESHOLDS = {
    "symbol_error": "10",
    "link_error_recovery": "10",
    "link_downed": "10",
    "port_rcv_errors": "10",
    "local_link_integrity_errors": "10",
    "excessive_buffer_overrun_errors": "10",
    "port_rcv_remote_physical_errors": "100",
    "port_xmit_discards": "100",
    "VL15_dropped": "100",
}
# A driver's error counters (mlx5 Q counters, rxe) count transport events that a healthy job
# also has a few of (an RNR NAK, a retransmission): a WARNING from 100 per run.
HW_THRESHOLD = "100"


class ConfigError(DataError):
    """The configuration file cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class PortExpect:
    """What one port (or every port, "*") should be: its rate and width, or ignored."""

    rate: float | None = None  # Gb/s
    width: str | None = None  # "1X", "4X", ...
    ignore: bool = False


@dataclass(frozen=True)
class Thresholds:
    warning: Range | None = None
    critical: Range | None = None


@dataclass(frozen=True)
class HealthConfig:
    path: str | None = None
    skip: frozenset[str] = frozenset()
    devices: tuple[str, ...] = ()
    modules: tuple[str, ...] = ("ib_core", "ib_uverbs")
    ports: Mapping[str, PortExpect] = field(default_factory=dict)
    netdevs: tuple[str, ...] = ()
    thresholds: Mapping[str, Thresholds] = field(default_factory=dict)
    datapath_budget: float = 20.0
    peers: tuple[str, ...] = ()
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    text: str = field(default="", repr=False, compare=False)  # the file, for errors' lines

    def check_names(self, known: Iterable[str]) -> None:
        """A [checks.NAME] table must name a check there is (`known`): a typo there would
        leave the check on its defaults. ConfigError naming the nearest name otherwise."""
        known = list(known)
        for name in self.checks:
            if name not in known:
                problem = f"[checks.{name}] names no health check{_nearest(name, known)}"
                raise _Parser(self.path or "", self.text).error(problem, f"checks\x00{name}")

    def expect(self, device: str, port: int) -> PortExpect:
        """What DEV/PORT should be: its own table, else DEV's, else "*"'s, else nothing."""
        for key in (f"{device}/{port}", device, "*"):
            if key in self.ports:
                return self.ports[key]
        return PortExpect()

    def threshold(self, name: str, source: str) -> Thresholds:
        """The thresholds of counter `name` ("pma" or "hw"): configured, else the default
        warning of an error counter, else none."""
        if name in self.thresholds:
            return self.thresholds[name]
        from ibtool.model import counters as counterinfo

        if source == "pma" and name in PMA_THRESHOLDS:
            return Thresholds(Range.parse(PMA_THRESHOLDS[name]))
        if source != "pma" and counterinfo.is_error(name, source):
            return Thresholds(Range.parse(HW_THRESHOLD))
        return Thresholds()


def toml_parser():
    """The TOML parser: tomllib from Python 3.11, tomli before it."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:
        raise UnsupportedError(
            "reading health.toml needs the tomli package on Python before 3.11",
            "pip install tomli (or: python3-tomli)",
        ) from None
    return tomli


def load(
    path: str | None,
    *,
    required: bool,
    counters: Callable[[], Iterable[str]] | None = None,
) -> HealthConfig:
    """The configuration in `path`; without the file, the defaults unless `required` (a path
    the user gave). Raises ConfigError naming the line of a mistake. `counters` gives the names
    of the host's counters, asked only for a threshold whose counter ibtool does not know (a
    driver's): one that is on neither list is a mistake."""
    if path is None:
        return HealthConfig()
    try:
        raw = files.read(path, files.CONFIG_MAX, null=True)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config {path}: no such file", "see ibtool-health(8)") from None
        return HealthConfig()
    except files.NotAFile as e:
        hint = _TOO_LARGE if e.what.startswith("larger") else _NOT_A_FILE
        raise ConfigError(f"config {path}: {e.what}", hint) from None
    except OSError as e:
        raise ConfigError(f"config {path}: {e.strerror}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path}: not UTF-8 text (byte {e.start})") from None
    return _Parser(path, text, counters).config(_parsed(path, text))


_NOT_A_FILE = "--config takes a regular file (--config /dev/null: none); see ibtool-health(8)"
_TOO_LARGE = "a health.toml is a few KB: is it the right file? see ibtool-health(8)"


def load_config(
    path: str | None,
    counters: Callable[[], Iterable[str]],
    checks: Mapping[str, Any] | None = None,
) -> HealthConfig:
    """The health checks' file (`path`, else /etc/ibtool/health.toml if there is one), as
    every face reads it: a threshold of a counter ibtool does not know must be one of the
    host's `counters`, and a [checks.NAME] must name one of `checks` (when given; else the
    caller asks `check_names` once it has them)."""
    config = load(path or DEFAULT_PATH, required=path is not None, counters=counters)
    if checks is not None:
        config.check_names(checks)
    return config


def _parsed(path: str, text: str) -> dict[str, Any]:
    """The TOML document in `text`. Whatever the parser raises on it is a ConfigError: the
    file is the user's (or anyone's who could write it), so its content, however hostile, is
    a mistake of the config, UNKNOWN, never an internal error that leaves a textfile's last OK
    in place."""
    toml = toml_parser()
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as e:
        raise ConfigError(_syntax_error(path, str(e), text), "see ibtool-health(8)") from None
    except RecursionError:
        # tomllib recurses once per level of nested arrays and inline tables, until Python's
        # recursion limit; tomli 2.1 and later stop at 400 levels with a RecursionError too.
        problem = f"config {path}: arrays or tables nested too deeply to read"
    except ValueError as e:
        # int() refuses a decimal string of more than sys.get_int_max_str_digits() digits
        # (4300 by default: CVE-2020-10735, Python 3.11 and the 3.9.14/3.10.7 security
        # releases), and the TOML spec sets integers no such bound: the parser's ValueError
        # names sys.set_int_max_str_digits(), which the user cannot call.
        problem = _long_number(path, text) or (
            f"config {path}: a value the TOML parser cannot read ({type(e).__name__})"
        )
    except Exception as e:
        problem = f"config {path}: the TOML parser failed on it ({type(e).__name__})"
    raise ConfigError(problem, "see ibtool-health(8)")


def _long_number(path: str, text: str) -> str | None:
    """'config PATH:LINE: a number of more digits than can be read (N)' for the first run of
    more digits than int() reads, or None."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if not limit:
        return None
    for number, line in enumerate(text.splitlines(), 1):
        for run in re.findall(r"[0-9][0-9_]*", line):
            digits = len(run.replace("_", ""))
            if digits > limit:
                return (
                    f"config {path}:{number}: a number of more digits than can be read ({digits})"
                )
    return None


def _syntax_error(path: str, message: str, text: str) -> str:
    """The parser's message as PATH:LINE: problem (tomllib puts the place at its end)."""
    m = re.search(r"\s*\(at line (\d+), column \d+\)$", message)
    if m:
        return f"config {path}:{m.group(1)}: {message[: m.start()]}"
    m = re.search(r"\s*\(at end of document\)$", message)
    if m:
        line = len(text.splitlines()) or 1
        return f"config {path}:{line}: {message[: m.start()]} at the end of the file"
    return f"config {path}: {message}"


_SECTIONS = {
    "health": ("skip", "devices", "modules"),
    "ports": None,  # "DEV/PORT", "DEV" or "*" -> table
    "roce": ("netdevs",),
    "thresholds": None,  # counter -> range or table
    "datapath": ("budget", "peers"),
    "checks": None,  # a plugin's check -> its own table
}
_PORT_KEYS = ("rate", "width", "ignore")
_PORT_KEY = re.compile(r"\*|[^/\s]+(?:/[0-9]+)?")
_WIDTH = re.compile(r"[0-9]+X")


def _nearest(name: str, known: Iterable[str]) -> str:
    """', did you mean 'X'?' for the nearest of `known` (difflib's ratio 0.6 and up), or ''."""
    import difflib  # only for a name that is not known

    near = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {near[0]!r}?" if near else ""


def _known_counters() -> set[str]:
    """The counter names ibtool describes: PMA (with the _64 names of counters_ext) and the
    drivers' hw_counters it knows."""
    from ibtool.model import counters as counterinfo

    return set(counterinfo.PMA) | set(counterinfo.COUNTERS_EXT) | set(counterinfo.HW)


def _finite(value: int | float) -> bool:
    """Whether `value` is a finite float: TOML reads nan, inf and 1e400 (inf) as floats (TOML
    1.0.0, "Float"), and an integer of hundreds of digits is finite but no float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def _finite_range(value: object) -> bool:
    """A threshold's number, or each number of its range text, is finite ("~" and an end left
    out are a range's infinities, written as such, not as 1 followed by 400 zeros)."""
    if isinstance(value, str):
        return all(math.isfinite(float(n)) for n in _NUMBER.findall(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value)
    return True  # not a number: Range.parse says what it must be


def _shown(name: str) -> str:
    """A name from the config in a message: quoted, escaped to ASCII (a terminal escape in the
    file must not reach the terminal or the Nagios output), cut at 40 characters."""
    return ascii(name if len(name) <= 40 else name[:40] + "...")


def _name(name: str) -> str | None:
    """What a name (a check, a module, a peer) must be, when it is not: printable."""
    return None if name.isprintable() else "a name (printable text)"


def _device_name(name: str) -> str | None:
    """An RDMA device's name is a kobject's: anything but '/' (lib/kobject.c), "." and ".."
    (a directory of /sys/class/infiniband); the one in the config is also printable."""
    if "/" in name or name in (".", ".."):
        return "an RDMA device name"
    return _name(name)


def _netdev_or_address(name: str) -> str | None:
    """[roce] netdevs: a netdev name (net/core/dev.c dev_valid_name) or an IP address."""
    if valid_netdev_name(name):
        return None
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return "a netdev name (under 16 bytes, no '/', ':' or space) nor an IP address"
    return None


class _Parser:
    def __init__(self, path: str, text: str, counters: Callable[[], Iterable[str]] | None = None):
        self.path = path
        self.text = text
        self.lines = text.splitlines()
        self.counters = counters

    def line_of(self, section: str, key: str | None = None) -> int | None:
        """The line of `key` in table [section] (or of the table's header), best effort: TOML
        parsers give values, not positions."""
        header = re.compile(
            r"\s*\[\s*" + r"\s*\.\s*".join(_quoted(p) for p in section.split("\x00"))
        )
        current = None
        for number, line in enumerate(self.lines, 1):
            stripped = line.strip()
            if stripped.startswith("["):
                current = number if header.match(line) else None
                if current is not None and key is None:
                    return number
                continue
            if (
                current is not None
                and key is not None
                and re.match(r"\s*" + _quoted(key) + r"\s*=", line)
            ):
                return number
        # a dotted key or inline table at the top: find the key anywhere
        if key is not None:
            for number, line in enumerate(self.lines, 1):
                if re.search(r"(^|[\s.{,])" + _quoted(key) + r"\s*=", line):
                    return number
        return None

    def error(self, problem: str, section: str, key: str | None = None) -> ConfigError:
        line = self.line_of(section, key)
        where = f"{self.path}:{line}" if line else self.path
        return ConfigError(f"config {where}: {problem}", "see ibtool-health(8), CONFIGURATION")

    def config(self, data: dict[str, Any]) -> HealthConfig:
        for name, value in data.items():
            if name not in _SECTIONS:
                known = ", ".join(f"[{s}]" for s in _SECTIONS)
                near = _nearest(name, _SECTIONS)
                raise self.error(f"unknown section [{name}] (known: {known}){near}", name)
            if not isinstance(value, dict):
                raise self.error(f"{name} must be a table ([{name}])", name)
            keys = _SECTIONS[name]
            for key in value if keys is not None else ():
                if key not in keys:
                    raise self.error(
                        f"unknown key {key!r} in [{name}] (known: {', '.join(keys)})"
                        + _nearest(key, keys),
                        name,
                        key,
                    )
        health = data.get("health", {})
        roce = data.get("roce", {})
        datapath = data.get("datapath", {})
        budget = datapath.get("budget", 20.0)
        if (
            isinstance(budget, bool)
            or not isinstance(budget, (int, float))
            or not _finite(budget)
            or budget <= 0
        ):
            raise self.error("budget must be a number of seconds above 0", "datapath", "budget")
        return HealthConfig(
            path=self.path,
            skip=frozenset(self.words(health, "health", "skip")),
            devices=self.words(health, "health", "devices", valid=_device_name),
            modules=self.words(health, "health", "modules", HealthConfig.modules),
            ports=self.ports(data.get("ports", {})),
            netdevs=self.words(roce, "roce", "netdevs", valid=_netdev_or_address),
            thresholds=self.thresholds(data.get("thresholds", {})),
            datapath_budget=float(budget),
            peers=self.words(datapath, "datapath", "peers"),
            checks=self.check_tables(data.get("checks", {})),
            text=self.text,
        )

    def check_tables(self, table: dict) -> dict[str, dict]:
        for name, value in table.items():
            if not isinstance(value, dict):
                raise self.error(f"checks.{name} must be a table", "checks", name)
        return {name: dict(value) for name, value in table.items()}

    def words(
        self,
        table: dict,
        section: str,
        key: str,
        default: tuple[str, ...] = (),
        valid: Callable[[str], str | None] = _name,
    ) -> tuple[str, ...]:
        """A list of names; each one that `valid` finds fault with (it says what a name must
        be) is a ConfigError naming the key."""
        value = table.get(key, list(default))
        if not isinstance(value, list) or not all(
            isinstance(v, str) and v and not any(c.isspace() for c in v) for v in value
        ):
            raise self.error(f'{key} must be a list of names, e.g. ["a", "b"]', section, key)
        for name in value:
            fault = valid(name)
            if fault is not None:
                raise self.error(f"{key}: {_shown(name)} is not {fault}", section, key)
        return tuple(value)

    def ports(self, table: dict) -> dict[str, PortExpect]:
        ports = {}
        for key, value in table.items():
            if not _PORT_KEY.fullmatch(key):
                raise self.error(f'bad port {key!r}: use "DEV/PORT", "DEV" or "*"', "ports")
            section = f"ports\x00{key}"
            if not isinstance(value, dict):
                raise self.error(f"ports.{key} must be a table", "ports", key)
            for k in value:
                if k not in _PORT_KEYS:
                    raise self.error(
                        f"unknown key {k!r} for port {key} (known: {', '.join(_PORT_KEYS)})"
                        + _nearest(k, _PORT_KEYS),
                        section,
                        k,
                    )
            rate = value.get("rate")
            if rate is not None and (
                isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0
            ):
                raise self.error("rate must be a number of Gb/s, e.g. 100", section, "rate")
            if rate is not None and not _finite(rate):
                # nan compares false with every rate (the check would never fire), inf above
                # every one (it would fire on every port)
                raise self.error("rate must be a finite number of Gb/s, e.g. 100", section, "rate")
            width = value.get("width")
            if width is not None and (not isinstance(width, str) or not _WIDTH.fullmatch(width)):
                raise self.error('width must be like "4X"', section, "width")
            ignore = value.get("ignore", False)
            if not isinstance(ignore, bool):
                raise self.error("ignore must be true or false", section, "ignore")
            ports[key] = PortExpect(None if rate is None else float(rate), width, ignore)
        return ports

    def counter_name(self, name: str, known: set[str], present: list[set[str]]) -> None:
        """A threshold's counter must be one ibtool knows or, for a driver's counter it does
        not describe, one this host has: a typo (symbol_errors) would switch its alarm off."""
        if name in known:
            return
        near = _nearest(name, known)
        if not near and self.counters is not None:
            if not present:
                present.append(set(self.counters()))
            if name in present[0]:
                return
            near = _nearest(name, known | present[0])
        elif not near:
            return  # no host to ask (the dashboard): a name far from every known one passes
        raise self.error(f"[thresholds] names no counter {name!r}{near}", "thresholds", name)

    def thresholds(self, table: dict) -> dict[str, Thresholds]:
        found = {}
        known, present = _known_counters(), []
        for name, value in table.items():
            where = ("thresholds", name)
            self.counter_name(name, known, present)
            if isinstance(value, dict):
                unknown = sorted(set(value) - {"warning", "critical"})
                if unknown:
                    raise self.error(
                        f"unknown key {unknown[0]!r} for counter {name} (warning, critical)"
                        + _nearest(unknown[0], ("warning", "critical")),
                        f"thresholds\x00{name}",
                        unknown[0],
                    )
                warning, critical = value.get("warning"), value.get("critical")
            else:
                warning, critical = value, None
            for key, given in (("warning", warning), ("critical", critical)):
                if not _finite_range(given):
                    if isinstance(value, dict):  # [thresholds.NAME]'s line of the key
                        where = (f"thresholds\x00{name}", key)
                    problem = f'threshold of {name}: must be finite numbers, e.g. 10 or "10:20"'
                    raise self.error(problem, *where)
            try:
                found[name] = Thresholds(
                    None if warning is None else Range.parse(warning),
                    None if critical is None else Range.parse(critical),
                )
            except ValueError as e:
                raise self.error(f"threshold of {name}: {e}", *where) from None
        return found


def _quoted(name: str) -> str:
    """A TOML key as it may be written: bare, or in double or single quotes."""
    e = re.escape(name)
    return f"(?:{e}|\"{e}\"|'{e}')"
