"""Divergence and mismatches: the first collective of a group its members disagree on
or that some of them never issued.

Takes `Facts`; returns findings (`op_mismatch`, `size_mismatch`, `dtype_mismatch`, and
the `not_issued` / `extra_op` that a divergence turns out to be). Per group, by
consensus: the odd ranks out are the suspects, and a rank that skipped or added one op
is told apart from one that issued something else by aligning its ops with the
majority's, the way `diff` aligns lines.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Container, Optional

from frtrace.diagnosis.entry_checks import contradiction, trusted_size
from frtrace.diagnosis.facts import Facts, Siblings, agreed_signature, last_entry, new_finding, oldest_created
from frtrace.diagnosis.finding import Finding
from frtrace.diagnosis.linking import WentPastJudge
from frtrace.match.matcher import CollectiveMatch, Disagreement, GroupView, Signature, batch_signature
from frtrace.model import Entry
from frtrace.wording import call_site, group_text, ranks_text, shape_text

ALIGNED_KIND = {"skipped": "not_issued", "extra": "extra_op"}
# A sibling group breaks a tie only where it ran what this group ran at its last
# STEP_CHECK agreed collectives (looked for among the STEP_CHECK_READ before the tie).
STEP_CHECK = 4
STEP_CHECK_READ = 16


def divergences(facts: Facts) -> list[Finding]:
    """The rule: each group's first divergence, as a mismatch or as ranks that never issued an op."""
    findings: list[Finding] = []
    past = PastBudget(OWN_PAST_BUDGET)
    for view in facts.device.views:
        index = facts.divergence_at[view.group.id]
        if index is None:
            continue
        matches = facts.collectives_of(view)
        siblings = facts.siblings_of(view)
        if matches[index].disagreement is not None:
            findings.extend(mismatch(view, matches, index, siblings, past))
        else:
            skipped = gap(view, matches, index)
            if skipped:
                findings.extend(skipped)
            elif (missing := absence(facts, view, matches, index, siblings)) is not None:
                findings.append(missing)
    return findings


# --------------------------------------------------------------------------- alignment


def _consensus_after(matches: list[CollectiveMatch], start: int) -> list[Signature]:
    """Majority signature of each op from index `start` on, until the majority stops."""
    consensus = []
    for match in matches[start:]:
        covering = len(match.calls) + len(match.not_issued)
        if 2 * len(match.calls) < covering or not match.calls:
            break
        counts: dict[Signature, int] = defaultdict(int)
        for entries in match.calls.values():
            signature = batch_signature(entries)
            if signature is not None:  # unreadable: no vote
                counts[signature] += 1
        if not counts:
            break
        consensus.append(max(counts.items(), key=lambda kv: kv[1])[0])
    return consensus


def _rank_signatures_after(view: GroupView, rank: int, seq: int) -> list[Signature]:
    stream = view.streams[rank]
    return [batch_signature(stream.collectives[s]) for s in sorted(stream.collectives) if s >= seq]


def _alignment(view: GroupView, matches: list[CollectiveMatch], index: int, rank: int) -> Optional[str]:
    """'skipped' when the rank's ops from here on are the majority's minus one op,
    'extra' when they are the majority's plus one, None when neither fits."""
    mine = _rank_signatures_after(view, rank, matches[index].seq)
    theirs = _consensus_after(matches, index)
    if mine and len(mine) < len(theirs) and mine == theirs[1 : 1 + len(mine)]:
        return "skipped"
    if len(mine) > len(theirs) and mine[1 : 1 + len(theirs)] == theirs:
        return "extra"
    return None


def _agreed_before(matches: list[CollectiveMatch], index: int) -> list[tuple[int, Signature]]:
    """(number, signature) of the group's last STEP_CHECK collectives before `matches[index]`
    that every member issued alike: where the group stands in its program, for the sibling
    groups to be compared with."""
    agreed: list[tuple[int, Signature]] = []
    for match in reversed(matches[max(0, index - STEP_CHECK_READ):index]):
        signature = agreed_signature(match)
        if signature is not None:
            agreed.append((match.seq, signature))
            if len(agreed) == STEP_CHECK:
                break
    return agreed


