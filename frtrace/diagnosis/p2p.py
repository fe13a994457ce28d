"""Point-to-point: sends and receives left without their partner, and pairs posted on
both ends that nothing else holds up.

Takes `Facts`; returns `p2p_unmatched` findings, one per (group, src, dst) channel,
naming the rank that posted its op and the one that never posted the partner (and in a
ring, where that one left no dump, whether the ring peers show the poster skipped a step),
or, where the other end shows it posted the partner and went on, the holder's device stall
(`stuck`, `_holder_stopped`), or a later collective of the holder's that its peers
finished (`stuck`, `ops_of_stalled_gpus`);
and for each closed cycle of posted pairs (`Waits.closed_cycles`), a mismatch between the
ends (in a ring, the rank that skipped a step: `not_issued`), or a note that they are in
flight.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding, P2PEnds, WentPast
from frtrace.diagnosis.frontier import STUCK_ON_DEVICE
from frtrace.diagnosis.like_channels import LeftOut, left_out_at, short_batch_at
from frtrace.diagnosis.program import NO_P2P_OPS, P2POps, stream_p2p_ops
from frtrace.diagnosis.waits import PostedPair
from frtrace.match.matcher import GroupView, P2PMatch
from frtrace.model import Entry, family_of, numel
from frtrace.table.seq_map import RowList
from frtrace.wording import call_site, group_text, groups_text, ranks_text, shape_text

UNMATCHED = "p2p.unmatched_p2p"

# What the two ends of a transfer must agree on: (elements, dtypes) of each op, sorted.
P2PSignature = tuple[tuple[int, tuple[str, ...]], ...]


def unmatched_p2p(facts: Facts) -> list[Finding]:
    """The rule: per channel, the first pending op the other end never matched. A
    completed op had its partner, which merely fell off a ring buffer."""
    findings: list[Finding] = []
    for view in facts.device.views:
        reported: set[tuple[int, int]] = set()
        for pair in facts.p2p_of(view):
            if not pair.one_sided or (pair.src, pair.dst) in reported:
                continue
            present = pair.send or pair.recv
            assert present is not None
            if facts.reliable and present.completed:
                continue
            reported.add((pair.src, pair.dst))
            findings.append(_holder_stopped(facts, view, pair) or _in_flight_like_its_siblings(facts, view, pair)
                            or _unmatched(view, pair))
            skipped = _shifted_holder(facts, view, pair)
            if skipped is not None:
                findings.append(skipped)
    return findings


def _holder_stopped(facts: Facts, view: GroupView, pair: P2PMatch) -> Optional[Finding]:
    """The holder of a send or recv whose other end shows no partner, where that end posted
    as many sends and recvs as its like rank and went on with it
    (`Facts.partner_went_on_as_like_rank`): the holder's op never finished on its side, a
    device stall (`stuck`), not a partner never posted."""
    present = pair.send or pair.recv
    assert present is not None
    holder, absent = (pair.src, pair.dst) if pair.send else (pair.dst, pair.src)
    if absent < 0 or not isinstance(present.p2p_seq_id, int):
        return None
    if _batch_short_of(facts, view, holder, absent, present.p2p_seq_id) is not None:
        return None
    like = facts.partner_went_on_as_like_rank(view, holder, absent, present.p2p_seq_id)
    if like is None:
        return None
    went_on = facts.blocked_entry[absent]
    return new_finding(
        "stuck", "p2p.partner_went_on", view, op=present.op, collective_seq_id=None, p2p_seq_id=present.p2p_seq_id,
        ranks=(holder, absent), suspect_ranks=(holder,),
        message=(f"rank {holder} still holds {present.op} {pair.src}->{pair.dst} (p2p #{present.p2p_seq_id} in "
                 f"{group_text(view.group.name, view.group.desc)}) unfinished, while rank {absent}, its other end, "
                 f"posted as many sends and recvs there as rank {like.like_absent} in its place in {like.like_group} "
                 f"and went on to {went_on.op} #{went_on.collective_seq_id} in "
                 f"{group_text(went_on.pg_name, went_on.pg_desc)}: rank {holder}'s GPU work stopped completing "
                 "(a device-side stall)"),
        evidence={"holding_ranks": [holder], "finished_ranks": [absent], "like_rank": like.like_absent,
                  "like_holder": like.like_holder, "state": present.state},
        waiting_ranks=(holder,), age_ns=present.time_created_ns, anchor=present,
        p2p_ends=P2PEnds(pair.src, pair.dst, holder, absent),
    )


def _batch_short_of(facts: Facts, view: GroupView, holder: int, absent: int, number: int) -> Optional[int]:
    """A peer of another op of the holder's batch #`number` (a `batch_isend_irecv`: its ops
    finish together) that went on having posted fewer sends and recvs in the group than
    its like rank (`Facts.posted_fewer_than_like_rank`): the batch waits on that peer's
    missing op, so the holder's op of it staying unfinished shows no stall of the
    holder's GPU. None when there is no such peer."""
    ops = view.streams.get(holder)
    if ops is None:
        return None
    members = view.group.ranks
    batch: list[Entry] = []
    for position in range(len(ops.p2p) - 1, -1, -1):
        entry = ops.p2p[position]
        if not isinstance(entry.p2p_seq_id, int) or entry.p2p_seq_id < number:
            break
        if entry.p2p_seq_id == number and not entry.name.is_coalesced_marker:
            batch.append(entry)
    if len(batch) < 2:
        return None
    for entry in batch:
        local = entry.name.local_dst if entry.op == "send" else entry.name.local_src
        peer = members[local] if local is not None and 0 <= local < len(members) else None
        if peer is not None and peer not in (holder, absent) and facts.posted_fewer_than_like_rank(view, peer):
            return peer
    return None


