"""all_to_all as a whole: what the members send must be what they receive.

Takes `Facts`; returns `size_mismatch` findings, one per group: its first all_to_all
that every member issued alike (no other disagreement) whose exchange does not add up.
Uneven splits are how MoE works, so no member's sizes are held against another's; the
group as a whole is checked instead:

- with per-peer counts, pair by pair: what member i sends to member j is what j takes
  from i. The counts come from the dump format 2.11 fields (`input_split_sizes`,
  `output_split_sizes`, elements per member in group order), or from a list-form
  `all_to_all`, whose k-th tensor goes to (comes from) member k. The mismatched pairs
  are named; a member in every one of them is the suspect, else both ends of each;
- without them, in total: the elements all members send against those all receive.
  A difference shows some member's splits are wrong but not whose: every member is
  named (a tie).

Only groups whose members the dumps list (pg_config, or the whole world with no dump
missing) are checked: a member nobody knows of would make the totals differ.
"""

from __future__ import annotations

import operator
from functools import partial
from itertools import compress, count, repeat
from typing import Any, NamedTuple, Optional, Sequence

from frtrace.diagnosis.facts import Facts, new_finding, oldest_created
from frtrace.diagnosis.finding import Finding
from frtrace.diagnosis.side_by_side import by_views
from frtrace.match.matcher import CollectiveMatch, GroupView
from frtrace.model import Shapes, numel
from frtrace.table.entry_table import StaticRow
from frtrace.table.seq_map import NOT_SINGLE, BatchKey
from frtrace.wording import group_text, ranks_text

A2A_OPS = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_to_all_v_single"})
_LIST_FORM_OPS = frozenset({"all_to_all", "alltoall"})


class _Sizes:
    """What one member's all_to_all entry says it moves: totals, and per peer if known."""

    __slots__ = ("sent", "received", "to_each", "from_each")

    def __init__(self, shapes: Shapes, op: str, members: int) -> None:
        self.sent, self.received = numel(shapes.input_sizes), numel(shapes.output_sizes)
        self.to_each: Optional[tuple[int, ...]] = None
        self.from_each: Optional[tuple[int, ...]] = None
        if len(shapes.input_split_sizes) == members and len(shapes.output_split_sizes) == members:
            self.to_each, self.from_each = shapes.input_split_sizes, shapes.output_split_sizes
        elif op in _LIST_FORM_OPS and len(shapes.input_sizes) == members == len(shapes.output_sizes) and members > 1:
            self.to_each = tuple(numel((shape,)) for shape in shapes.input_sizes)
            self.from_each = tuple(numel((shape,)) for shape in shapes.output_sizes)


def exchange_mismatches(facts: Facts, processes: int = 1) -> list[Finding]:
    """The rule (see module docstring). With `processes` above 1 the groups are judged in
    shares at once, each other than the first in a forked child (`side_by_side.by_views`):
    the same findings, in the same order."""
    layout = facts.analysis.layout
    # The groups each rank's table holds an all_to_all of (a look at its few static rows
    # spares the rest of the rule most groups).
    holding = {dump.rank: {static.pg_name for static in dump.entries.statics_in_use() if static.name.op in A2A_OPS}
               for dump in facts.seen}
    views = [view for view in facts.device.views if _may_hold_one(view, layout.ranks_missing, holding)]
    return [finding for part in by_views(partial(_mismatches_in, facts), views, processes) for finding in part]


def _mismatches_in(facts: Facts, views: Sequence[GroupView]) -> list[Finding]:
    """The finding of each of `views` whose exchanges do not add up, in their order."""
    findings = []
    for view in views:
        group = view.group
        seqs = _to_judge(view)
        matches = [m for m in map(facts.index.at.get, ((group.id, seq) for seq in seqs))
                   if m is not None and _whole(m, group.size)]
        finding = _first_mismatch(view, matches, facts.reliable) if matches else None
        if finding is not None:
            findings.append(finding)
    return findings


