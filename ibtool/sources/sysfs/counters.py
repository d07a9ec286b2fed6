"""Port and device counters: the PMA PortCounters (counters/, counters_ext/) and the drivers'
hw_counters/ (drivers/infiniband/core/sysfs.c show_pma_counter, hw_stat_device_show)."""

from __future__ import annotations

from ibtool.model import counters as counterinfo
from ibtool.model.records import CounterSample
from ibtool.sources.sysfs.files import SysfsFiles, read_attr
from ibtool.sources.sysfs.values import is_number, quoted


class CounterFiles(SysfsFiles):
    """The counters of a sysfs tree's RDMA devices."""

    def counters(self, device: str, port: int) -> list[CounterSample]:
        """PMA PortCounters (counters/, and counters_ext/ where a kernel has it) and driver
        hw_counters/ of a port; port 0: the device-wide hw_counters. Each read of counters/ is a
        MAD to the firmware."""
        d = f"{self.class_dir}/{device}"
        if port == 0:
            return self._hw_counters(device, 0, f"{d}/hw_counters")
        p = f"{d}/ports/{port}"
        return self._pma_counters(device, port, p) + self._hw_counters(
            device, port, f"{p}/hw_counters"
        )

    def _pma_counters(self, device: str, port: int, port_dir: str) -> list[CounterSample]:
        """counters/, with the 64-bit counters of counters_ext/ in place of 32-bit ones.

        A counter of counters_ext/ takes the name counters/ has for it (port_xmit_data_64 is
        port_xmit_data) and its value wins unless counters/ is a 64-bit table itself."""
        unavailable: list[str] = []
        values = self._pma_files(f"{port_dir}/counters", "", unavailable)
        wide = counterinfo.pma_table_is_wide(values)
        widths = {name: counterinfo.pma_width(name, wide) for name in values}
        ext_dir = f"{port_dir}/counters_ext"
        for file, value in self._pma_files(ext_dir, "counters_ext/", unavailable).items():
            name = counterinfo.COUNTERS_EXT.get(file)
            if name is None:  # not one of the eight: shown under its own name
                if file not in values:
                    values[file], widths[file] = value, None
            elif widths.get(name) != 64:
                values[name], widths[name] = value, 64
        if unavailable:
            self.warn(
                f"{device}/{port}: {len(unavailable)} PMA counters unavailable "
                f"({unavailable[0]}{', ...' if len(unavailable) > 1 else ''})"
            )
        return [
            CounterSample(device, port, name, values[name], "pma", widths[name], _scale(name))
            for name in sorted(values)
        ]

    def _pma_files(
        self, directory: str, prefix: str, unavailable: list[str]
    ) -> dict[str, int | None]:
        """name -> value of the counter files in directory; the unavailable ones (no PMA behind
        the port) are None and named in `unavailable`, for one warning per port."""
        values: dict[str, int | None] = {}
        for name in sorted(self.listdir(directory, required=False)):
            path = f"{directory}/{name}"
            values[name] = None
            try:
                text = read_attr(path, self.fs)
            except OSError as e:  # current kernels fail the read when the PMA query fails
                unavailable.append(f"{prefix}{name}: {e.strerror}")
                continue
            if text.startswith("N/A"):  # old kernels: "N/A (no PMA)"
                unavailable.append(f"{prefix}{name}: {text}")
            else:
                values[name] = self._counter_value(path, text)
        return values

    def _hw_counters(self, device: str, port: int, directory: str) -> list[CounterSample]:
        samples = []
        for name in sorted(self.listdir(directory, required=False)):
            if name == "lifespan":
                continue
            path = f"{directory}/{name}"
            text = self.read(path)
            value = None if text is None else self._counter_value(path, text)
            samples.append(CounterSample(device, port, name, value, "hw"))
        return samples

    def _counter_value(self, path: str, text: str) -> int | None:
        """The count a counter file holds (the kernel prints %u or %llu); None for anything else,
        which is warned about once per file: a negative number or text that is not a number."""
        digits = text.strip()
        if is_number(digits):
            value = int(digits)
            if value < 1 << 64:
                return value
            self.bad(path, f"value {digits} is above 2^64-1")
        elif digits.startswith("-") and is_number(digits[1:]):
            self.bad(path, f"negative value {digits}")
        else:
            self.bad(path, f"malformed value {quoted(text)}")
        return None


def _scale(name: str) -> int:
    return 4 if name in ("port_xmit_data", "port_rcv_data") else 1  # 4-octet words