def _break_tie(match: CollectiveMatch, siblings: list[CollectiveMatch]) -> Optional[Disagreement]:
    """Two equal camps have no majority; sibling groups (same description, e.g. the
    other pipeline pairs) running the same program at the same sequence number show
    which camp did what everyone else did."""
    dis = match.disagreement
    assert dis is not None
    votes: dict[Signature, int] = defaultdict(int)
    for sibling in siblings:
        if sibling.disagreement is None and sibling.calls:
            votes[batch_signature(next(iter(sibling.calls.values())))] += 1
    if not votes:
        return None
    reference, count = max(votes.items(), key=lambda kv: kv[1])
    if 2 * count <= sum(votes.values()):
        return None
    agreeing = [ranks for ranks, sig in dis.classes if sig == reference]
    if len(agreeing) != 1:
        return None
    majority = agreeing[0]
    odd = tuple(sorted(r for ranks, _ in dis.classes if ranks != majority for r in ranks))
    return Disagreement(dis.kind, majority, odd, dis.classes, False)


def _call_sites(suspect_entry: Any, peer_entry: Any) -> dict[str, str]:
    sites = {}
    suspect, peer = call_site(suspect_entry), call_site(peer_entry)
    if suspect:
        sites["suspect_call_site"] = suspect
    if peer:
        sites["peer_call_site"] = peer
    return sites


def _call_entries(suspect_entry: Any, peer_entry: Any) -> dict[str, Entry]:
    """The entries `_call_sites` read, under the same keys (for `-v`)."""
    return {key: entry for key, entry in (("suspect_call_site", suspect_entry), ("peer_call_site", peer_entry))
            if entry is not None and entry.frames}


# --------------------------------------------------------------------------- mismatches


def mismatch(view: GroupView, matches: list[CollectiveMatch], index: int, siblings: Siblings,
             past: PastBudget) -> list[Finding]:
    """Members issued different ops, sizes or dtypes at one sequence number. A minority
    whose later ops line up with the majority's after one op more or less skipped or
    added that op: it is told so, not called a mismatch. An even split is broken by the
    sibling groups, then by an entry that contradicts itself, then by the group's own
    past (`past`: what this diagnosis may still read of it)."""
    match = matches[index]
    dis = match.disagreement
    assert dis is not None
    tie_broken_by = 0
    contradicted = None
    own_past = None
    shown = _Shown(match, dis)
    if dis.tie:
        sibling_matches = siblings.in_step_at(match.seq, _agreed_before(matches, index))
        resolved = _break_tie(match, sibling_matches)
        if resolved is not None:
            dis, tie_broken_by = resolved, len(sibling_matches)
        else:
            contradicted = _break_tie_by_contradiction(view, dis, shown)
            if contradicted is not None:
                dis = contradicted[0]
            else:
                own_past = _break_tie_by_own_past(matches, index, dis, past)
                if own_past is not None:
                    dis = own_past[0]
    odd_by_kind: dict[str, list[int]] = defaultdict(list)
    for rank in dis.odd_ranks:
        aligned = None if dis.tie else _alignment(view, matches, index, rank)
        odd_by_kind[ALIGNED_KIND.get(aligned or "", dis.kind)].append(rank)
    majority_entry = shown.entry(dis.majority_ranks[0]) if dis.majority_ranks else None
    findings = []
    for kind, odd in sorted(odd_by_kind.items()):
        ranks = tuple(odd)
        odd_entry = shown.entry(ranks[0])
        evidence: dict[str, Any] = {
            "classes": [
                {"ranks": list(r), "entry": shown.text(r[0]), "profiling_name": shown.entry(r[0]).name.profiling_name}
                for r, _sig in dis.classes
            ],
            "tie": dis.tie,
        }
        if shown.position:
            evidence["batch_position"] = shown.position
        if tie_broken_by:
            evidence["tie_broken_by_sibling_groups"] = tie_broken_by
        if contradicted is not None:
            evidence["tie_broken_by_contradiction"] = contradicted[1]
        if own_past is not None:
            evidence["tie_broken_by_own_past"] = own_past[1]
        evidence.update(_call_sites(odd_entry, majority_entry))
        findings.append(new_finding(
            kind, _mismatch_rule(dis.tie, kind), view, op=(majority_entry or odd_entry).op,
            collective_seq_id=match.seq, p2p_seq_id=None, ranks=tuple(sorted(match.calls)), suspect_ranks=ranks,
            message=_mismatch_message(view, match, dis, kind, ranks, shown) + _own_past_note(own_past), evidence=evidence,
            waiting_ranks=dis.majority_ranks, age_ns=oldest_created(match),
            call_entries=_call_entries(odd_entry, majority_entry),
        ))
    return findings


