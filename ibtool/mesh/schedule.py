"""Who pings whom, round by round: mpiGraph's shifted rounds, per group of endpoints.

Endpoints are grouped by rail (rail k of every node pings only rail k of the others, which is
how an 8-rail fabric is cabled: one switch plane a rail), or all in one group with
--all-rails. In a group of n endpoints, shift s (1 <= s < n) pairs endpoint i with endpoint
(i + s) mod n: in every round each endpoint is the client of exactly one pair and the server
of exactly one, so the load on an endpoint does not grow with n. The n - 1 shifts together
probe every ordered pair once (all pairs); --rounds K runs K of them, spread evenly, for the
largest meshes (every endpoint still meets K partners, so a bad endpoint still stands out, but
a bad path is seen only if its pair is among them). Groups run side by side: round r runs the
r-th shift of every group.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from functools import cached_property

from ibtool.model.deferred import dataclass
from ibtool.model.mesh import Endpoint


def group_name(rail: int | None) -> str:
    return "all rails" if rail is None else f"rail {rail}"


def spread(n: int, rounds: int | None) -> list[int]:
    """The shifts of a group of n endpoints: 1..n-1, or `rounds` of them spread evenly."""
    if n < 2:
        return []
    every = n - 1
    if rounds is None or rounds >= every:
        return list(range(1, n))
    return sorted({1 + (k * every) // rounds for k in range(rounds)})


@dataclass(frozen=True)
class Schedule:
    """The groups (endpoint indices in mesh order) and each one's shifts."""

    groups: dict[str, tuple[int, ...]]
    shifts: dict[str, tuple[int, ...]]

    @property
    def rounds(self) -> int:
        return max((len(s) for s in self.shifts.values()), default=0)

    def pairs(self, round_: int) -> list[tuple[int, int]]:
        """(source, destination) of every pair of a round."""
        out = []
        for name, members in self.groups.items():
            shifts = self.shifts[name]
            if round_ < len(shifts):
                s, n = shifts[round_], len(members)
                out += [(members[i], members[(i + s) % n]) for i in range(n)]
        return out

    def partner(self, round_: int, src: int) -> int | None:
        """The endpoint `src` pings in a round, or None."""
        dests = self.partners(src)
        return dests[round_] if round_ < len(dests) else None

    def partners(self, src: int) -> list[int]:
        """`src`'s destination in each round its group runs (none after them)."""
        where = self._where.get(src)
        if where is None:
            return []
        name, pos = where
        members = self.groups[name]
        return [members[(pos + s) % len(members)] for s in self.shifts[name]]

    def whole(self, name: str) -> bool:
        """Whether group `name` runs every shift: each member meets every other."""
        return len(self.shifts[name]) >= len(self.groups[name]) - 1

    def to_wire(self, names: Iterable[str] | None = None) -> dict:
        """The schedule as a plan carries it: every group, or those `names`."""
        names = self.groups if names is None else names
        return {
            "groups": {k: list(self.groups[k]) for k in names},
            "shifts": {k: list(self.shifts[k]) for k in names},
        }

    @cached_property
    def _where(self) -> dict[int, tuple[str, int]]:
        """Each endpoint's group and place in it (its first, should a plan name it twice)."""
        where: dict[int, tuple[str, int]] = {}
        for name, members in self.groups.items():
            for pos, m in enumerate(members):
                where.setdefault(m, (name, pos))
        return where

    def group_of(self, i: int) -> str | None:
        where = self._where.get(i)
        return None if where is None else where[0]

    def met(self, own: Iterable[int]) -> set[int]:
        """The endpoints `own` meet in the rounds, themselves too: whom they ping and who
        pings them (an agent's slice of the plan: the addresses it pings and admits)."""
        out: set[int] = set()
        for i in own:
            out.add(i)
            where = self._where.get(i)
            if where is None:
                continue
            name, pos = where
            members, shifts = self.groups[name], self.shifts[name]
            n = len(members)
            if self.whole(name):
                out.update(members)
                continue
            for s in shifts:
                out.add(members[(pos + s) % n])
                out.add(members[(pos - s) % n])
        return out


def plan(endpoints: Sequence[Endpoint], all_rails: bool, rounds: int | None) -> Schedule:
    """The schedule of a mesh over `endpoints` (their order is the mesh's)."""
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(endpoints):
        groups.setdefault(group_name(None if all_rails else e.rail), []).append(i)
    ordered = dict(sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])))
    return Schedule(
        {k: tuple(v) for k, v in ordered.items()},
        {k: tuple(spread(len(v), rounds)) for k, v in ordered.items()},
    )


class Partners:
    """`Schedule.partner` for every (round, source) at once: index lookups, not searches
    (the coordinator asks it for every pair of a 1,024 x 8 mesh)."""

    def __init__(self, schedule: Schedule, width: int):
        self.rounds = schedule.rounds
        self.width = width
        self.table = array("i", [-1]) * (self.rounds * width)  # 4 bytes a pair, not 8
        self.inverse = array("i", [-1]) * (self.rounds * width)
        for name, members in schedule.groups.items():
            n = len(members)
            for r, s in enumerate(schedule.shifts[name]):
                base = r * width
                for i, src in enumerate(members):
                    dst = members[(i + s) % n]
                    self.table[base + src] = dst
                    self.inverse[base + dst] = src

    def of(self, round_: int, src: int) -> int:
        """Whom `src` pings in a round; -1: nobody."""
        return self.table[round_ * self.width + src]

    def by(self, round_: int, dst: int) -> int:
        """Who pings `dst` in a round; -1: nobody."""
        return self.inverse[round_ * self.width + dst]
