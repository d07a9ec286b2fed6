"""What each counter means, what usually raises it, how wide it is: one table for every face.

PMA widths and meanings are the IBTA PortCounters and PortCountersExtended attributes as
include/rdma/ib_pma.h lays them out and drivers/infiniband/core/sysfs.c prints them;
hw_counters names are the drivers' (mlx5 Q counters, rxe). Descriptions say what an operator
checks first; they are experience, not specification.
"""

from __future__ import annotations

from collections.abc import Mapping

from ibtool.model.deferred import dataclass


@dataclass(frozen=True)
class CounterInfo:
    kind: str  # "error", "data" (bytes), "packets", "event"
    description: str
    causes: str = ""
    # PMA: bits in PortCounters (PortCountersExtended for the counters only it has); PMA
    # counters saturate at all ones. The data and packet counters are 64 bits wide in the
    # extended tables: see pma_width.
    width: int | None = None


PMA: dict[str, CounterInfo] = {
    "symbol_error": CounterInfo(
        "error",
        "minor link errors detected on any lane",
        "a marginal cable, dirty optics or a failing transceiver",
        16,
    ),
    "link_error_recovery": CounterInfo(
        "error", "link error recoveries that succeeded", "a flapping or marginal link", 8
    ),
    "link_downed": CounterInfo(
        "error",
        "times link error recovery failed and the link went down",
        "cable pulled, switch port reset, failing transceiver",
        8,
    ),
    "port_rcv_errors": CounterInfo(
        "error",
        "received packets with errors",
        "bad CRC from a marginal link; look at symbol_error too",
        16,
    ),
    "port_rcv_remote_physical_errors": CounterInfo(
        "error",
        "received packets marked bad (EBP) by an upstream hop",
        "a bad link elsewhere in the fabric, not this one",
        16,
    ),
    "port_rcv_switch_relay_errors": CounterInfo(
        "error", "packets a switch could not forward", "routing holes (switch ports only)", 16
    ),
    "port_xmit_discards": CounterInfo(
        "error", "outbound packets discarded", "port down or congestion (head-of-line timeouts)", 16
    ),
    "port_xmit_constraint_errors": CounterInfo(
        "error",
        "packets not sent because of partition or raw filtering",
        "P_Key mismatch with the peer",
        8,
    ),
    "port_rcv_constraint_errors": CounterInfo(
        "error",
        "packets dropped on receive by partition or raw filtering",
        "P_Key mismatch with the sender",
        8,
    ),
    "local_link_integrity_errors": CounterInfo(
        "error",
        "times local physical errors exceeded the LocalPhyErrors threshold",
        "a marginal link",
        4,
    ),
    "excessive_buffer_overrun_errors": CounterInfo(
        "error",
        "consecutive flow-control update periods with buffer overrun",
        "credit mismatch with the peer: firmware or configuration",
        4,
    ),
    "VL15_dropped": CounterInfo(
        "error",
        "incoming subnet management packets (VL15) dropped",
        "SM traffic storms or a busy management agent",
        16,
    ),
    "port_xmit_data": CounterInfo("data", "bytes sent (the PMA counts 4-octet words)", "", 32),
    "port_rcv_data": CounterInfo("data", "bytes received (the PMA counts 4-octet words)", "", 32),
    "port_xmit_packets": CounterInfo("packets", "packets sent, errors included", "", 32),
    "port_rcv_packets": CounterInfo("packets", "packets received, errors included", "", 32),
    "port_xmit_wait": CounterInfo(
        "event",
        "ticks with data to send but no credit to send it",
        "congestion: a slow receiver or an oversubscribed switch path",
        32,
    ),
    "unicast_xmit_packets": CounterInfo("packets", "unicast packets sent", "", 64),
    "unicast_rcv_packets": CounterInfo("packets", "unicast packets received", "", 64),
    "multicast_xmit_packets": CounterInfo("packets", "multicast packets sent", "", 64),
    "multicast_rcv_packets": CounterInfo("packets", "multicast packets received", "", 64),
}