class _Shown:
    """The op of each rank's batch a mismatch message shows: the first one the classes
    differ in (a coalesced batch's first ops may well agree), written so that two
    classes never read alike (with output sizes where input sizes and dtypes agree)."""

    def __init__(self, match: CollectiveMatch, dis: Disagreement) -> None:
        self.calls = match.calls
        signatures = [sig for _, sig in dis.classes]
        length = min(len(sig) for sig in signatures)
        self.position = next((k for k in range(length) if len({sig[k] for sig in signatures}) > 1), length)
        firsts = [self.entry(ranks[0]) for ranks, _ in dis.classes]
        self.full = len({shape_text(e) for e in firsts}) < len(firsts)

    def entry(self, rank: int) -> Any:
        ops = [e for e in self.calls[rank] if not e.name.is_coalesced_marker] or list(self.calls[rank])
        return ops[min(self.position, len(ops) - 1)]

    def text(self, rank: int) -> str:
        entry = self.entry(rank)
        return _full_text(entry) if self.full else shape_text(entry)


def _full_text(entry: Any) -> str:
    """`all_reduce [[4, 4]] -> [[5, 4]] Float`: shape_text with the output sizes too."""
    shapes = entry.shapes
    dtypes = sorted(set(shapes.input_dtypes) | set(shapes.output_dtypes))
    sizes = f"{[list(s) for s in shapes.input_sizes]} -> {[list(s) for s in shapes.output_sizes]}"
    return f"{entry.op} {sizes} {'/'.join(dtypes)}".rstrip()


def _break_tie_by_contradiction(view: GroupView, dis: Disagreement, shown: _Shown) -> Optional[tuple[Disagreement, str]]:
    """(the disagreement with a majority, why) when every camp but one recorded an entry
    its own op and the group's size rule out (see entry_checks): those camps are the odd
    ones out, whatever their number. None when that does not single out one camp."""
    size = trusted_size(view.group)
    reasons = []
    for ranks, _sig in dis.classes:
        entry = shown.entry(ranks[0])
        reasons.append(contradiction(entry.name, entry.shapes, size))
    sound = [ranks for (ranks, _sig), reason in zip(dis.classes, reasons) if reason is None]
    if len(sound) != 1:
        return None
    majority = sound[0]
    odd = tuple(sorted(r for ranks, _ in dis.classes if ranks != majority for r in ranks))
    why = next(f"{ranks_text(ranks)}: {reason}" for (ranks, _), reason in zip(dis.classes, reasons) if reason)
    return Disagreement(dis.kind, majority, odd, dis.classes, False), why


# The group's own matches a tie is weighed against, at most (the newest first): a
# training step repeats its ops, and a few steps of a ring buffer hold all there is.
OWN_PAST_MATCHES = 4096
# How often the group must have issued a camp's op before for its past to speak: once
# may be a one-off (a first bucket, a warm-up op); twice is a program repeating it.
OWN_PAST_TIMES = 2
# The earlier ops one diagnosis reads for this, across its groups (about 3 us each): a job
# whose thousands of pairs all split at once (two halves launched with different dtypes)
# must not read thousands of ops for each. Ties past it stay ties.
OWN_PAST_BUDGET = 200_000


