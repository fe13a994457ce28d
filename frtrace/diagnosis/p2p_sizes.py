"""Point-to-point: a send and the recv it is paired with that disagree on what moves.

Takes `Facts`; returns `size_mismatch` and `dtype_mismatch` findings, one per (group,
src, dst) channel: the first pair (in channel order) whose send moves a different number
of elements, or elements of another dtype, than its recv takes, whether the recv named
its source or took any (`recv 1<-?`). A pair has no majority, so both ends are named.
Pairs are read off the static rows of the two ranks' tables (a job holds hundreds of
thousands), each distinct pair of shape records judged once.

Pairs are made by order on the channel, so an end that skipped one op pairs its next op
with the partner's op of the step it skipped: sizes then differ because of the skip. When
the two ends' ops from that pair on (their queued ones too) line up once one end is
shifted by one, and the partner's op there moves what the channel moved before (a step
of the program, not an odd op the partner inserted), that end skipped the op: the
finding is then `p2p_unmatched`, naming it (the partner's op waits for an op it never
posted), as `p2p.unmatched_p2p` would.
"""

from __future__ import annotations

from itertools import groupby
from operator import attrgetter
from typing import Any, Optional

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding, P2PEnds
from frtrace.diagnosis.like_channels import LeftOut, left_out_at
from frtrace.diagnosis.program import NO_P2P_OPS, P2POps, stream_p2p_ops
from frtrace.match.matcher import GroupView, P2PMatch
from frtrace.model import Shapes, numel
from frtrace.table.entry_table import EntryTable
from frtrace.wording import call_site, group_text

_SHAPES_OF = attrgetter("shapes")  # of a static row
# Ops after the mismatched pair compared to tell which end skipped one; at least
# _SHIFT_EVIDENCE of them must line up.
_SHIFT_WINDOW = 16
_SHIFT_EVIDENCE = 2
_HISTORY = 64  # earlier ops of the channel that tell a step of the program from an odd op


def _moved(shapes: Shapes, sending: bool) -> Optional[tuple[int, frozenset[str]]]:
    """(elements, dtypes) an op moves: a send's input, a recv's output (the other side
    where the dump left that one empty); None when nothing of it could be read."""
    if not shapes.readable:
        return None
    sides = ((shapes.input_sizes, shapes.input_dtypes), (shapes.output_sizes, shapes.output_dtypes))
    sizes, dtypes = sides[0] if sending else sides[1]
    if not sizes:
        sizes, dtypes = sides[1] if sending else sides[0]
    if not sizes:
        return None
    return numel(sizes), frozenset(dtypes)


def _difference(send: Shapes, recv: Shapes) -> Optional[str]:
    """The kind of mismatch between a send's and its recv's shape records, or None."""
    sent, taken = _moved(send, True), _moved(recv, False)
    if sent is None or taken is None:
        return None
    if sent[1] and taken[1] and sent[1] != taken[1]:
        return "dtype_mismatch"
    return "size_mismatch" if sent[0] != taken[0] else None


def mismatched_pairs(facts: Facts) -> list[Finding]:
    """The rule: per channel, the first pair whose ends disagree (see module docstring)."""
    findings: list[Finding] = []
    judged: dict[tuple[int, int], Optional[str]] = {}  # ids of the two shape records -> kind
    for view in facts.device.views:
        local = {rank: k for k, rank in enumerate(view.group.ranks)}
        for (src, dst), pairs in groupby(facts.p2p_of(view), key=_CHANNEL):
            if not _may_disagree(view, local, src, dst, judged):  # as a rule: no pair need be read
                continue
            found = _first_mismatch(list(pairs), judged)
            if found is not None:
                pair, kind = found
                skipper = _skipped_one(facts, pair)
                left = _left_out_by_one_end(facts, view, pair) if skipper is None else None
                if skipper is not None:
                    findings.append(_skipped(view, pair, skipper))
                elif left is not None:
                    findings.append(_skipped(view, pair, left[0], left[1]))
                else:
                    findings.append(_mismatch(facts, view, pair, kind))
    return findings


_CHANNEL = attrgetter("src", "dst")