def _may_hold_one(view: GroupView, ranks_missing: tuple[int, ...], holding: dict[int, set[str]]) -> bool:
    """Whether the group's exchanges can be judged: two members or more, all known and
    dumped, and some member's table holds an all_to_all of it (`holding`)."""
    group = view.group
    if group.size < 2 or view.no_dump or not _members_known(group.membership_source, ranks_missing):
        return False
    return any(group.name in holding.get(rank, ()) for rank in group.ranks)


class _Exchange(NamedTuple):
    """What one entry's static part says of an all_to_all of the group: elements it sends
    minus those it receives, 1 if it is one, 1 if it says what it moves per peer."""

    balance: int
    is_one: int
    per_peer: int


_NOT_ONE = _Exchange(0, 0, 0)
_BALANCE, _IS_ONE, _PER_PEER = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


def _exchanges_of(view: GroupView, rank: int) -> Optional[tuple[Sequence[int], list[_Exchange]]]:
    """The member's collectives of the group (their sequence numbers) and what each says of
    its exchange; None when it holds no all_to_all of the group (as a rule: a look at its
    few static rows)."""
    collectives = view.streams[rank].collectives
    table = collectives.table
    group, members = view.group.name, view.group.size
    if not any(static.pg_name == group and static.name.op in A2A_OPS for static in table.statics_in_use()):
        return None

    def judge(static: StaticRow) -> _Exchange:
        op, shapes = static.name.op, static.shapes
        if static.pg_name != group or op not in A2A_OPS or not shapes.readable:
            return _NOT_ONE
        sizes = _Sizes(shapes, op, members)
        return _Exchange(sizes.sent - sizes.received, 1, 1 if sizes.to_each is not None else 0)

    seqs, rows = collectives.numbered_rows()
    return seqs, table.static_answers(judge, rows)


def _to_judge(view: GroupView) -> list[int]:
    """The numbers where every member holds an all_to_all of the group and their elements
    sent and received differ in total, and those where some member says what it moves per
    peer: sorted. Read a column at a time, in C: a member's rows of the group map to their
    codes, the codes to their balances. The members' numbers mostly line up (their
    windows differ at the old end at most): each is added to the longest as a slice."""
    held, per_peer = _held_exchanges(view)
    if not held:
        return []
    other = _totals(held)
    size = view.group.size
    return sorted({seq for seq, (balance, members) in other.items() if balance and members == size} | per_peer)


def _held_exchanges(view: GroupView) -> tuple[list[tuple[list[int], list[int]]], set[int]]:
    """([(numbers, balances) of the all_to_alls of each member that holds some], the
    numbers where some member says what it moves per peer)."""
    held: list[tuple[list[int], list[int]]] = []
    per_peer: set[int] = set()
    for rank in view.group.ranks:
        exchanges = _exchanges_of(view, rank)
        if exchanges is None:
            continue
        seqs, answers = exchanges
        ones = list(map(_IS_ONE, answers))
        held.append((list(compress(seqs, ones)), list(map(_BALANCE, compress(answers, ones)))))
        per_peer.update(compress(seqs, map(_PER_PEER, answers)))
    return held, per_peer


def _totals(held: list[tuple[list[int], list[int]]]) -> dict[int, list[int]]:
    """seq -> [balance, members] summed over the members in `held`, for the numbers whose
    balance is not zero or that some member's run does not line up with."""
    numbers = max((seqs for seqs, _ in held), key=len)
    at = dict(zip(numbers, count()))
    balances, counts = [0] * len(numbers), [0] * len(numbers)
    other: dict[int, list[int]] = {}  # seq -> [balance, members]: what does not line up
    for seqs, mine in held:
        first, last = at.get(seqs[0]) if seqs else None, at.get(seqs[-1]) if seqs else None
        if (first is not None and last is not None and last - first == len(seqs) - 1
                and numbers[first:last + 1] == seqs):  # a run of the longest: added as a slice
            start, end = first, last + 1
            balances[start:end] = map(operator.add, balances[start:end], mine)
            counts[start:end] = map(operator.add, counts[start:end], repeat(1, len(seqs)))
        else:
            for seq, balance in zip(seqs, mine):
                tally = other.setdefault(seq, [0, 0])
                tally[0] += balance
                tally[1] += 1
    touched = set(compress(range(len(numbers)), balances)) | {at[seq] for seq in other if seq in at}
    for k in touched:
        tally = other.setdefault(numbers[k], [0, 0])
        tally[0] += balances[k]
        tally[1] += counts[k]
    return other