@dataclass(slots=True)
class PastBudget:
    """What is left of OWN_PAST_BUDGET in one diagnosis (`divergences` makes one)."""

    left: int


def _break_tie_by_own_past(matches: list[CollectiveMatch], index: int, dis: Disagreement,
                           past: PastBudget) -> Optional[tuple[Disagreement, int]]:
    """(the disagreement with a majority, how often the group issued that camp's op before)
    when, among the ops the group's members issued alike before this one, exactly one
    camp's op (its name, sizes and dtypes) appears, at least OWN_PAST_TIMES, and no other
    camp's ever does: a training program repeats its steps, so a camp issuing what the
    group never ran is the odd one. None when more than one camp's op, or none, ran
    before (a program that uses both may be at either), or one ran only once, or `past`
    has too little left to read the group's (a part of it might decide otherwise)."""
    window = matches[max(0, index - OWN_PAST_MATCHES):index]
    if len(window) > past.left:
        return None
    past.left -= len(window)
    wanted: dict[Signature, tuple[int, ...]] = {sig: ranks for ranks, sig in dis.classes}
    seen: dict[Signature, int] = defaultdict(int)
    for earlier in reversed(window):
        signature = agreed_signature(earlier)
        if signature in wanted:
            seen[signature] += 1
            if len(seen) > 1:
                return None
    if len(seen) != 1:
        return None
    (signature, times), = seen.items()
    if times < OWN_PAST_TIMES:
        return None
    majority = wanted[signature]
    odd = tuple(sorted(r for ranks, _ in dis.classes if ranks != majority for r in ranks))
    return Disagreement(dis.kind, majority, odd, dis.classes, False), times


def _own_past_note(own_past: Optional[tuple[Disagreement, int]]) -> str:
    if own_past is None:
        return ""
    dis, times = own_past
    return (f" (an even split: the group issued {ranks_text(dis.majority_ranks)}'s op {times} "
            f"time{'s' if times != 1 else ''} before and {ranks_text(dis.odd_ranks)}'s never)")


def _mismatch_rule(tie: bool, kind: str) -> str:
    if tie:
        return "divergence.mismatch_tie"
    return {"not_issued": "divergence.skipped_one_op", "extra_op": "divergence.added_one_op"}.get(kind, "divergence.mismatch")


def _mismatch_message(view: GroupView, match: CollectiveMatch, dis: Disagreement, kind: str, ranks: tuple[int, ...],
                      shown: _Shown) -> str:
    odd_entry = shown.entry(ranks[0])
    majority_entry = shown.entry(dis.majority_ranks[0]) if dis.majority_ranks else odd_entry
    group = group_text(view.group.name, view.group.desc)
    if dis.tie:
        return (f"tie at {group} #{match.seq}: no majority — "
                + " vs ".join(f"{ranks_text(r)} {shown.text(r[0])}" for r, _ in dis.classes))
    if kind == "not_issued":
        return (f"{ranks_text(ranks)} skipped {majority_entry.op} #{match.seq} in {group}: "
                f"its next op lines up with the majority's #{match.seq + 1}")
    if kind == "extra_op":
        return (f"{ranks_text(ranks)} issued an extra {odd_entry.op} at #{match.seq} in {group} "
                f"that {ranks_text(dis.majority_ranks)} never issued")
    what = kind.replace("_mismatch", "")
    return (f"{what} mismatch at {group} #{match.seq}: {ranks_text(ranks)} issued {shown.text(ranks[0])}, "
            f"{ranks_text(dis.majority_ranks)} issued {shown.text(dis.majority_ranks[0])}")


# --------------------------------------------------------------------------- presence