# The data and packet counters: 32 bits in PortCounters, 64 in PortCountersExtended. sysfs.c
# picks one table per port from the PMA's ClassPortInfo (get_counter_table): pma_group (all
# 32-bit), pma_group_ext (IB_PMA_CLASS_CAP_EXT_WIDTH: 64-bit, and the unicast/multicast
# counters) or pma_group_noietf (IB_PMA_CLASS_CAP_EXT_WIDTH_NOIETF: 64-bit, no unicast/multicast).
PMA_EXTENDED = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
_U32_MAX = (1 << 32) - 1

# counters_ext/ of kernels before 4.5 with Mellanox OFED (mainline sysfs.c had the 32-bit table
# only; prometheus/procfs reads these names as its "legacy" counters): the 64-bit counters under
# names of their own, shown under the names counters/ has for them since 4.5.
COUNTERS_EXT = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}

HW: dict[str, CounterInfo] = {
    # mlx5 Q counters (32-bit in hardware: they wrap)
    "out_of_buffer": CounterInfo(
        "error",
        "packets dropped: no receive WQE posted",
        "the application posts receives too slowly (RNR on RC)",
    ),
    "out_of_sequence": CounterInfo(
        "error", "packets received out of sequence", "packet loss on a lossy (non-PFC) RoCE fabric"
    ),
    "duplicate_request": CounterInfo(
        "error", "duplicate requests received", "retransmissions after lost ACKs"
    ),
    "rnr_nak_retry_err": CounterInfo(
        "error", "RNR NAKs whose retries ran out", "a peer that does not post receives in time"
    ),
    "packet_seq_err": CounterInfo("error", "sequence-error NAKs received", "packet loss"),
    "implied_nak_seq_err": CounterInfo("error", "implied NAK sequence errors", "packet loss"),
    "local_ack_timeout_err": CounterInfo(
        "error",
        "ACK timeouts on the requester side",
        "packet loss, a dead peer, or a timeout set too short",
    ),
    "resp_local_length_error": CounterInfo(
        "error", "responder local length errors", "receive buffers smaller than the messages"
    ),
    "resp_cqe_error": CounterInfo("error", "responder completions with error", ""),
    "req_cqe_error": CounterInfo("error", "requester completions with error", ""),
    "req_remote_invalid_request": CounterInfo(
        "error", "remote invalid request errors", "missing access flags or rd_atomic 0"
    ),
    "req_remote_access_errors": CounterInfo(
        "error", "remote access errors", "bad rkey or address out of the remote MR"
    ),
    "resp_remote_access_errors": CounterInfo("error", "remote access errors as responder", ""),
    "resp_cqe_flush_error": CounterInfo(
        "error", "responder flushed completions", "QPs moved to error (usually after another error)"
    ),
    "req_cqe_flush_error": CounterInfo(
        "error", "requester flushed completions", "QPs moved to error (usually after another error)"
    ),
    "req_transport_retries_exceeded": CounterInfo(
        "error", "transport retries exhausted", "packet loss or a dead peer"
    ),
    "req_rnr_retries_exceeded": CounterInfo(
        "error", "RNR retries exhausted", "a peer that does not post receives"
    ),
    "rx_write_requests": CounterInfo("packets", "RDMA WRITE requests received"),
    "rx_read_requests": CounterInfo("packets", "RDMA READ requests received"),
    "rx_atomic_requests": CounterInfo("packets", "atomic requests received"),
    "np_cnp_sent": CounterInfo(
        "event",
        "congestion notification packets sent (ECN seen)",
        "congestion on the path to this host",
    ),
    "rp_cnp_handled": CounterInfo(
        "event", "congestion notification packets handled", "congestion on the path from this host"
    ),
    "np_ecn_marked_roce_packets": CounterInfo(
        "event", "ECN-marked RoCE packets received", "congestion on the path to this host"
    ),
    # rxe (Soft-RoCE)
    "sent_pkts": CounterInfo("packets", "packets sent"),
    "rcvd_pkts": CounterInfo("packets", "packets received"),
    "rdma_sends": CounterInfo("packets", "RDMA requests sent"),
    "rdma_recvs": CounterInfo("packets", "RDMA requests received"),
    "out_of_seq_request": CounterInfo(
        "error", "out-of-sequence requests received", "packet loss on the Ethernet path"
    ),
    "rcvd_rnr_err": CounterInfo("error", "RNR NAKs received", "the peer had no receive posted"),
    "send_rnr_err": CounterInfo("error", "RNR NAKs sent", "this host had no receive posted"),
    "rcvd_seq_err": CounterInfo("error", "sequence-error NAKs received", "packet loss"),
    "ack_deferred": CounterInfo("event", "ACKs deferred by the responder", ""),
    "retry_exceeded_err": CounterInfo(
        "error", "transport retries exhausted", "packet loss or a dead peer"
    ),
    "retry_rnr_exceeded_err": CounterInfo(
        "error", "RNR retries exhausted", "a peer that does not post receives"
    ),
    "completer_retry_err": CounterInfo(
        "error",
        "requester retransmissions (completer retries)",
        "packet loss or delay: netem, congestion",
    ),
    "send_err": CounterInfo("error", "send errors", "the netdev refused packets (link down)"),
}