def _may_disagree(view: GroupView, local: dict[int, int], src: int, dst: int, judged: dict[tuple[int, int], Optional[str]]) -> bool:
    """Whether some send the sender's table could hold on the channel src -> dst and some
    recv the receiver's could hold on it disagree: the few static rows of the two tables
    tell, so a channel whose every send and recv move alike is never read pair by pair
    (rows of other groups are counted too: that only makes this answer yes more often)."""
    sender, receiver = view.streams.get(src), view.streams.get(dst)
    if sender is None or receiver is None:
        return False  # no pair has both ends
    if src not in local or dst not in local:
        return True
    sends = {id(static.shapes): static.shapes for static in sender.p2p.table.statics_in_use()
             if static.name.op == "send" and static.name.local_dst == local[dst]}
    recvs = {id(static.shapes): static.shapes for static in receiver.p2p.table.statics_in_use()
             if static.name.op == "recv" and static.name.local_src in (local[src], -1)}
    for send_id, send in sends.items():
        for recv_id, recv in recvs.items():
            key = (send_id, recv_id)
            if key not in judged:
                judged[key] = _difference(send, recv)
            if judged[key] is not None:
                return True
    return False
_SEND_ROW, _RECV_ROW = attrgetter("send_row"), attrgetter("recv_row")


def _posted_on_both_ends(pairs: list[P2PMatch]) -> tuple[list[P2PMatch], list[int], list[int]]:
    """(pairs, their send rows, their recv rows), without the pairs an end of which never
    posted its op."""
    send_rows, recv_rows = list(map(_SEND_ROW, pairs)), list(map(_RECV_ROW, pairs))
    if -1 in send_rows or -1 in recv_rows:
        both = [k for k, (s, r) in enumerate(zip(send_rows, recv_rows)) if s >= 0 and r >= 0]
        pairs, send_rows, recv_rows = [pairs[k] for k in both], [send_rows[k] for k in both], [recv_rows[k] for k in both]
    return pairs, send_rows, recv_rows


def _differences(keys: list[tuple[int, int]], send_shapes: list[Shapes], recv_shapes: list[Shapes],
                 judged: dict[tuple[int, int], Optional[str]]) -> dict[tuple[int, int], str]:
    """key -> how the ends differ, for the distinct pairs of shape records (`keys`: their
    ids) whose ends differ; each judged once (`judged` keeps the answers)."""
    bad: dict[tuple[int, int], str] = {}
    for key, (send, recv) in dict(zip(keys, zip(send_shapes, recv_shapes))).items():
        if key not in judged:
            judged[key] = _difference(send, recv)
        difference = judged[key]
        if difference is not None:
            bad[key] = difference
    return bad


def _first_mismatch(pairs: list[P2PMatch], judged: dict[tuple[int, int], Optional[str]]) -> Optional[tuple[P2PMatch, str]]:
    """The first of a channel's pairs whose ends disagree, and how. Each end's ops are rows
    of one table (its rank's): the distinct pairs of static codes are judged, read in C
    for the hundreds of thousands of pairs of a pipeline, and the pairs walked only when
    one of them disagrees."""
    pairs, send_rows, recv_rows = _posted_on_both_ends(pairs)
    if not pairs:
        return None
    send_table, recv_table = pairs[0].send_table, pairs[0].recv_table
    assert send_table is not None and recv_table is not None
    # The ends' shape records: objects the entries of a table share, so a channel of
    # thousands of pairs holds a few distinct pairs of them, judged once each.
    send_shapes = send_table.static_answers(_SHAPES_OF, send_rows)
    recv_shapes = recv_table.static_answers(_SHAPES_OF, recv_rows)
    keys = list(zip(map(id, send_shapes), map(id, recv_shapes)))
    bad = _differences(keys, send_shapes, recv_shapes, judged)
    if not bad:  # as a rule
        return None
    for pair, key in zip(pairs, keys):
        if key in bad:
            return pair, bad[key]
    return None


def _shapes_at(table: EntryTable, row: int) -> Shapes:
    return table.static_row(row).shapes