def gap(view: GroupView, matches: list[CollectiveMatch], index: int) -> list[Finding]:
    """A member missing from #seq but present later skipped it: report it as such."""
    match = matches[index]
    skipped = [r for r in match.not_issued if (view.streams[r].last_seq or 0) > match.seq]
    if not skipped or 2 * len(match.calls) < len(match.calls) + len(match.not_issued):
        return []
    entry = match.calls[match.issued[0]][0]
    return [new_finding(
        "not_issued", "divergence.gap", view, op=entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(match.issued + tuple(skipped))), suspect_ranks=tuple(skipped),
        message=(f"{ranks_text(skipped)} never issued {entry.op} #{match.seq} in {group_text(view.group.name, view.group.desc)} "
                 f"but went on to later ops (a gap in its sequence numbers)"),
        evidence={"issued_ranks": list(match.issued), "not_issued_ranks": list(skipped)},
        waiting_ranks=match.issued, age_ns=oldest_created(match), absent_ranks=tuple(skipped),
    )]


def absence(facts: Facts, view: GroupView, matches: list[CollectiveMatch], index: int,
            siblings: Siblings) -> Optional[Finding]:
    """Some members issued op #seq and others never did: the majority waits for the rest
    (`not_issued`), or a minority went ahead (`extra_op`). On an even split, an op every
    sibling group issued belongs to the program, so whoever lacks it is behind; else
    ranks that did not arrive because they wait in another op for the ranks that did
    issue it (a deadlock the others caused by going ahead) are not behind, the others
    went ahead. Ranks waiting in another op for something else are merely held up.
    None where the minority that issued it only looks ahead: the rest hold it queued
    behind the op they are in (their programs have it; their GPUs are not there yet)."""
    match = matches[index]
    issued, missing = match.issued, match.not_issued
    have = siblings.any_ran(match.seq)
    elsewhere = _BlockedElsewhere(facts.blocked_entry, (view.group.name, False))
    tie = len(issued) == len(missing)
    waiting_on_them = (tie and not have and all(rank in elsewhere for rank in missing)
                       and all(facts.waits.closure([rank]) & set(issued) for rank in missing))
    idle_like_their_places = (tie and not have and not waiting_on_them and _idle(facts, missing)
                              and _idle_in_every_like_place(facts, view, siblings, missing))
    ahead = waiting_on_them or idle_like_their_places
    if 2 * len(issued) < len(issued) + len(missing) or ahead:
        if len(facts.queued_at(view, match.seq, missing)) == len(missing):
            return never_issued(facts, view, match, tie, have) if tie else None
        if not tie and _held_up_elsewhere(facts, elsewhere, issued, missing):
            return never_issued(facts, view, match, tie, have)
        return went_ahead(view, match, tie, idle_like_their_places)
    return never_issued(facts, view, match, tie, have)


def _held_up_elsewhere(facts: Facts, elsewhere: Container[int], issued: tuple[int, ...],
                       missing: tuple[int, ...]) -> bool:
    """Every rank that never issued the op waits in another op, and none of them waits,
    even through others, on a rank that issued it: they are behind for reasons of their
    own (two GPUs that stopped at once), not because the few that issued it went ahead
    (ranks that did go ahead hold up the rest: the rest wait on them)."""
    return (facts.reliable and all(rank in elsewhere for rank in missing)
            and not facts.waits.closure(missing) & set(issued))


def _idle_in_every_like_place(facts: Facts, view: GroupView, siblings: Siblings, ranks: tuple[int, ...]) -> bool:
    """Every sibling group's member in each of `ranks`' places (its position in the group;
    siblings are as large) has a dump and waits in nothing either. Where no sibling group
    ran the op (the caller's question), that is where this part of the program ends:
    `ranks` being idle there says nothing of a hang, and the ranks that issued the op are
    off the program."""
    places = [view.group.ranks.index(rank) for rank in ranks]
    others = [(sibling, sibling.group.ranks[place]) for sibling in siblings.views for place in places]
    return bool(others) and all(rank in sibling.streams and rank not in facts.blocked_entry for sibling, rank in others)