# mlx5 Q counters are 32-bit in hardware and zero-extended: deltas are taken modulo 2^32.
WRAPS_AT_32 = frozenset(
    {
        "out_of_buffer",
        "out_of_sequence",
        "duplicate_request",
        "rnr_nak_retry_err",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        "rx_write_requests",
        "rx_read_requests",
        "rx_atomic_requests",
        "resp_local_length_error",
        "resp_cqe_error",
        "req_cqe_error",
        "req_remote_invalid_request",
        "req_remote_access_errors",
        "resp_remote_access_errors",
        "resp_cqe_flush_error",
        "req_cqe_flush_error",
    }
)


# A port's throughput, per direction: the first of these counters the port has. The PMA data
# counters count octets / 4 (CounterSample.scale makes them bytes); rxe counts packets only
# (drivers/infiniband/sw/rxe/rxe_hw_counters.c), efa and bnxt_re have their own byte counters.
TRAFFIC: dict[str, tuple[tuple[str, str], ...]] = {
    "tx_bytes": (("pma", "port_xmit_data"), ("hw", "tx_bytes")),
    "rx_bytes": (("pma", "port_rcv_data"), ("hw", "rx_bytes")),
    "tx_packets": (("pma", "port_xmit_packets"), ("hw", "sent_pkts"), ("hw", "tx_pkts")),
    "rx_packets": (("pma", "port_rcv_packets"), ("hw", "rcvd_pkts"), ("hw", "rx_pkts")),
}


def info(name: str, source: str) -> CounterInfo | None:
    return (PMA if source == "pma" else HW).get(name) or PMA.get(name) or HW.get(name)


def is_error(name: str, source: str) -> bool:
    i = info(name, source)
    if i is not None:
        return i.kind == "error"
    return any(word in name for word in ("err", "drop", "discard", "timeout", "retry"))


def pma_table_is_wide(values: Mapping[str, int | None]) -> bool:
    """Whether a port's counters/ (name -> value) is one of the 64-bit tables: the one with the
    unicast counters, or one whose data or packet counter is above 2^32-1, which no 32-bit
    counter can be (pma_group_noietf has nothing else to tell it by)."""
    return "unicast_xmit_packets" in values or any(
        (values.get(name) or 0) > _U32_MAX for name in PMA_EXTENDED
    )


def pma_width(name: str, wide: bool) -> int | None:
    """Bits of PMA counter `name` in a port's counters/, `wide` as pma_table_is_wide says."""
    if wide and name in PMA_EXTENDED:
        return 64
    i = PMA.get(name)
    return i.width if i is not None else None


def is_saturated(value: int | None, width: int | None) -> bool:
    """At the maximum of its width: a PMA counter stops there until it is cleared."""
    return value is not None and width is not None and value >= (1 << width) - 1


def unit(name: str, source: str) -> str:
    """What a counter counts, as ibtool shows it: bytes, packets, events or count."""
    i = info(name, source)
    return {"data": "bytes", "packets": "packets", "error": "events", "event": "events"}.get(
        i.kind if i else "", "count"
    )