def _skipped_one(facts: Facts, pair: P2PMatch) -> Optional[int]:
    """The end (src or dst) whose ops on the channel, from this pair on, line up with the
    other end's one later, and whose partner's op here is one the channel moved before
    (so a step of the program, not an odd op the partner inserted; where the channel holds
    nothing before, one the group's other channels moved): it skipped that op.
    None when neither or both fit (a period-two pattern shifts either way)."""
    sends, recvs, history = _channel_from(facts, pair)
    moved_sends = [_moved(shapes, True) for shapes in sends[:_SHIFT_WINDOW + 1]]
    moved_recvs = [_moved(shapes, False) for shapes in recvs[:_SHIFT_WINDOW + 1]]
    seen = {_moved(shapes, True) for shapes in history[-_HISTORY:]} if history else _moved_elsewhere(facts, pair)
    sender_skipped = _lines_up(moved_sends, moved_recvs[1:]) and moved_recvs[0] in seen
    receiver_skipped = _lines_up(moved_recvs, moved_sends[1:]) and moved_sends[0] in seen
    if sender_skipped == receiver_skipped:
        return None
    return pair.src if sender_skipped else pair.dst


def _left_out_by_one_end(facts: Facts, view: GroupView, pair: P2PMatch) -> Optional[tuple[int, LeftOut]]:
    """(the end, what it left out) where exactly one end's sends and recvs in the group are
    its like ranks' but for an op on this pair's channel, left out (like_channels.left_out):
    the pair the skip shifted may hold nothing after it to line up (both ends wait in it).
    An end whose dump of only active entries left some of its ops out says nothing
    (stream_p2p_ops)."""
    ranks = view.group.ranks
    if pair.src not in ranks or pair.dst not in ranks:
        return None
    family = facts.siblings_of(view).family
    channel = (ranks.index(pair.src), ranks.index(pair.dst))
    found = []
    for end, op in ((pair.src, "send"), (pair.dst, "recv")):
        left = left_out_at(family, view, end, _stream_ops)
        if left is not None and left.channel == (op, *channel):
            found.append((end, left))
    return found[0] if len(found) == 1 else None


def _stream_ops(group: GroupView, rank: int, count: int) -> P2POps:
    stream = group.streams.get(rank)
    return stream_p2p_ops(stream, count) if stream is not None else NO_P2P_OPS


def _moved_elsewhere(facts: Facts, pair: P2PMatch) -> set[Optional[tuple[int, frozenset[str]]]]:
    """What the sends of the group's other channels moved: the program's steps, where the
    channel holds nothing before the pair (dumps of only active entries leave out what
    finished, so a ring's earlier steps are gone, while its other ranks' ops of the same
    steps are still held)."""
    return {_moved(_shapes_at(other.send_table, other.send_row), True)
            for other in facts.analysis.matches.index.p2p_of.get(pair.group_id, [])
            if other.send_table is not None and (other.src, other.dst) != (pair.src, pair.dst)}


def _channel_from(facts: Facts, pair: P2PMatch) -> tuple[list[Shapes], list[Shapes], list[Shapes]]:
    """(the shapes of the channel's sends from this pair's on, of its recvs from this
    pair's on, of the sends before it). Everything dumped (queued ops too), paired in
    order on the channel; the pair's ops found there by record id (the device view's
    tables are other objects)."""
    assert pair.send_table is not None and pair.recv_table is not None
    send_id = pair.send_table.value("record_id", pair.send_row)
    recv_id = pair.recv_table.value("record_id", pair.recv_row)
    sends: list[Shapes] = []
    recvs: list[Shapes] = []
    history: list[Shapes] = []  # what the channel's sends moved before this pair
    for other in facts.analysis.matches.index.p2p_of.get(pair.group_id, []):
        if (other.src, other.dst) != (pair.src, pair.dst):
            continue
        if other.send_table is not None:
            if sends or other.send_table.value("record_id", other.send_row) == send_id:
                sends.append(_shapes_at(other.send_table, other.send_row))
            else:
                history.append(_shapes_at(other.send_table, other.send_row))
        if other.recv_table is not None and (recvs or other.recv_table.value("record_id", other.recv_row) == recv_id):
            recvs.append(_shapes_at(other.recv_table, other.recv_row))
    return sends, recvs, history


def _lines_up(mine: list[Optional[tuple[int, frozenset[str]]]], theirs: list[Optional[tuple[int, frozenset[str]]]]) -> bool:
    length = min(len(mine), len(theirs))
    return length >= _SHIFT_EVIDENCE and None not in mine[:length] and mine[:length] == theirs[:length]