def _in_flight_like_its_siblings(facts: Facts, view: GroupView, pair: P2PMatch) -> Optional[Finding]:
    """A send or recv whose other end left no dump, where the rank in the holder's place
    in every sibling group holds the like op unfinished too (Facts.like_ops_unfinished):
    the missing dump explains nothing those groups do not show without one (a job dumped
    while its transfers ran looks so), so nobody is blamed for it. The P2P twin of
    frontier.in_flight_like_its_siblings."""
    present = pair.send or pair.recv
    assert present is not None
    holder, absent = (pair.src, pair.dst) if pair.send else (pair.dst, pair.src)
    if absent not in view.no_dump or present.completed or not isinstance(present.p2p_seq_id, int):
        return None
    siblings = facts.like_ops_unfinished(view, holder, absent, pair.send is not None, present.p2p_seq_id)
    if not siblings:
        return None
    absent_op = "recv" if pair.send else "send"
    return new_finding(
        "missing_dump", "p2p.in_flight_like_its_siblings", view, severity="warning", op=present.op,
        collective_seq_id=None, p2p_seq_id=present.p2p_seq_id, ranks=(absent,), suspect_ranks=(),
        message=(f"rank {absent} left no usable dump; rank {holder} posted {present.op} {pair.src}->{pair.dst} "
                 f"(p2p #{present.p2p_seq_id} in {group_text(view.group.name, view.group.desc)}), unfinished, as the "
                 f"ranks in its place in {groups_text(siblings, view.group.desc, most_ranges=4)} hold theirs: the "
                 f"dumps cannot tell whether rank {absent} posted the matching {absent_op} or the job was dumped "
                 "mid-transfer"),
        evidence={"no_dump_ranks": [absent], "posted_by": holder, "src": pair.src, "dst": pair.dst,
                  "siblings_alike": len(siblings)},
        waiting_ranks=(holder,), age_ns=present.time_created_ns, anchor=present,
        p2p_ends=P2PEnds(pair.src, pair.dst, holder, absent),
    )


