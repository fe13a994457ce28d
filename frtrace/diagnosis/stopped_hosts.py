"""Which hosts stopped issuing while they waited: a second culprit that looks like a victim.

Takes `Facts` and the linked findings of a job with a fault; returns `not_issued` findings
for ranks whose host stopped issuing (NVRx's LOCK_GIL) while it waited in an op its victims
wait in too. A rank's host runs ahead of its GPU: it enqueues the ops after the one its GPU
waits in, up to its limit. A rank that waits in the like op of ranks with its program
(the ranks in its place in the sibling groups, waiting in the same op of the same number)
yet queued fewer ops after it than most of them, where one of them queued a collective of
a group both are in that it never issued, stopped issuing: in a job that hangs, every host
had the whole timeout to run ahead, and ranks running one program run ahead alike.
"""

from __future__ import annotations

from itertools import islice
from typing import Iterator, Optional

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.match.matcher import CollectiveMatch, GroupView
from frtrace.table.standing import batch_key, queued_behind
from frtrace.wording import group_text

RULE = "stopped_hosts.queued_less_than_like_ranks"
# Like ranks whose queues a rank's is compared with: enough for a majority to mean something.
LIKE_RANKS_ASKED = 8


def hosts_that_stopped(facts: Facts, findings: list[Finding]) -> list[Finding]:
    """The rule: where a root finding shows a fault, each rank not named yet whose host
    queued fewer ops after the op it waits in than most of its like ranks waiting alike
    that no finding names (LIKE_RANKS_ASKED of them, two at least: fewer than their lower
    median), one of which queued a collective of a group both are in that the rank never
    issued (`_queued_what_it_never_issued`). A GPU that stopped leaves its host queueing
    on, which makes one like rank queue more than the rest, not most. One finding per rank."""
    if not facts.reliable or not any(f.severity == "error" and f.suspect_ranks and f.is_root for f in findings):
        return []
    named = {rank for f in findings for rank in f.suspect_ranks}
    queued: dict[int, int] = {}

    def queued_after(rank: int) -> int:
        if rank not in queued:
            dump = facts.whole_dump_of(rank)
            queued[rank] = queued_behind(dump.entries) if dump is not None else 0
        return queued[rank]

    found: list[Finding] = []
    for rank in sorted(facts.blocked_entry):
        if rank in named:
            continue
        alike = list(islice((like for like in _like_ranks_waiting_alike(facts, rank) if like not in named),
                            LIKE_RANKS_ASKED))
        if len(alike) < 2 or queued_after(rank) >= sorted(map(queued_after, alike))[(len(alike) - 1) // 2]:
            continue
        evidence = _queued_what_it_never_issued(facts, rank, alike)
        if evidence is not None:
            found.append(_stopped(facts, rank, *evidence))
            named.add(rank)
    return found


def _like_ranks_waiting_alike(facts: Facts, rank: int) -> Iterator[int]:
    """The ranks in `rank`'s place in the sibling groups of the group it waits in (they
    run its program) that wait in the like op there: the same op of the same number."""
    mine = facts.blocked_entry[rank]
    view = facts.group_of_entry(mine, rank)
    if view is None:
        return
    for sibling, (like,) in facts.like_ranks_in_siblings(view, (rank,)):
        theirs = facts.blocked_entry.get(like)
        if (theirs is not None and theirs.op == mine.op and batch_key(theirs)[1:] == batch_key(mine)[1:]
                and facts.group_of_entry(theirs, like) is sibling):
            yield like


def _queued_what_it_never_issued(facts: Facts, rank: int,
                                 alike: list[int]) -> Optional[tuple[GroupView, CollectiveMatch, int]]:
    """(group, its collective, the like rank that queued it) where one of `alike` shares
    a group with `rank` and queued, after the op it waits in, a collective of that group
    `rank` never issued. Groups that also run sends and recvs are not asked: torch
    numbers a batch of them as a collective too, so where members ran different numbers
    of batches (pipeline stages), a collective's number differs between them."""
    full = facts.analysis.matches
    for like in alike:
        theirs = facts.blocked_entry[like]
        for view in full.views:
            members = view.group.ranks
            if rank not in members or like not in members or any(len(s.p2p) for s in view.streams.values()):
                continue
            for match in reversed(full.index.collectives_of.get(view.group.id, [])):
                if rank in match.not_issued and like in match.issued and match.calls[like][0].record_id > theirs.record_id:
                    return view, match, like
    return None


def _stopped(facts: Facts, rank: int, view: GroupView, match: CollectiveMatch, like: int) -> Finding:
    mine, queued = facts.blocked_entry[rank], match.calls[like][0]
    number = f"p2p #{mine.p2p_seq_id}" if mine.is_p2p else f"#{mine.collective_seq_id}"
    return new_finding(
        "not_issued", RULE, view, op=queued.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=(rank, like), suspect_ranks=(rank,), absent_ranks=(rank,),
        message=(f"rank {rank}'s host stopped issuing: it waits in {mine.op} {number} of "
                 f"{group_text(mine.pg_name, mine.pg_desc)} and queued fewer ops after it than most ranks in "
                 f"its place waiting alike; rank {like}, one of them, queued {queued.op} #{match.seq} of "
                 f"{group_text(view.group.name, view.group.desc)} after it, which rank {rank} never issued"),
        evidence={"like_rank": like, "blocked_in": {"op": mine.op, "pg_name": mine.pg_name, "is_p2p": mine.is_p2p}},
        waiting_ranks=(like,), age_ns=queued.time_created_ns,
    )
