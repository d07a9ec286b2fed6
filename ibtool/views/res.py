"""How RDMA objects are shown: who holds each, and the fields of every kind of object as
iproute2's `rdma res show` names and orders them (its JSON keys, its columns), shared by
`ibtool res` and whatever else lists resources."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ibtool.model.deferred import dataclass
from ibtool.model.records import Owner
from ibtool.views import render

OBJECTS = ("qp", "cm_id", "cq", "mr", "pd", "ctx", "srq")
PER_PORT = ("qp", "cm_id")  # the others belong to a device, not a port


# -- who holds an object ------------------------------------------------------------------------


class Owners:
    """comm of each owner, each pid's read once per command."""

    def __init__(self, reader: Callable[[int], str | None]) -> None:
        self._reader = reader
        self._names: dict[int, str | None] = {}

    def comm(self, owner: Owner) -> str | None:
        if owner.pid is None:
            return owner.kern_name
        if owner.pid not in self._names:
            self._names[owner.pid] = self._reader(owner.pid)
        return self._names[owner.pid]


@dataclass(frozen=True)
class Row:
    """One object and its holder's name, as the output shows it."""

    record: Any
    comm: str | None

    @property
    def kernel(self) -> bool:
        return self.record.owner.pid is None and self.record.owner.kern_name is not None


# -- fields: rdma's JSON keys, in its order ------------------------------------------------------


def attr(name: str) -> Callable[[Row], Any]:
    return lambda row: getattr(row.record, name)


def _word(value) -> str:
    """An enum as rdma prints it: its name, UNKNOWN for a number rdma has no name for."""
    return value.label if hasattr(value, "label") else "UNKNOWN"


def enum_word(name: str) -> Callable[[Row], Any]:
    def get(row: Row):
        value = getattr(row.record, name)
        return None if value is None else _word(value)

    return get


def _key(name: str) -> Callable[[Row], Any]:
    # rdma prints keys as hex without 0x in JSON, and with it in text.
    def get(row: Row):
        value = getattr(row.record, name)
        return None if value is None else f"{value:x}"

    return get


def _hex_text(value: str) -> str:
    return f"0x{value}"


HEAD = [
    render.Field("ifindex", attr("device_index"), in_text=False),
    render.Field("ifname", attr("device"), header="DEV"),
]
LINK = [*HEAD, render.Field("port", attr("port"), header="PORT")]
TAIL = [
    render.Field("pid", lambda row: row.record.owner.pid, header="PID"),
    render.Field("comm", lambda row: row.comm, header="COMM"),
]

QP_FIELDS = [
    *LINK,
    render.Field("lqpn", attr("lqpn"), header="LQPN"),
    render.Field("rqpn", attr("rqpn"), header="RQPN"),
    render.Field("type", enum_word("type"), header="TYPE"),
    render.Field("state", enum_word("state"), header="STATE"),
    render.Field("rq-psn", attr("rq_psn"), header="RQ-PSN"),
    render.Field("sq-psn", attr("sq_psn"), header="SQ-PSN"),
    render.Field("path-mig-state", enum_word("path_mig_state"), header="PATH-MIG"),
    render.Field("pdn", attr("pdn"), header="PDN"),
    *TAIL,
]
CM_ID_FIELDS = [
    *LINK,
    render.Field("cm-idn", attr("cm_idn"), header="CM-IDN"),
    render.Field("lqpn", attr("lqpn"), header="LQPN"),
    render.Field("qp-type", enum_word("qp_type"), header="QP-TYPE"),
    render.Field("state", enum_word("state"), header="STATE"),
    render.Field("ps", lambda row: port_space(row.record.ps), header="PS"),
    *TAIL,
    render.Field("src-addr", attr("src_addr"), header="SRC-ADDR"),
    render.Field("dst-addr", attr("dst_addr"), header="DST-ADDR"),
]
CQ_FIELDS = [
    *HEAD,
    render.Field("cqn", attr("cqn"), header="CQN"),
    render.Field("cqe", attr("cqe"), header="CQE"),
    render.Field("users", attr("users"), header="USERS"),
    render.Field("poll-ctx", enum_word("poll_ctx"), header="POLL-CTX"),
    render.Field(
        "adaptive-moderation",
        attr("adaptive_moderation"),
        header="DIM",
        text=lambda v: "on" if v else "off",
    ),
    render.Field("ctxn", attr("ctxn"), header="CTXN"),
    *TAIL,
]
MR_FIELDS = [
    *HEAD,
    render.Field("mrn", attr("mrn"), header="MRN"),
    render.Field("rkey", _key("rkey"), header="RKEY", text=_hex_text),
    render.Field("lkey", _key("lkey"), header="LKEY", text=_hex_text),
    render.Field("iova", _key("iova"), header="IOVA", text=_hex_text),
    render.Field("mrlen", attr("mrlen"), header="MRLEN"),
    render.Field("pdn", attr("pdn"), header="PDN"),
    *TAIL,
]
PD_FIELDS = [
    *HEAD,
    render.Field("pdn", attr("pdn"), header="PDN"),
    render.Field("local_dma_lkey", _key("local_dma_lkey"), header="LOCAL_DMA_LKEY", text=_hex_text),
    render.Field("users", attr("users"), header="USERS"),
    render.Field(
        "unsafe_global_rkey",
        _key("unsafe_global_rkey"),
        header="UNSAFE_GLOBAL_RKEY",
        text=_hex_text,
    ),
    render.Field("ctxn", attr("ctxn"), header="CTXN"),
    *TAIL,
]
CTX_FIELDS = [*HEAD, render.Field("ctxn", attr("ctxn"), header="CTXN"), *TAIL]
SRQ_FIELDS = [
    *HEAD,
    render.Field("srqn", attr("srqn"), header="SRQN"),
    render.Field("type", enum_word("type"), header="TYPE"),
    render.Field(
        "lqpn", lambda row: _qpn_words(row.record.lqpns) or None, header="LQPN", text=",".join
    ),
    render.Field("pdn", attr("pdn"), header="PDN"),
    render.Field("cqn", attr("cqn"), header="CQN"),
    *TAIL,
]
FIELDS_OF = {
    "qp": QP_FIELDS,
    "cm_id": CM_ID_FIELDS,
    "cq": CQ_FIELDS,
    "mr": MR_FIELDS,
    "pd": PD_FIELDS,
    "ctx": CTX_FIELDS,
    "srq": SRQ_FIELDS,
}


def count_field(name: str) -> render.Field:
    # A count the kernel does not give is unknown, never 0.
    return render.Field(name, lambda s: s[2].get(name), header=name.upper(), always=True)


SUMMARY_FIELDS = [
    render.Field("ifindex", lambda s: s[1], in_text=False),
    render.Field("ifname", lambda s: s[0], header="DEV"),
    # then one key per resource type the kernel counts, in its order (nldev.c fill_res_info)
    *(count_field(name) for name in ("pd", "cq", "qp", "cm_id", "mr", "ctx", "srq")),
]
# Types the summary gained after the others, and from which release (nldev.c fill_res_info
# names "srq" since the change that added RDMA_NLDEV_CMD_RES_SRQ_GET).
COUNTED_SINCE = {"srq": ("SRQs are counted", "5.13")}


def port_space(value) -> str:
    # rdma prints "---" for a port space it has no name for
    return value.label if hasattr(value, "label") else "---"


def _qpn_words(ranges) -> list[str]:
    return [str(a) if a == b else f"{a}-{b}" for a, b in ranges]