def _shifted_holder(facts: Facts, view: GroupView, pair: P2PMatch) -> Optional[Finding]:
    """Where the other end left no dump, the ring's consensus can still judge the end
    that posted: when its ops from the one it waits in are what its ring peers issue
    some ops later (and not what they issue there), it skipped a ring step (as
    _shifted_member finds with both ends seen)."""
    present = pair.send or pair.recv
    assert present is not None
    holder, absent = (pair.src, pair.dst) if pair.send else (pair.dst, pair.src)
    seq = present.p2p_seq_id
    if absent not in view.no_dump or not isinstance(seq, int) or not _is_ring(view):
        return None
    consensus = _RingConsensus.around(facts, view, seq, seq)
    shift = 0 if consensus is None else consensus.ran_ahead(holder, seq)
    if consensus is None or not shift:
        return None
    return new_finding(
        "not_issued", "p2p.skipped_ring_step", view, op=present.op, collective_seq_id=None, p2p_seq_id=seq,
        ranks=(holder, absent), suspect_ranks=(holder,), absent_ranks=(holder,),
        message=_ran_ahead_text(view, holder, present, shift) + f" (rank {absent}, the other end, left no dump)",
        evidence={"skipped_p2p_ops": shift, "ring_peers_compared": consensus.voters, "no_dump_ranks": [absent]},
        waiting_ranks=(holder,), age_ns=present.time_created_ns, anchor=present,
        p2p_ends=P2PEnds(pair.src, pair.dst, holder, absent),
    )


def _unmatched(view: GroupView, pair: P2PMatch) -> Finding:
    present = pair.send or pair.recv
    assert present is not None
    holder, absent = (pair.src, pair.dst) if pair.send else (pair.dst, pair.src)
    absent_op = "recv" if pair.send else "send"
    message = (
        f"rank {holder} posted {present.op} {pair.src if pair.src >= 0 else '?'}->{pair.dst} "
        f"(p2p #{present.p2p_seq_id} in {group_text(view.group.name, view.group.desc)}) "
        f"but rank {absent if absent >= 0 else '?'} never posted the matching {absent_op}"
        + (" (it has no dump)" if absent in view.no_dump else "")
    )
    evidence = {"src": pair.src, "dst": pair.dst, "posted_by": holder, "missing_on": absent, "state": present.state}
    site = call_site(present)
    if site:
        evidence["peer_call_site"] = site
    known = (absent,) if absent >= 0 else ()
    return new_finding(
        "p2p_unmatched", UNMATCHED, view, op=present.op, collective_seq_id=None, p2p_seq_id=present.p2p_seq_id,
        ranks=tuple(sorted({holder, absent} - {-1})), suspect_ranks=known, message=message, evidence=evidence,
        waiting_ranks=(holder,), age_ns=present.time_created_ns, absent_ranks=known, anchor=present,
        p2p_ends=P2PEnds(pair.src, pair.dst, holder, absent), call_entries={"peer_call_site": present} if site else {},
    )


def _is_ring(view: GroupView, recent: int = 64) -> bool:
    """Whether the group's sends and recvs go round a ring of three members or more: each
    member sends to one peer and receives from another (context-parallel attention),
    where a pipeline's middle stages send both ways. Read off each member's newest
    `recent` P2P ops."""
    if len(view.group.ranks) < 3:
        return False
    both = False
    for stream in view.streams.values():
        ops = stream.p2p[max(0, len(stream.p2p) - recent):]
        sent_to = {op.name.local_dst for op in ops if op.name.op == "send"}
        received_from = {op.name.local_src for op in ops if op.name.op == "recv"}
        if len(sent_to) > 1 or len(received_from) > 1 or -1 in sent_to | received_from:
            return False
        both = both or (len(sent_to) == len(received_from) == 1 and sent_to != received_from)
    return both


# --------------------------------------------------------------------------- posted pairs

RING_WINDOW = 8  # P2P sequence numbers before a disagreement on which the ring's members must agree
MAX_SKIP = 4  # P2P ops a rank may have skipped (a ring step is one or two)
MAX_VOTERS = 64  # members of the group and its siblings consulted


