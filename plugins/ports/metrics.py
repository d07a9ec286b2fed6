"""The ports as Prometheus metrics: state, physical state, rate, LID, link layer and netdev."""

from __future__ import annotations

from ibtool.api import PORT_SHOWN, Host, LinkLayer, MetricFamily


def port_metrics(host: Host):
    labels_of = lambda p: {"device": p.device, "port": str(p.port)}  # noqa: E731
    state = MetricFamily("ibtool_port_state_id", "Port state (IBTA: 1 DOWN .. 4 ACTIVE)", "gauge")
    phys = MetricFamily(
        "ibtool_port_physical_state_id", "Physical port state (IBTA: 5 LinkUp)", "gauge"
    )
    rate = MetricFamily("ibtool_port_rate", "Port signalling rate", "gauge", "bytes_per_second")
    lid = MetricFamily("ibtool_port_lid", "LID of an InfiniBand port (0: none)", "gauge")
    info = MetricFamily("ibtool_port_info", "Port link layer and netdev (value 1)", "gauge")
    for p in host.ports(fields=PORT_SHOWN):
        labels = labels_of(p)
        if p.state is not None:
            state.add(labels, int(p.state))
        if p.physical_state is not None:
            phys.add(labels, int(p.physical_state))
        if p.rate is not None:
            rate.add(labels, p.rate.gbps * 1e9 / 8)
        if p.link_layer == LinkLayer.INFINIBAND and p.lid is not None:
            lid.add(labels, p.lid)
        link_layer = p.link_layer.label if p.link_layer is not None else ""
        info.add({**labels, "link_layer": link_layer, "netdev": p.netdev or ""}, 1)
    return [state, phys, rate, lid, info]