def _members_known(source: str, ranks_missing: tuple[int, ...]) -> bool:
    return source == "pg_config" or (source == "world" and not ranks_missing)


def _whole(match: CollectiveMatch, size: int) -> bool:
    """Every member issued it, and alike (a disagreement is the divergence rule's)."""
    return (match.disagreement is None and len(match.calls) == size and not match.not_issued
            and not match.out_of_window and not match.no_dump)


def _first_mismatch(view: GroupView, candidates: list[CollectiveMatch], reliable: bool) -> Optional[Finding]:
    """The first of `candidates` (all_to_alls every member issued) whose exchange does not
    add up and that some member has not completed; else the first that every member
    completed, as a warning (see `_mismatch`). Each member's key (op, shapes, state) at
    each number is read off its codes."""
    members = view.group.ranks
    completed_first: Optional[Finding] = None
    sizes_of: dict[tuple[int, int], Optional[_Sizes]] = {}  # (id of name, id of shapes) -> sizes
    seqs = [m.seq for m in candidates]
    keys_of = [view.streams[rank].collectives.keys_at(seqs) for rank in members]
    for position, match in enumerate(candidates):
        sizes = [_sizes_of(keys[position], len(members), sizes_of) for keys in keys_of]
        if any(s is None for s in sizes):
            continue  # not an all_to_all of one entry on every member, or unreadable
        completed = reliable and len(match.completed_ranks) == len(members)
        if completed and completed_first is not None:
            continue  # one such warning is enough; an op some member has not completed may follow
        found = _judge(view, match, [s for s in sizes if s is not None], completed)
        if found is not None and not completed:
            return found
        completed_first = completed_first or found
    return completed_first


def _sizes_of(key: Any, members: int, cache: dict[tuple[int, int], Optional[_Sizes]]) -> Optional[_Sizes]:
    if key is NOT_SINGLE or isinstance(key, BatchKey):
        return None
    name, shapes = key[0], key[1]
    cache_key = (id(name), id(shapes))
    if cache_key not in cache:
        usable = name.op in A2A_OPS and shapes.readable
        cache[cache_key] = _Sizes(shapes, name.op, members) if usable else None
    return cache[cache_key]


def _judge(view: GroupView, match: CollectiveMatch, sizes: list[_Sizes], completed: bool) -> Optional[Finding]:
    members = view.group.ranks
    if all(s.to_each is not None for s in sizes):
        sent = [s.to_each for s in sizes]
        taken = list(zip(*(s.from_each for s in sizes)))  # taken[i][j]: what j takes from i
        bad = [(members[i], members[j], sent[i][j], taken[i][j])  # type: ignore[index]
               for i in range(len(members)) if sent[i] != taken[i] for j in range(len(members))
               if sent[i][j] != taken[i][j]]  # type: ignore[index]
        return _pairs_finding(view, match, bad, completed) if bad else None
    total_sent, total_taken = sum(s.sent for s in sizes), sum(s.received for s in sizes)
    if total_sent == total_taken:
        return None
    entry = match.first_entry
    message = (f"{entry.op} #{match.seq} in {group_text(view.group.name, view.group.desc)}: the members send "
               f"{total_sent} elements in all but receive {total_taken}: some member's split sizes do not match "
               f"its peers' (without per-peer split sizes the dumps cannot say whose)")
    evidence: dict[str, Any] = {"total_sent": total_sent, "total_received": total_taken, "tie": True,
                                "sent": {str(r): s.sent for r, s in zip(members, sizes)},
                                "received": {str(r): s.received for r, s in zip(members, sizes)}}
    return _mismatch("all_to_all.totals", view, match, members, message, evidence, completed)