def posted_pairs(facts: Facts) -> list[Finding]:
    """The rule: ranks blocked in sends and recvs posted on both ends that wait on nobody
    else (`Waits.closed_cycles`). Their ends disagreeing on the tensor is the fault: in a
    ring (context-parallel attention), the end whose op is not the one its ring peers issued
    at that P2P sequence number is the culprit, and when its next ops are its peers' later
    ones, it skipped a ring step. Ends that agree may still hide a skipped step: a member
    whose ops from there on are its ring peers' one step later (its queued ops show it)
    skipped one. Else they are in flight: a job dumped mid-transfer looks the same."""
    findings: list[Finding] = []
    waits = facts.waits
    for cycle in waits.closed_cycles():
        pairs = {id(p.pair): p for rank in cycle for p in waits.posted.get(rank, ())}
        ordered = sorted(pairs.values(), key=lambda p: (p.age_ns, p.pair.group_id, p.pair.src, p.pair.dst))
        mismatched = next((p for p in ordered if _difference(p.pair) is not None), None)
        view = facts.device.views[ordered[0].pair.group_id]
        if mismatched is not None:
            findings.append(_mismatched_pair(facts, facts.device.views[mismatched.pair.group_id], mismatched, cycle))
            continue
        skipped = _shifted_member(facts, view, ordered, cycle)
        if skipped is None:
            skipped = _member_that_left_out_a_step(facts, ordered, cycle)
        findings.append(skipped if skipped is not None else _pair_in_flight(view, ordered[0], cycle))
    return findings


def _member_that_left_out_a_step(facts: Facts, ordered: list[PostedPair], cycle: list[int]) -> Optional[Finding]:
    """The one member of a closed cycle of agreeing posted pairs whose sends and recvs in
    a group are those of the ranks at its place in the sibling groups but for one op or
    batch left out, after which it went on as they did (like_channels.left_out): it
    skipped that step, and the pair it now waits in meets its partner, which waits in the
    step it left out (a pipeline's stages run programs of their own, so no ring consensus
    can say). None when no member, or more than one, is so found."""
    found: list[tuple[int, GroupView, LeftOut, P2PMatch, Entry]] = []
    views = facts.device.views
    for group_id in sorted({p.pair.group_id for p in ordered}):
        view = views[group_id]
        family = facts.siblings_of(view).family
        for rank in sorted(set(cycle) & set(view.group.ranks)):
            left_out = left_out_at(family, view, rank, _stream_ops) or short_batch_at(family, view, rank, _stream_ops)
            posted = next((p.pair for p in ordered if p.pair.group_id == group_id and rank in (p.pair.src, p.pair.dst)),
                          None)
            entry = None if posted is None else (posted.send if posted.src == rank else posted.recv)
            if left_out is not None and posted is not None and entry is not None:
                found.append((rank, view, left_out, posted, entry))
    if len({rank for rank, *_ in found}) != 1:
        return None
    rank, view, left_out, posted, entry = found[0]
    other = posted.dst if posted.src == rank else posted.src
    group = group_text(view.group.name, view.group.desc)
    op, src, dst = left_out.channel
    ranks = view.group.ranks
    ends = f"{ranks[src]}->{ranks[dst]}" if src is not None and dst is not None and max(src, dst) < len(ranks) else "?"
    step = f"{op} {ends}" if left_out.ops == 1 else f"{op} {ends} and the {left_out.ops - 1} op(s) batched with it"
    return new_finding(
        "not_issued", "p2p.left_out_step", view, op=entry.op, collective_seq_id=None, p2p_seq_id=entry.p2p_seq_id,
        ranks=tuple(cycle), suspect_ranks=(rank,), absent_ranks=(rank,),
        message=(f"rank {rank} left out a step in {group}: the {step}, which the ranks at its place in the sibling "
                 f"groups posted there; its sends and recvs are theirs but for that step, and it now waits with "
                 f"rank {other} in its {entry.op} p2p #{entry.p2p_seq_id}"),
        evidence={"skipped_p2p_ops": left_out.ops, "like_ranks_compared": left_out.like_ranks,
                  "cycle_ranks": list(cycle)},
        waiting_ranks=tuple(r for r in cycle if r != rank), age_ns=min(p.age_ns for p in ordered), anchor=entry,
        p2p_ends=P2PEnds(posted.src, posted.dst, posted.src, posted.dst),
        # It went past the step (linking then reads it as no victim of the pair it waits in).
        went_past={rank: WentPast(view.streams[rank].p2p[left_out.went_on], view.group.id, left_out.like_ranks, True,
                                  left_out.in_batch)},
    )


def _stream_ops(view: GroupView, rank: int, count: int) -> P2POps:
    stream = view.streams.get(rank)
    return stream_p2p_ops(stream, count) if stream is not None else NO_P2P_OPS


_Ends = dict[int, tuple[Entry, tuple[int, Entry]]]  # rank -> (its posted entry, (the other end's rank, entry))


