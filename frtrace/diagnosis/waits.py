"""Who waits on whom: the ranks each blocked rank needs before its op can finish.

Takes the device view (`Facts`' matches, and the op each rank is blocked in); returns a `Waits`: per blocked rank,
the ranks it waits on, and the P2P cycles nothing outside them holds up.

A rank blocked in a collective waits on the members that never issued it. A rank blocked
in a send or recv (or a batch of them) waits on the other end of each of its unfinished
ops: on a rank that never posted the partner op, or on one that posted it and is itself
held up (the partner's op, or another op of its batch, has not finished). A P2P end that
never posted because it waits elsewhere is an effect, and these links let the diagnosis
follow it to the cause. Ranks that finished everything, or left no dump, wait on nobody.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Iterable, Optional

from frtrace.match.matcher import MatchResult, P2PMatch
from frtrace.model import Entry
from frtrace.table.entry_table import EntryTable
from frtrace.table.seq_map import row_completed
from frtrace.util import strong_components

# A channel's plain pairs, then its batched ones: each run in channel order.
_CHANNEL = attrgetter("src", "dst", "batched")


@dataclass(slots=True)
class PostedPair:
    """A send and its recv, both posted, neither finished: their ranks wait on each other."""

    pair: P2PMatch
    age_ns: int  # the older end's creation time


@dataclass(slots=True)
class Waits:
    on: dict[int, frozenset[int]]  # blocked rank -> the ranks it waits on
    # rank -> the posted pairs it is an end of, still unfinished
    posted: dict[int, list[PostedPair]] = field(default_factory=dict)

    def closure(self, ranks: Iterable[int]) -> set[int]:
        """Every rank that `ranks` wait on, directly or through others (not `ranks`
        themselves, unless they wait on each other)."""
        seen: set[int] = set()
        todo = [r for rank in ranks for r in self.on.get(rank, ())]
        while todo:
            rank = todo.pop()
            if rank not in seen:
                seen.add(rank)
                todo.extend(self.on.get(rank, ()))
        return seen

    def layers(self, rank: int) -> Iterable[list[int]]:
        """The ranks `rank` waits on, nearest first: those it waits on itself, then the
        ones those wait on, and so on (each rank once)."""
        seen = {rank}
        layer = sorted(self.on.get(rank, ()))
        while layer:
            layer = [r for r in layer if r not in seen]
            seen.update(layer)
            if layer:
                yield layer
            layer = sorted({n for r in layer for n in self.on.get(r, ())} - seen)

    def closed_cycles(self) -> list[list[int]]:
        """Sets of ranks blocked in posted P2P pairs with each other that wait on nobody
        outside the set: nothing else holds them up (a mismatched pair, a link or device
        that stopped, or ops still running when the job was dumped). Sorted lists."""
        cycles = []
        for component in strong_components({r: self.on.get(r, frozenset()) for r in self.posted}):
            if len(component) < 2:
                continue
            inside = set(component)
            if all(self.on.get(r, frozenset()) <= inside and r in self.posted for r in component):
                cycles.append(sorted(component))
        return sorted(cycles)


def waits_of(blocked: dict[int, Entry], matches: MatchResult, reliable: bool) -> Waits:
    """The waits of the ranks of the device view blocked in an op (`blocked`: rank -> its
    entry of that op, `Facts.blocked_entry`) as `matches` paired their ops."""
    if not reliable:  # without completion states nothing tells waiting from done
        return Waits({})
    on: dict[int, set[int]] = defaultdict(set)
    blocked_p2p: dict[int, str] = {}  # rank -> group name of the P2P op it is blocked in
    layout, index = matches.layout, matches.index
    for rank, entry in blocked.items():
        if entry.is_p2p:
            blocked_p2p[rank] = entry.pg_name
            continue
        group_id = layout.group_of(entry.pg_name, rank)
        match = index.at.get((group_id, entry.collective_seq_id)) if group_id is not None else None
        if match is not None:
            on[rank].update(match.not_issued, match.no_dump)
    posted: dict[int, list[PostedPair]] = defaultdict(list)
    if blocked_p2p:
        groups = {layout.group_of(name, rank) for rank, name in blocked_p2p.items()}
        for view in matches.views:
            if view.group.id in groups:
                _p2p_waits(index.p2p_of.get(view.group.id, []), blocked_p2p, view.group.name, on, posted)
    return Waits({rank: frozenset(ranks - {rank}) for rank, ranks in on.items()}, dict(posted))


def _p2p_waits(pairs: list[P2PMatch], blocked: dict[int, str], group_name: str,
               on: dict[int, set[int]], posted: dict[int, list[PostedPair]]) -> None:
    """Add the waits of the ranks blocked in this group's sends and recvs. A channel's ops
    finish in order (its plain ones and its batched ones each), so only the newest pairs
    of each are read, back to one both ends finished."""
    for _, channel in groupby(pairs, key=_CHANNEL):
        for pair in reversed(list(channel)):
            if not _pair_waits(pair, blocked, group_name, on, posted):
                break  # finished: so are the older ones


def _pair_waits(pair: P2PMatch, blocked: dict[int, str], group_name: str,
                on: dict[int, set[int]], posted: dict[int, list[PostedPair]]) -> bool:
    """Add the waits of the ends of one pair blocked in it; False when both ends finished."""
    send_open = _open(pair.send_table, pair.send_row)
    recv_open = _open(pair.recv_table, pair.recv_row)
    if not send_open and not recv_open:
        return False
    src_waits = send_open and blocked.get(pair.src) == group_name
    dst_waits = recv_open and blocked.get(pair.dst) == group_name
    # An end whose partner finished its side met it: what holds it is another op of
    # its batch (a batch finishes as a whole), not the partner.
    if src_waits and pair.dst >= 0 and recv_open is not False:
        on[pair.src].add(pair.dst)
    if dst_waits and pair.src >= 0 and send_open is not False:
        on[pair.dst].add(pair.src)
    if src_waits and dst_waits:
        ends = (pair.send, pair.recv)
        found = PostedPair(pair, min(e.time_created_ns for e in ends if e is not None))
        posted[pair.src].append(found)
        posted[pair.dst].append(found)
    return True


def _open(table: Optional[EntryTable], row: int) -> Optional[bool]:
    """Whether a pair's end is posted and unfinished (None: never posted)."""
    if table is None:
        return None
    return not row_completed(table, row)