def _pairs_finding(view: GroupView, match: CollectiveMatch, bad: list[tuple[int, int, int, int]],
                   completed: bool) -> Finding:
    """Mismatched (sender, receiver, sent, taken) pairs: the member in every one of them is
    the suspect (its splits disagree with each peer's), else both ends of each."""
    in_all = set.intersection(*({src, dst} for src, dst, _, _ in bad))
    suspects = tuple(sorted(in_all)) if len(bad) > 1 and len(in_all) == 1 else tuple(sorted({r for p in bad for r in p[:2]}))
    entry = match.first_entry
    shown = "; ".join(f"rank {src} sends rank {dst} {sent} elements, rank {dst} takes {taken} from it"
                      for src, dst, sent, taken in bad[:4])
    more = f" (+{len(bad) - 4} more pairs)" if len(bad) > 4 else ""
    message = (f"all_to_all split mismatch at {entry.op} #{match.seq} in {group_text(view.group.name, view.group.desc)}"
               f": {shown}{more}" + (f"; {ranks_text(suspects)} disagrees with every peer it exchanges with"
                                      if len(suspects) == 1 else ""))
    evidence: dict[str, Any] = {"pairs": [{"src": src, "dst": dst, "sent": sent, "received": taken}
                                          for src, dst, sent, taken in bad], "tie": len(suspects) > 1}
    return _mismatch("all_to_all.split_pairs", view, match, suspects, message, evidence, completed)


def _mismatch(rule: str, view: GroupView, match: CollectiveMatch, suspects: tuple[int, ...], message: str,
              evidence: dict[str, Any], completed: bool) -> Finding:
    """The rule's finding. Where every member `completed` the all_to_all (in dumps that say
    when ops finish) the job went on past it: it holds nobody up and names no suspect, a
    warning (the sizes are what they are) that leaves a job with nothing else wrong
    inconclusive. A rank that left out an earlier all_to_all of the group makes such a
    mismatch too (its sizes are its peers' next ones), and is named where the members do
    block."""
    if completed:
        message += "; every member completed it and went on, so it holds no rank up"
        evidence.pop("tie")
        evidence["completed_by_all"] = True
        evidence["next_step"] = ("compare the split sizes rank(s) {suspects} passed to this all_to_all (what they send "
                                 "in all must be what they receive) and look for an earlier all_to_all one of them left out")
    return new_finding("size_mismatch", rule, view, op=match.first_entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
                       ranks=view.group.ranks, suspect_ranks=() if completed else suspects, message=message,
                       evidence=evidence, waiting_ranks=_waiting(match), age_ns=oldest_created(match),
                       severity="warning" if completed else None)


def _waiting(match: CollectiveMatch) -> tuple[int, ...]:
    completed = set(match.completed_ranks)
    return tuple(rank for rank in match.issued if rank not in completed)


def absorb_stuck(findings: list[Finding]) -> list[Finding]:
    """`findings` without the `stuck` (or `in_flight`) finding of an all_to_all this rule
    found mismatched: its members are stuck in it because of the mismatch, which names the
    suspects (the stuck ranks go into its evidence)."""
    mismatched = {(f.group_id, f.collective_seq_id): f for f in findings if f.rule.startswith("all_to_all.")}
    if not mismatched:
        return findings
    kept = []
    for finding in findings:
        held_up = finding.kind in ("stuck", "in_flight")
        root = mismatched.get((finding.group_id, finding.collective_seq_id)) if held_up else None
        if root is None:
            kept.append(finding)
        else:
            root.facts["stuck_ranks"] = list(finding.ranks)
    return kept