def _posted_ends(view: GroupView, ordered: list[PostedPair]) -> _Ends:
    """Each member's first posted op among the group's pairs posted on both ends, and its other end."""
    ends: _Ends = {}
    for posted in ordered:
        pair = posted.pair
        if pair.group_id != view.group.id or pair.send is None or pair.recv is None:
            continue
        ends.setdefault(pair.src, (pair.send, (pair.dst, pair.recv)))
        ends.setdefault(pair.dst, (pair.recv, (pair.src, pair.send)))
    return ends


def _shifted(consensus: _RingConsensus, ends: _Ends) -> list[tuple[int, Entry, tuple[int, Entry], int]]:
    """(rank, its op, the other end, P2P ops it skipped) of the members whose ops from the
    one they wait in are what their ring peers issue later, where the peers agree before."""
    return [(rank, entry, other, shift) for rank, (entry, other) in sorted(ends.items())
            if (shift := consensus.ran_ahead(rank, entry.p2p_seq_id))]


def _ran_ahead_text(view: GroupView, rank: int, entry: Entry, shift: int) -> str:
    return (f"rank {rank} skipped a ring step in {group_text(view.group.name, view.group.desc)}: its "
            f"{shape_text(entry)} at p2p #{entry.p2p_seq_id} and the ops it queued after it are what its ring peers "
            f"issue {shift} P2P op{'s' if shift > 1 else ''} later, so it is that far short of them")


def _shifted_member(facts: Facts, view: GroupView, ordered: list[PostedPair], cycle: list[int]) -> Optional[Finding]:
    """The one member of a ring's closed cycle of agreeing pairs whose ops, from the one it
    waits in, are what its ring peers issue some ops later (and not what they issue there):
    it skipped them. None when no single member is so shifted."""
    ends = _posted_ends(view, ordered)
    if not ends:
        return None
    seqs = [entry.p2p_seq_id for entry, _ in ends.values()]
    consensus = _RingConsensus.around(facts, view, min(seqs), max(seqs))
    if consensus is None:
        return None
    shifted = _shifted(consensus, ends)
    if len(shifted) != 1:
        return None
    rank, entry, other, shift = shifted[0]
    pair = next(p.pair for p in ordered if rank in (p.pair.src, p.pair.dst) and p.pair.group_id == view.group.id)
    return new_finding(
        "not_issued", "p2p.skipped_ring_step", view, op=entry.op, collective_seq_id=None, p2p_seq_id=entry.p2p_seq_id,
        ranks=tuple(cycle), suspect_ranks=(rank,), absent_ranks=(rank,),
        message=_ran_ahead_text(view, rank, entry, shift) + f"; rank {other[0]} waits in the {other[1].op} it pairs with",
        evidence={"skipped_p2p_ops": shift, "ring_peers_compared": consensus.voters, "cycle_ranks": list(cycle)},
        waiting_ranks=tuple(r for r in cycle if r != rank), age_ns=min(p.age_ns for p in ordered), anchor=other[1],
        p2p_ends=P2PEnds(pair.src, pair.dst, pair.src, pair.dst),
    )


def _p2p_signature(entries: Iterable[Entry]) -> Optional[P2PSignature]:
    """What the two ends of a transfer must agree on: element count and dtype of each op."""
    signature = []
    for entry in entries:
        if not entry.shapes.readable:
            return None
        count = numel(entry.shapes.input_sizes)
        signature.append((count, tuple(entry.shapes.input_dtypes)))
    return tuple(sorted(signature))


def _difference(pair: P2PMatch) -> Optional[str]:
    """How a posted pair's send and recv disagree (None: they move the same tensor)."""
    send, recv = pair.send, pair.recv
    if send is None or recv is None:
        return None
    a, b = _p2p_signature([send]), _p2p_signature([recv])
    if a is None or b is None or a == b:
        return None
    return "dtype_mismatch" if a[0][0] == b[0][0] else "size_mismatch"