def _skipped(view: GroupView, pair: P2PMatch, skipper: int, left: Optional[LeftOut] = None) -> Finding:
    """The other end's op of this pair waits for the op `skipper` skipped: shown by its
    ops on the channel lining up one later, or (`left`) by its like ranks' ops."""
    send, recv = pair.send, pair.recv
    assert send is not None and recv is not None
    sender_skipped = skipper == pair.src
    waiting, posted, own = (recv, pair.dst, send) if sender_skipped else (send, pair.src, recv)
    absent_op = "send" if sender_skipped else "recv"
    message = (f"rank {posted} posted {waiting.op} {pair.src}->{pair.dst} of {_op_text(waiting, not sender_skipped)} "
               f"(p2p #{waiting.p2p_seq_id} in {group_text(view.group.name, view.group.desc)}) but rank {skipper} "
               f"never posted that {absent_op}: its {own.op} there moves {_op_text(own, sender_skipped)}, and "
               + (f"its {own.op}s from there on line up with rank {posted}'s one later (it skipped one)" if left is None
                  else f"{_like_ranks_text(left.like_ranks)} posted one more {absent_op} on that channel before its "
                       f"p2p #{left.went_on_seq}: it left one out"))
    evidence: dict[str, Any] = {"src": pair.src, "dst": pair.dst, "posted_by": posted, "missing_on": skipper,
                                "state": waiting.state, "skipped_one": True}
    if left is not None:
        evidence["like_ranks_posted_it"] = left.like_ranks
    site = call_site(waiting)
    if site:
        evidence["peer_call_site"] = site
    return new_finding(
        "p2p_unmatched", "p2p_sizes.skipped_one", view, op=waiting.op, collective_seq_id=None,
        p2p_seq_id=waiting.p2p_seq_id, ranks=tuple(sorted({pair.src, pair.dst})), suspect_ranks=(skipper,),
        message=message, evidence=evidence, waiting_ranks=(posted,), age_ns=waiting.time_created_ns,
        absent_ranks=(skipper,), anchor=waiting, p2p_ends=P2PEnds(pair.src, pair.dst, posted, skipper),
    )


def _like_ranks_text(count: int) -> str:
    return ("the rank at its place in a sibling group" if count == 1
            else f"the ranks at its place in {count} sibling groups")


def _op_text(entry: Any, sending: bool) -> str:
    moved = _moved(entry.shapes, sending)
    assert moved is not None
    shapes = entry.shapes.input_sizes if sending else entry.shapes.output_sizes
    shapes = shapes or (entry.shapes.output_sizes if sending else entry.shapes.input_sizes)
    return f"{moved[0]} element(s) {[list(s) for s in shapes]} {'/'.join(sorted(moved[1]))}".rstrip()


def _mismatch(facts: Facts, view: GroupView, pair: P2PMatch, kind: str) -> Finding:
    send, recv = pair.send, pair.recv
    assert send is not None and recv is not None
    any_source = recv.name.local_src == -1
    what = "dtypes" if kind == "dtype_mismatch" else "sizes"
    message = (f"{what} of a send and its recv differ in {group_text(view.group.name, view.group.desc)}: "
               f"rank {pair.src} sends {_op_text(send, True)} (p2p #{send.p2p_seq_id}) and rank {pair.dst} "
               f"receives {_op_text(recv, False)} (p2p #{recv.p2p_seq_id}"
               + (", a recv from any source" if any_source else "") + ")")
    evidence: dict[str, Any] = {
        "src": pair.src, "dst": pair.dst, "send_profiling_name": send.name.profiling_name,
        "recv_profiling_name": recv.name.profiling_name,
        "send_sizes": [list(s) for s in send.shapes.input_sizes], "send_dtypes": list(send.shapes.input_dtypes),
        "recv_sizes": [list(s) for s in recv.shapes.output_sizes], "recv_dtypes": list(recv.shapes.output_dtypes),
        "tie": True,
    }
    for key, entry in (("send_call_site", send), ("recv_call_site", recv)):
        site = call_site(entry)
        if site:
            evidence[key] = site
    ends = tuple(sorted({pair.src, pair.dst}))
    waiting = tuple(rank for rank, entry in ((pair.src, send), (pair.dst, recv))
                    if not (facts.reliable and entry.completed))
    return new_finding(
        kind, "p2p_sizes.mismatched_pairs", view, op=send.op, collective_seq_id=None, p2p_seq_id=send.p2p_seq_id,
        ranks=ends, suspect_ranks=ends, message=message, evidence=evidence, waiting_ranks=waiting,
        age_ns=min(send.time_created_ns, recv.time_created_ns), p2p_ends=P2PEnds(pair.src, pair.dst, pair.src, pair.dst),
    )