def _idle(facts: Facts, ranks: tuple[int, ...]) -> bool:
    """Every one of `ranks` finished every op it issued: it waits in nothing, it stopped
    issuing (a host-side hang), so it is behind, whatever the count of ranks says."""
    return facts.reliable and bool(ranks) and not any(rank in facts.blocked_entry for rank in ranks)


def _presence_evidence(view: GroupView, match: CollectiveMatch) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "issued_ranks": list(match.issued),
        "not_issued_ranks": list(match.not_issued),
        "completed_ranks": list(match.completed_ranks),
    }
    if match.no_dump:
        evidence["no_dump_ranks"] = list(match.no_dump)
    for rank in match.not_issued:
        last = last_entry(view, rank)
        if last is not None:
            evidence.setdefault("last_seq_of_suspects", {})[str(rank)] = last.collective_seq_id
    return evidence


def went_ahead(view: GroupView, match: CollectiveMatch, tie: bool, idle_like_their_places: bool = False) -> Finding:
    """A minority issued an op its peers never issued: it is ahead, a desync. An even
    split is so where the others wait on it, or (`idle_like_their_places`) wait in
    nothing, as every sibling group's ranks in their places do."""
    issued, missing = match.issued, match.not_issued
    peer_entry = match.calls[issued[0]][0]
    evidence = _presence_evidence(view, match)
    if tie and idle_like_their_places:
        evidence["tie_broken_by"] = ("the other ranks wait in nothing, as do the ranks in their places in every "
                                     "sibling group, none of which issued the op")
        evidence["idle_like_their_places"] = True
    elif tie:
        evidence["tie_broken_by"] = "the other ranks are waiting in another op"
    evidence.update(_call_sites(peer_entry, last_entry(view, missing[0])))
    message = (
        f"{ranks_text(issued)} issued an extra {peer_entry.op} #{match.seq} in {group_text(view.group.name, view.group.desc)} "
        f"that {ranks_text(missing)} never issued (they stop at #{match.seq - 1}); "
        f"{'it is' if len(issued) == 1 else 'they are'} ahead: a desync"
    )
    return new_finding(
        "extra_op", "divergence.went_ahead", view, op=peer_entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(issued + missing)), suspect_ranks=issued, message=message,
        evidence=evidence, waiting_ranks=issued, age_ns=oldest_created(match), absent_ranks=missing,
        call_entries=_call_entries(peer_entry, last_entry(view, missing[0])),
    )


def skipped_not_ahead(facts: Facts, findings: list[Finding], went_past: WentPastJudge) -> list[Finding]:
    """`findings`, where an even split read as ranks going ahead (`went_ahead`: the ranks
    that did not arrive wait in another op, for the ranks that did) has its absent ranks
    shown by their own programs to have gone past the op: they skipped it, and the ranks
    that issued it wait for them (`never_issued`). A rank that skipped an op and went on
    to an op of another group that its peers there have not reached makes the same two
    splits as a rank that went ahead would: its program tells which."""
    ties = [f for f in findings if f.rule == "divergence.went_ahead" and "tie_broken_by" in f.facts
            and f.group_id is not None and f.collective_seq_id is not None]
    if not ties:
        return findings
    instead: dict[int, Finding] = {}
    for finding, gone in zip(ties, went_past([(f, f.absent_ranks) for f in ties])):
        if set(gone) != set(finding.absent_ranks) or not all(past.confirmed for past in gone.values()):
            continue
        assert finding.group_id is not None and finding.collective_seq_id is not None
        view = facts.device.views[finding.group_id]
        match = facts.index.at.get((finding.group_id, finding.collective_seq_id))
        if match is not None:
            instead[id(finding)] = never_issued(facts, view, match, True, facts.siblings_of(view).any_ran(match.seq))
    return [instead.get(id(finding), finding) for finding in findings]