def _mismatched_pair(facts: Facts, view: GroupView, posted: PostedPair, cycle: list[int]) -> Finding:
    pair = posted.pair
    send, recv = pair.send, pair.recv
    assert send is not None and recv is not None
    kind = _difference(pair)
    assert kind is not None
    consensus = _RingConsensus.around(facts, view, min(send.p2p_seq_id, recv.p2p_seq_id),
                                      max(send.p2p_seq_id, recv.p2p_seq_id))
    odd = consensus.odd_end(pair) if consensus is not None else None
    group = group_text(view.group.name, view.group.desc)
    ends = f"send {pair.src}->{pair.dst} (p2p #{send.p2p_seq_id}) and recv (p2p #{recv.p2p_seq_id}) in {group}"
    evidence: dict[str, Any] = {"src": pair.src, "dst": pair.dst, "send": shape_text(send), "recv": shape_text(recv),
                                "cycle_ranks": list(cycle)}
    base: dict[str, Any] = dict(op=send.op, collective_seq_id=None, ranks=tuple(cycle), age_ns=posted.age_ns,
                                p2p_ends=P2PEnds(pair.src, pair.dst, pair.src, pair.dst))
    if odd is None:
        message = (f"the {ends} were both posted and neither completed: they disagree, "
                   f"rank {pair.src} sends {shape_text(send)} and rank {pair.dst} receives {shape_text(recv)}")
        return new_finding(kind, "p2p.mismatched_pair", view, p2p_seq_id=send.p2p_seq_id,
                           suspect_ranks=tuple(sorted({pair.src, pair.dst})), message=message,
                           evidence=evidence | {"tie": True}, waiting_ranks=(pair.src, pair.dst), anchor=send, **base)
    assert consensus is not None
    rank, entry, other, skipped = odd
    evidence["ring_peers_compared"] = consensus.voters
    waiting = tuple(r for r in cycle if r != rank)
    if skipped:
        evidence["skipped_p2p_ops"] = skipped
        message = (f"rank {rank} skipped a ring step in {group}: its {shape_text(entry)} at p2p #{entry.p2p_seq_id} "
                   f"is what its ring peers issue at p2p #{entry.p2p_seq_id + skipped}, "
                   f"so it is {skipped} P2P op{'s' if skipped > 1 else ''} short of them; rank {other[0]} "
                   f"waits in the {other[1].op} it pairs with")
        return new_finding("not_issued", "p2p.skipped_ring_step", view, p2p_seq_id=entry.p2p_seq_id,
                           suspect_ranks=(rank,), message=message, evidence=evidence, waiting_ranks=waiting,
                           absent_ranks=(rank,), anchor=other[1], **base)
    message = (f"{kind.replace('_mismatch', '')} mismatch in the {ends}, both posted and neither completed: "
               f"rank {rank} issued {shape_text(entry)}, where its ring peers issued {shape_text(other[1])}")
    return new_finding(kind, "p2p.mismatched_pair", view, p2p_seq_id=entry.p2p_seq_id, suspect_ranks=(rank,),
                       message=message, evidence=evidence, waiting_ranks=waiting, anchor=other[1], **base)


def _pair_in_flight(view: GroupView, posted: PostedPair, cycle: list[int]) -> Finding:
    """Ends that agree, both posted, neither finished, waiting on nobody else."""
    pair = posted.pair
    send = pair.send
    assert send is not None
    return new_finding(
        "in_flight", "p2p.posted_pair", view, severity="info", op=send.op, collective_seq_id=None,
        p2p_seq_id=send.p2p_seq_id, ranks=tuple(cycle), suspect_ranks=(),
        message=(f"{ranks_text(cycle)} are in flight in sends and recvs posted on both ends (first send "
                 f"{pair.src}->{pair.dst} p2p #{send.p2p_seq_id} in {group_text(view.group.name, view.group.desc)}), "
                 "none completed: a transfer that stopped, or one still running when the job was dumped"),
        evidence={"src": pair.src, "dst": pair.dst, "cycle_ranks": list(cycle)},
        waiting_ranks=tuple(cycle), age_ns=posted.age_ns, anchor=send,
        p2p_ends=P2PEnds(pair.src, pair.dst, pair.src, pair.dst),
    )


