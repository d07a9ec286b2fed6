"""Which rail each endpoint is on: what the nodes say, not where a port falls in their order.

A rail is one switch plane: rail k of every node pings rail k of the others. A node's k-th
port (in the kernel's numbering, mlx5_2 before mlx5_10) is the simplest guess, and the one
that fails on a real cluster: a node missing an HCA moves every later port onto the next
rail's partners. Where each rail is a subnet of its own (the usual multi-rail RoCE cabling,
one subnet a plane), the subnet of an endpoint's address says its rail whatever ports the
node has; an operator's map (`--rail mlx5_0=0,mlx5_1=1`, device patterns) says it where
neither does.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
from collections import Counter, defaultdict
from collections.abc import Sequence

from ibtool.model.mesh import Endpoint

RANK, SUBNET, MAP = "rank", "subnet", "map"


def parse_map(text: str) -> tuple[tuple[str, int], ...]:
    """`--rail`: DEV[/PORT]=RAIL,... (DEV a shell pattern); ValueError naming the bad item."""
    out = []
    for item in (x for x in text.split(",") if x):
        pattern, sep, rail = item.partition("=")
        if not sep or not pattern or not rail.isdigit() or int(rail) > 4095:
            raise ValueError(f"{item!r}: not DEV[/PORT]=RAIL (mlx5_0=0, mlx5_*/2=1)")
        out.append((pattern, int(rail)))
    if not out:
        raise ValueError("no DEV=RAIL given")
    return tuple(out)


def _mapped(e: Endpoint, rails: Sequence[tuple[str, int]]) -> int | None:
    for pattern, rail in rails:
        dev, _, port = pattern.partition("/")
        if fnmatch.fnmatchcase(e.device, dev) and (not port or port == str(e.port)):
            return rail
    return None


def _subnet(e: Endpoint, prefix: int | None):
    if not e.address or prefix is None:
        return None
    try:
        return ipaddress.ip_network(f"{e.address}/{prefix}", strict=False)
    except ValueError:
        return None


def assign(
    endpoints: list[Endpoint],
    prefixes: Sequence[int | None],
    rail_map: Sequence[tuple[str, int]] = (),
) -> str:
    """Each endpoint's rail, in place; which rule gave them (RANK, SUBNET or MAP).

    With a map, its rail for every endpoint it matches, the rank for the others. Else by
    subnet when the subnets are rails: two or more of them, every endpoint with an address
    in one, no node with two endpoints in one; an endpoint with no address (a port down)
    takes the rail most nodes' port of its rank is on. Else the rank (as `endpoints` has
    it)."""
    if rail_map:
        for i, e in enumerate(endpoints):
            rail = _mapped(e, rail_map)
            if rail is not None:
                endpoints[i] = dataclasses.replace(e, rail=rail)
        return MAP
    subnets = [_subnet(e, p) for e, p in zip(endpoints, prefixes)]
    known = {s for s in subnets if s is not None}
    if len(known) < 2:
        return RANK
    seen = set()
    for e, s in zip(endpoints, subnets):
        if s is None and e.address:
            return RANK  # an address without its subnet: the subnets cannot be trusted
        if s is not None:
            if (e.node, s) in seen:
                return RANK  # two ports of a node in one subnet: subnets are not rails
            seen.add((e.node, s))
    order = {s: k for k, s in enumerate(sorted(known, key=lambda n: (n.version, n)))}
    by_rank: dict[int, Counter] = defaultdict(Counter)
    for e, s in zip(endpoints, subnets):
        if s is not None:
            by_rank[e.rail][order[s]] += 1
    for i, (e, s) in enumerate(zip(endpoints, subnets)):
        if s is not None:
            rail = order[s]
        elif by_rank.get(e.rail):
            rail = by_rank[e.rail].most_common(1)[0][0]
        else:
            rail = len(order) + e.rail  # a rank no node has an address on: a rail of its own
        endpoints[i] = dataclasses.replace(e, rail=rail)
    return SUBNET