def never_issued(facts: Facts, view: GroupView, match: CollectiveMatch, tie: bool, siblings_have_it: bool) -> Finding:
    """The majority issued an op and waits in it; the rest never issued it."""
    issued, missing = match.issued, match.not_issued
    peer_entry = match.calls[issued[0]][0]
    evidence = _presence_evidence(view, match)
    evidence.update(_call_sites(last_entry(view, missing[0]), peer_entry))
    waiting = tuple(r for r in issued if not (facts.reliable and r in match.completed_ranks)) or issued
    if siblings_have_it:
        evidence["siblings_issued_it"] = True
    # Ranks whose whole dumps hold an op of that number, queued behind the one they are
    # blocked in: it never reached their GPU, which is all the device view can say.
    queued = facts.queued_at(view, match.seq, missing)
    unissued = tuple(rank for rank in missing if rank not in queued)
    message = (f"{ranks_text(unissued or queued)} never {'issued' if unissued else 'started'} {peer_entry.op} "
               f"#{match.seq} in {group_text(view.group.name, view.group.desc)}; "
               f"{_waiting_text(issued, () if facts.reliable else _retired_by(match, issued))}")
    if queued:
        message += _queued_note(queued, named=not unissued)
        evidence["queued_ranks"] = list(queued)
    if tie and _idle(facts, missing):
        tie = False
        one = len(missing) == 1
        message += f"; {'it' if one else 'they'} finished every op {'it' if one else 'they'} issued and {'waits' if one else 'wait'} in none"
        evidence["idle_ranks"] = list(missing)
    if tie:
        evidence["tie"] = True
    return new_finding(
        "not_issued", "divergence.never_issued", view, op=peer_entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(issued + missing)), suspect_ranks=missing, message=message,
        evidence=evidence, waiting_ranks=waiting, age_ns=oldest_created(match), absent_ranks=missing,
        tie=tie, siblings_issued_it=siblings_have_it, call_entries=_call_entries(last_entry(view, missing[0]), peer_entry),
    )


def _retired_by(match: CollectiveMatch, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Those of `ranks` whose every call of the op is retired: in dumps that do not say
    when ops finish (gloo), that is also what an op that timed out looks like."""
    return tuple(rank for rank in ranks if all(call.retired for call in match.calls[rank]))


def _waiting_text(issued: tuple[int, ...], retired: tuple[int, ...]) -> str:
    """Where the ranks that issued an op are: waiting in it, unless their dumps hold it
    retired (then the report's rank table lists them blocked in nothing, and so does this)."""
    waiting = tuple(rank for rank in issued if rank not in retired)
    if not retired:
        return f"{ranks_text(issued)} {'is' if len(issued) == 1 else 'are'} waiting in it"
    timed_out = "as an op that timed out is retired too"
    if not waiting:
        return f"{ranks_text(issued)} issued it and retired it, {timed_out}"
    return (f"{ranks_text(waiting)} {'is' if len(waiting) == 1 else 'are'} waiting in it and "
            f"{ranks_text(retired)} retired it, {timed_out}")


def _queued_note(queued: tuple[int, ...], named: bool) -> str:
    """What the message adds of ranks holding an op of the number queued (`named`: they
    are the ranks its head names)."""
    one = len(queued) == 1
    holds = f"{'holds' if one else 'hold'} an op of that number queued behind the one {'it waits' if one else 'they wait'} in"
    return f" ({'it' if one else 'they'} {holds})" if named else f"; {ranks_text(queued)} {holds}"


class _BlockedElsewhere(Container[int]):
    """The ranks blocked in an op other than `place` ((group name, is_p2p)): a view of
    `Facts.blocked_entry`, since a set per group would cost ranks x groups."""

    __slots__ = ("blocked", "place")

    def __init__(self, blocked: dict[int, Entry], place: tuple[str, bool]):
        self.blocked = blocked
        self.place = place

    def __contains__(self, rank: object) -> bool:
        entry = self.blocked.get(rank)  # type: ignore[call-overload]
        return entry is not None and (entry.pg_name, entry.is_p2p) != self.place