@dataclass(slots=True)
class _RingConsensus:
    """What the members of a group (and of its sibling groups) issued at each P2P sequence
    number in a window, for groups whose members run one program: a ring, where each
    sends to one neighbour and receives from the other the same tensors at the same
    numbers (context-parallel attention)."""

    signatures: dict[int, dict[int, P2PSignature]]  # rank -> {p2p seq: its ops' signature}

    @property
    def voters(self) -> int:
        return len(self.signatures)

    @classmethod
    def of(cls, facts: Facts, view: GroupView, window: range) -> Optional["_RingConsensus"]:
        """From everything dumped (ops queued behind a blocked one show its program too)."""
        full, group = facts.analysis.matches, view.group
        mine = family_of(group)
        family = [g for g in facts.analysis.layout.groups
                  if g.id != group.id and g.size == group.size and family_of(g) == mine]
        signatures: dict[int, dict[int, P2PSignature]] = {}
        for member_group in [group, *family]:
            for rank, stream in full.views[member_group.id].streams.items():
                if len(signatures) < MAX_VOTERS and stream.p2p and rank not in signatures:
                    signatures[rank] = _signatures_by_seq(stream.p2p, window)
        return cls(signatures) if len(signatures) >= 3 else None

    @classmethod
    def around(cls, facts: Facts, view: GroupView, low: int, high: int) -> Optional["_RingConsensus"]:
        """`of` the numbers from RING_WINDOW before `low` to as far past `high` as a member
        that skipped MAX_SKIP ops reaches."""
        return cls.of(facts, view, range(max(1, low - RING_WINDOW), high + RING_WINDOW + MAX_SKIP + 1))

    def majority(self, seq: int) -> Optional[P2PSignature]:
        votes = Counter(s[seq] for s in self.signatures.values() if seq in s)
        if not votes:
            return None
        signature, count = votes.most_common(1)[0]
        return signature if 2 * count > sum(votes.values()) and count >= 2 else None

    def unanimous_before(self, seq: int) -> bool:
        """The voters issued the same at the numbers just before `seq`: one program."""
        compared = 0
        for earlier in range(max(1, seq - RING_WINDOW), seq):
            seen = {s[earlier] for s in self.signatures.values() if earlier in s}
            if len(seen) > 1:
                return False
            compared += bool(seen)
        return compared > 0

    def odd_end(self, pair: P2PMatch) -> Optional[tuple[int, Entry, tuple[int, Entry], int]]:
        """(rank, its entry, (the other end's rank, entry), P2P ops it skipped or 0) for
        the end that issued what its ring peers did not; None when consensus cannot tell."""
        send, recv = pair.send, pair.recv
        assert send is not None and recv is not None
        ends = ((pair.src, send), (pair.dst, recv))
        agrees = []
        for rank, entry in ends:
            seq = entry.p2p_seq_id
            expected = self.majority(seq)
            if expected is None or not self.unanimous_before(seq):
                return None
            # What the rank issued under that number: a whole batch, as the others voted.
            agrees.append(self.signatures.get(rank, {}).get(seq, _p2p_signature([entry])) == expected)
        if agrees[0] == agrees[1]:
            return None
        (rank, entry), other = (ends[0], ends[1]) if agrees[1] else (ends[1], ends[0])
        return rank, entry, other, self.skipped(rank, entry.p2p_seq_id)

    def lines_up(self, rank: int, seq: int) -> bool:
        """The rank's ops from `seq` on are its peers' at the same numbers."""
        mine = self.signatures.get(rank, {})
        return all(mine[k] == expected for k in range(seq, seq + RING_WINDOW)
                   if k in mine and (expected := self.majority(k)) is not None)

    def ran_ahead(self, rank: int, seq: int) -> int:
        """P2P ops the rank skipped before `seq`: where the peers agree before it, its ops from
        `seq` on are not theirs there but what they issue that many ops later; 0 otherwise."""
        if not self.unanimous_before(seq) or self.lines_up(rank, seq):
            return 0
        return self.skipped(rank, seq)

    def skipped(self, rank: int, seq: int) -> int:
        """By how many P2P ops the rank's ops from `seq` on run ahead of its peers' (it
        skipped that many), 0 when no shift lines them up."""
        mine = self.signatures.get(rank, {})
        for shift in range(1, MAX_SKIP + 1):
            compared = [mine[k] == expected for k in range(seq, seq + RING_WINDOW)
                        if k in mine and (expected := self.majority(k + shift)) is not None]
            if compared and all(compared):
                return shift
        return 0


def _signatures_by_seq(p2p: RowList, window: range) -> dict[int, P2PSignature]:
    """p2p seq -> the signature of the rank's ops with that number (a batch's together),
    for the numbers in `window` (read off the columns, then only those rows)."""
    by_seq: dict[int, list[Entry]] = defaultdict(list)
    for position, seq in enumerate(p2p.field("p2p_seq_id")):
        if seq in window:
            by_seq[seq].append(p2p[position])
    return {seq: sig for seq, entries in by_seq.items() if (sig := _p2p_signature(entries)) is not None}


def ops_of_stalled_gpus(facts: Facts, findings: list[Finding]) -> list[Finding]:
    """`findings`, where a send or recv left without its partner (`unmatched_p2p`) is held
    by a rank whose GPU another finding shows ran past it: a collective the rank issued
    after the op was finished by its peers while the rank still holds it unfinished
    (`frontier.stuck_on_device`). A collective finishes only with every member's part of
    it run: the rank's reports of its GPU work stopped, and what it shows unfinished says
    nothing of its partner (a recv finished on the device, as the work after it waits for
    its data; a send's state is no longer reported, and its pairing with the other end's
    ops, which goes by what finished, is not to be trusted). The holder's stall
    (`stuck`) stands in its place."""
    ran_past = _collectives_run_unreported(facts, findings)
    if not ran_past:
        return findings
    return [_op_run_unreported(facts, finding, ran_past) or finding for finding in findings]


def _collectives_run_unreported(facts: Facts, findings: list[Finding]) -> dict[int, Entry]:
    """rank -> its newest entry (by its own clock) of a collective a device-stall finding
    shows its peers finished while it holds it unfinished."""
    newest: dict[int, Entry] = {}
    for finding in findings:
        if finding.rule != STUCK_ON_DEVICE or finding.group_id is None or finding.collective_seq_id is None:
            continue
        # The whole dumps' match: the device view leaves out what a rank queued behind the op
        # it is blocked in, and a stalled GPU's blocked op may be older than this one.
        match = facts.analysis.matches.index.at.get((finding.group_id, finding.collective_seq_id))
        if match is None:
            continue
        for rank in finding.facts["holding_ranks"]:
            entries = match.calls.get(rank)
            if entries and (rank not in newest or entries[0].time_created_ns > newest[rank].time_created_ns):
                newest[rank] = entries[0]
    return newest


def _op_run_unreported(facts: Facts, finding: Finding, ran_past: dict[int, Entry]) -> Optional[Finding]:
    ends, op = finding.p2p_ends, finding.anchor
    if finding.rule != UNMATCHED or ends is None or op is None or finding.group_id is None:
        return None
    holder, partner = ends.posted_by, ends.missing_on
    later = ran_past.get(holder)
    if later is None or later.time_created_ns <= op.time_created_ns:
        return None
    view = facts.device.views[finding.group_id]
    partner_op = "send" if ends.posted_by == ends.dst else "recv"
    # A recv from any source (`recv 1<-?`) names no partner: -1.
    src = str(ends.src) if ends.src >= 0 else "?"
    by_partner = f" by rank {partner}" if partner >= 0 else ""
    return new_finding(
        "stuck", "p2p.op_run_unreported", view, op=op.op, collective_seq_id=None, p2p_seq_id=op.p2p_seq_id,
        ranks=tuple(sorted({holder, partner} - {-1})), suspect_ranks=(holder,),
        message=(f"rank {holder}'s GPU stopped reporting its work (a device-side fault): it still holds {op.op} "
                 f"{src}->{ends.dst} (p2p #{op.p2p_seq_id} in {group_text(view.group.name, view.group.desc)}) "
                 f"unfinished, yet its peers finished {later.op} #{later.collective_seq_id} in "
                 f"{group_text(later.pg_name, later.pg_desc)}, which it issued later; its dump cannot show the "
                 f"matching {partner_op} was never posted{by_partner}"),
        evidence={"holding_ranks": [holder], "partner": partner, "ran_past": later.op,
                  "ran_past_seq": later.collective_seq_id, "ran_past_group": later.pg_name, "state": op.state},
        waiting_ranks=(holder,), age_ns=op.time_created_ns, anchor=op, p2p_ends=ends,
    )
