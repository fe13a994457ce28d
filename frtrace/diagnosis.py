"""Turn matched operations into findings and one verdict.

Takes an `Analysis` (loaded dumps, layout, matches); returns a `Diagnosis`: findings
in the DESIGN.md §3 vocabulary, each marked as a root cause or as a consequence of
another, the primary suspect ranks, and a status (healthy | faults | inconclusive).

Attribution is by consensus among the members of each group, never relative to a
reference rank: per group, the first sequence number where members disagree or some
never issued the op is the divergence; the odd ranks out are the suspects, and a
rank that skipped or added one op is told apart from one that issued a different op
by aligning its ops with the majority's, the way `diff` aligns lines. Across groups,
a suspect that is itself waiting in another group's unfinished op is a victim: the
finding is reported as a consequence of that one; unless the suspect went past the
op, which the program order shows: ranks that play the same part (or, with none, its
own earlier steps) issued the op where it issued something else.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from typing import Callable, Container, Optional

from .builder import Layout
from .clocks import estimate_clock_offsets
from .matcher import CollectiveMatch, Disagreement, GroupView, MatchResult, batch_signature
from .matcher import match as match_dumps
from .model import Entry, RankDump
from .pipeline import Analysis
from .util import fold_ranks, plural

SEVERITY = {
    "missing_dump": "error", "not_issued": "error", "extra_op": "error", "op_mismatch": "error",
    "size_mismatch": "error", "dtype_mismatch": "error", "p2p_unmatched": "error", "stuck": "error",
    "straggler": "warning",
}
NEXT_STEP = {
    "not_issued": "look at what rank(s) {suspects} were doing instead (the suspect call site above, their last entries with -j, or py-spy dump on the live process)",
    "extra_op": "find the code path that lets rank(s) {suspects} issue one more collective than their peers (a rank-dependent branch or loop count)",
    "op_mismatch": "make every rank call the same collective at this point: look for a rank-dependent branch around the call site",
    "size_mismatch": "check how the tensor passed by rank(s) {suspects} is sized (uneven batches or padding that depends on the rank)",
    "dtype_mismatch": "cast to one dtype before the collective on every rank",
    "missing_dump": "find out why rank(s) {suspects} wrote no dump (crashed, killed, or stuck before dumping): check their logs and exit codes",
    "p2p_unmatched": "check the pipeline schedule: the matching send/recv was never posted by rank(s) {suspects}",
    "stuck": "every member issued it and none finished: check the network and GPUs of ranks {suspects} (NCCL_DEBUG=INFO, link health)",
    "straggler": "profile rank(s) {suspects}: data loading, host contention or a slow GPU",
}
STRAGGLER_MIN_MS = 10.0
STRAGGLER_MIN_SAMPLES = 3
STRAGGLER_SAMPLE_PER_GROUP = 64
# Kinds that leave peers waiting on the suspects; they can be caused by a hang elsewhere.
TIE_NOTE = " (even split: the ranks that did not arrive are blamed, as they are behind)"
BLOCKING_KINDS = ("not_issued", "p2p_unmatched", "missing_dump", "extra_op")


@dataclass(slots=True)
class Finding:
    kind: str
    severity: str
    group_id: Optional[int]
    pg_name: str
    pg_desc: str
    op: Optional[str]
    collective_seq_id: Optional[int]
    p2p_seq_id: Optional[int]
    ranks: tuple  # every rank the finding is about
    suspect_ranks: tuple
    message: str
    evidence: dict = field(default_factory=dict)
    waiting_ranks: tuple = ()  # ranks that issued the op and wait for the suspects
    # Ranks whose absence the finding is about (who never issued the op); when they are
    # all waiting somewhere else, this finding is a consequence of that other one.
    absent_ranks: tuple = ()
    # The entry the finding is about (for P2P, the posted send or recv): it locates the
    # same op in sibling groups when deciding whether an absent rank went past it.
    anchor: Optional[Entry] = None
    age_ns: int = 0  # creation time of the oldest entry involved: older roots come first
    # While linking: index of the root finding; afterwards a short description of it
    # ("not_issued in group 2 #3"), as findings are re-sorted for the report.
    caused_by: Optional[object] = None

    @property
    def is_root(self) -> bool:
        return self.caused_by is None


@dataclass(slots=True)
class Diagnosis:
    status: str  # healthy | faults | inconclusive
    suspect_ranks: tuple
    verdict: str
    findings: list  # roots first, then consequences, then notes


# --------------------------------------------------------------------------- helpers


def _dumps(analysis: Analysis) -> list:
    """The dumps that take part (the builder sets aside files with an implausible rank)."""
    return analysis.layout.usable(analysis.load.dumps)


def _completion_is_reliable(analysis: Analysis) -> bool:
    """gloo never moves entries past `scheduled` and retires even timed-out ops, so
    only producers that report started/completed states tell waiting from finished."""
    for dump in _dumps(analysis):
        for entry in dump.entries:
            if entry.state in ("started", "completed") or entry.time_completed_ns:
                return True
    return False


def user_frame(entry: Optional[Entry]):
    """The innermost frame outside torch itself: where the user's code made the call."""
    if entry is None or not entry.frames:
        return None
    for frame in entry.frames:
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and not path.startswith("<"):
            return frame
    return entry.frames[-1]


def _frame_text(frame) -> Optional[str]:
    return f"{frame.filename}:{frame.line} in {frame.name}" if frame else None


def _shape_text(entry: Entry) -> str:
    sizes = [list(s) for s in entry.shapes.input_sizes]
    dtypes = sorted(set(entry.shapes.input_dtypes) | set(entry.shapes.output_dtypes))
    return f"{entry.op} {sizes} {'/'.join(dtypes)}".rstrip()


def _group_text(view: GroupView) -> str:
    group = view.group
    return f"group {group.name} ({group.desc})" if group.desc else f"group {group.name}"


def _ranks_text(ranks) -> str:
    ranks = tuple(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {fold_ranks(ranks)}"


def _last_entry(view: GroupView, rank: int) -> Optional[Entry]:
    stream = view.streams.get(rank)
    if stream is None or not stream.collectives:
        return None
    return stream.collectives[stream.last_seq][-1]


def _new_finding(kind: str, view: Optional[GroupView], **fields) -> Finding:
    group = view.group if view else None
    return Finding(
        kind=kind,
        severity=fields.pop("severity", SEVERITY.get(kind, "info")),
        group_id=group.id if group else None,
        pg_name=group.name if group else "",
        pg_desc=group.desc if group else "",
        **fields,
    )


def _call_sites(suspect_entry: Optional[Entry], peer_entry: Optional[Entry]) -> dict:
    sites = {}
    if user_frame(suspect_entry):
        sites["suspect_call_site"] = _frame_text(user_frame(suspect_entry))
    if user_frame(peer_entry):
        sites["peer_call_site"] = _frame_text(user_frame(peer_entry))
    return sites


# --------------------------------------------------------------------------- alignment


def _consensus_after(matches: list, start: int) -> list:
    """Majority signature of each op from index `start` on, until the majority stops."""
    consensus = []
    for match in matches[start:]:
        covering = len(match.calls) + len(match.not_issued)
        if 2 * len(match.calls) < covering or not match.calls:
            break
        counts: dict = defaultdict(int)
        for entries in match.calls.values():
            signature = batch_signature(entries)
            if signature is not None:  # unreadable: no vote
                counts[signature] += 1
        if not counts:
            break
        consensus.append(max(counts.items(), key=lambda kv: kv[1])[0])
    return consensus


def _rank_signatures_after(view: GroupView, rank: int, seq: int) -> list:
    stream = view.streams[rank]
    return [batch_signature(stream.collectives[s]) for s in sorted(stream.collectives) if s >= seq]


def _alignment(view: GroupView, matches: list, index: int, rank: int) -> Optional[str]:
    """'skipped' when the rank's ops from here on are the majority's minus one op,
    'extra' when they are the majority's plus one, None when neither fits."""
    mine = _rank_signatures_after(view, rank, matches[index].seq)
    theirs = _consensus_after(matches, index)
    if mine and len(mine) < len(theirs) and mine == theirs[1 : 1 + len(mine)]:
        return "skipped"
    if len(mine) > len(theirs) and mine[1 : 1 + len(theirs)] == theirs:
        return "extra"
    return None


# --------------------------------------------------------------------------- per group


def _break_tie(match: CollectiveMatch, siblings: list) -> Optional[Disagreement]:
    """Two equal camps have no majority; sibling groups (same description, e.g. the
    other pipeline pairs) running the same program at the same sequence number show
    which camp did what everyone else did."""
    dis = match.disagreement
    votes: dict = defaultdict(int)
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


def _mismatch_findings(view: GroupView, matches: list, index: int, siblings: list = ()) -> list:
    match = matches[index]
    dis = match.disagreement
    tie_broken_by = 0
    if dis.tie:
        resolved = _break_tie(match, siblings)
        if resolved is not None:
            dis, tie_broken_by = resolved, len(siblings)
    findings = []
    odd_by_kind: dict = defaultdict(list)
    for rank in dis.odd_ranks:
        aligned = None if dis.tie else _alignment(view, matches, index, rank)
        odd_by_kind[{"skipped": "not_issued", "extra": "extra_op"}.get(aligned, dis.kind)].append(rank)
    majority_entry = match.calls[dis.majority_ranks[0]][0] if dis.majority_ranks else None
    for kind, ranks in sorted(odd_by_kind.items()):
        ranks = tuple(ranks)
        odd_entry = match.calls[ranks[0]][0]
        evidence = {
            "classes": [
                {"ranks": list(r), "entry": _shape_text(match.calls[r[0]][0]), "profiling_name": match.calls[r[0]][0].name.profiling_name}
                for r, _sig in dis.classes
            ],
            "tie": dis.tie,
        }
        if tie_broken_by:
            evidence["tie_broken_by_sibling_groups"] = tie_broken_by
        evidence.update(_call_sites(odd_entry, majority_entry))
        where = f"{_group_text(view)} #{match.seq}"
        if dis.tie:
            message = (
                f"tie at {where}: no majority — "
                + " vs ".join(f"{_ranks_text(r)} {_shape_text(match.calls[r[0]][0])}" for r, _ in dis.classes)
            )
            suspects = ranks
        elif kind == "not_issued":
            message = (
                f"{_ranks_text(ranks)} skipped {majority_entry.op} #{match.seq} in {_group_text(view)}: "
                f"its next op lines up with the majority's #{match.seq + 1}"
            )
            suspects = ranks
        elif kind == "extra_op":
            message = (
                f"{_ranks_text(ranks)} issued an extra {odd_entry.op} at #{match.seq} in {_group_text(view)} "
                f"that {_ranks_text(dis.majority_ranks)} never issued"
            )
            suspects = ranks
        else:
            what = kind.replace("_mismatch", "")
            message = (
                f"{what} mismatch at {where}: {_ranks_text(ranks)} issued {_shape_text(odd_entry)}, "
                f"{_ranks_text(dis.majority_ranks)} issued {_shape_text(majority_entry)}"
            )
            suspects = ranks
        findings.append(_new_finding(
            kind, view, op=(majority_entry or odd_entry).op, collective_seq_id=match.seq, p2p_seq_id=None,
            ranks=tuple(sorted(match.calls)), suspect_ranks=suspects, message=message, evidence=evidence,
            waiting_ranks=dis.majority_ranks, age_ns=min(e[0].time_created_ns for e in match.calls.values()),
        ))
    return findings


def _presence_finding(view: GroupView, matches: list, index: int, reliable: bool,
                      waiting_elsewhere: Container = frozenset(), siblings_have_it: bool = False) -> Finding:
    """Some members issued op #seq and others never did."""
    match = matches[index]
    issued, missing = match.issued, match.not_issued
    peer_entry = match.calls[issued[0]][0]
    age = min(e[0].time_created_ns for e in match.calls.values())
    evidence = {
        "issued_ranks": list(issued),
        "not_issued_ranks": list(missing),
        "completed_ranks": list(match.completed_ranks),
    }
    if match.no_dump:
        evidence["no_dump_ranks"] = list(match.no_dump)
    for rank in missing:
        last = _last_entry(view, rank)
        if last is not None:
            evidence.setdefault("last_seq_of_suspects", {})[str(rank)] = last.collective_seq_id
    tie = len(issued) == len(missing)
    # On an even split: if sibling groups all issued this op it belongs to the program,
    # so whoever lacks it is behind (or skipped it). Otherwise ranks that did not
    # arrive because they wait in another op are not behind: the others went ahead.
    ahead = tie and not siblings_have_it and all(rank in waiting_elsewhere for rank in missing)
    if 2 * len(issued) < len(issued) + len(missing) or ahead:
        # The minority went ahead: it issued an op its peers never issued.
        if tie:
            evidence["tie_broken_by"] = "the other ranks are waiting in another op"
        evidence.update(_call_sites(peer_entry, _last_entry(view, missing[0])))
        message = (
            f"{_ranks_text(issued)} issued an extra {peer_entry.op} #{match.seq} in {_group_text(view)} "
            f"that {_ranks_text(missing)} never issued (they stop at #{match.seq - 1}); "
            f"{'it is' if len(issued) == 1 else 'they are'} ahead: a desync"
        )
        return _new_finding(
            "extra_op", view, op=peer_entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
            ranks=tuple(sorted(issued + missing)), suspect_ranks=issued, message=message,
            evidence=evidence, waiting_ranks=issued, age_ns=age, absent_ranks=missing,
        )
    evidence.update(_call_sites(_last_entry(view, missing[0]), peer_entry))
    waiting = tuple(r for r in issued if not (reliable and r in match.completed_ranks)) or issued
    if siblings_have_it:
        evidence["siblings_issued_it"] = True
    message = (
        f"{_ranks_text(missing)} never issued {peer_entry.op} #{match.seq} in {_group_text(view)}; "
        f"{_ranks_text(issued)} {'is' if len(issued) == 1 else 'are'} waiting in it"
    )
    if tie:
        message += TIE_NOTE
        evidence["tie"] = True
    return _new_finding(
        "not_issued", view, op=peer_entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(issued + missing)), suspect_ranks=missing, message=message,
        evidence=evidence, waiting_ranks=waiting, age_ns=age, absent_ranks=missing,
    )


def _frontier_findings(view: GroupView, matches: list, reliable: bool) -> list:
    """No divergence among the dumps: look at the newest op for hangs and missing dumps."""
    if not matches:
        return []
    last = matches[-1]
    if reliable:
        # Ranks may have enqueued more ops behind the one they wait in: the oldest
        # unfinished op is where the group stands.
        last = next((m for m in matches if len(m.completed_ranks) < len(m.calls)), last)
    issued = last.issued
    entry = last.calls[issued[0]][0]
    completed = last.completed_ranks
    age = min(e[0].time_created_ns for e in last.calls.values())
    waiting = tuple(r for r in issued if r not in completed)
    if last.no_dump:
        if reliable and not waiting:
            # About the ranks without a dump only: the others are the evidence that they took part.
            return [_new_finding(
                "missing_dump", view, severity="warning", op=entry.op, collective_seq_id=last.seq, p2p_seq_id=None,
                ranks=last.no_dump, suspect_ranks=(),
                message=(f"{_ranks_text(last.no_dump)} of {_group_text(view)} left no usable dump, but every op of the "
                         f"group up to #{last.seq} completed, so they took part; nothing here points at them"),
                evidence={"no_dump_ranks": list(last.no_dump), "last_completed_seq": last.seq}, age_ns=age,
            )]
        message = (
            f"{_ranks_text(last.no_dump)} left no usable dump, and {_ranks_text(issued)} "
            f"{'is' if len(issued) == 1 else 'are'} in {entry.op} #{last.seq} of {_group_text(view)} "
            f"waiting for {'it' if len(last.no_dump) == 1 else 'them'}"
        )
        if not reliable:
            message = (f"{_ranks_text(last.no_dump)} left no usable dump; {_ranks_text(issued)} last issued "
                       f"{entry.op} #{last.seq} of {_group_text(view)}, which cannot finish without {'it' if len(last.no_dump) == 1 else 'them'}")
        evidence = {"no_dump_ranks": list(last.no_dump), "issued_ranks": list(issued), "completed_ranks": list(completed)}
        evidence.update(_call_sites(None, entry))
        return [_new_finding(
            "missing_dump", view, op=entry.op, collective_seq_id=last.seq, p2p_seq_id=None,
            ranks=tuple(sorted(issued + last.no_dump)), suspect_ranks=last.no_dump, message=message,
            evidence=evidence, waiting_ranks=waiting or issued, age_ns=age, absent_ranks=last.no_dump,
        )]
    if completed or not issued:
        return []
    message = (f"every member of {_group_text(view)} issued {entry.op} #{last.seq} and none completed it: "
               "the network, a GPU or the communication library itself is stuck")
    severity = "error"
    if not reliable:
        severity = "info"
        message = (f"no member of {_group_text(view)} has retired {entry.op} #{last.seq} yet; "
                   f"{entry.name.backend or 'this backend'} gives no other progress signal, so this may just be the moment of the dump")
    return [_new_finding(
        "stuck", view, severity=severity, op=entry.op, collective_seq_id=last.seq, p2p_seq_id=None,
        ranks=issued, suspect_ranks=issued if severity == "error" else (), message=message,
        evidence={"issued_ranks": list(issued), "states": sorted({e[0].state for e in last.calls.values()})},
        waiting_ranks=issued, age_ns=age,
    )]


def _took_part_unrecorded(match: CollectiveMatch, reliable: bool) -> bool:
    """Every member that issued the op completed it, which a collective cannot do
    without the rest of its members: the ones with no entry for it took part, their
    dump just does not show it (dumped without collectives, or only active ops)."""
    return reliable and bool(match.calls) and len(match.completed_ranks) == len(match.calls)


def _diagnose_group(view: GroupView, matches: list, reliable: bool, siblings=None,
                    waiting_elsewhere: Container = frozenset()) -> list:
    for index, match in enumerate(matches):
        if match.disagreement is not None:
            return _mismatch_findings(view, matches, index, siblings.matches_at(match.seq) if siblings else [])
        if match.not_issued and not _took_part_unrecorded(match, reliable):
            have = any(m.calls and not m.not_issued for m in siblings.matches_at(match.seq)) if siblings else False
            return _gap_finding(view, matches, index) or [
                _presence_finding(view, matches, index, reliable, waiting_elsewhere, have)
            ]
    return _frontier_findings(view, matches, reliable)


def _gap_finding(view: GroupView, matches: list, index: int) -> list:
    """A member missing from #seq but present later skipped it: report it as such."""
    match = matches[index]
    skipped = [r for r in match.not_issued if (view.streams[r].last_seq or 0) > match.seq]
    if not skipped or 2 * len(match.calls) < len(match.calls) + len(match.not_issued):
        return []
    entry = match.calls[match.issued[0]][0]
    return [_new_finding(
        "not_issued", view, op=entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(match.issued + tuple(skipped))), suspect_ranks=tuple(skipped),
        message=(f"{_ranks_text(skipped)} never issued {entry.op} #{match.seq} in {_group_text(view)} "
                 f"but went on to later ops (a gap in its sequence numbers)"),
        evidence={"issued_ranks": list(match.issued), "not_issued_ranks": list(skipped)},
        waiting_ranks=match.issued, age_ns=min(e[0].time_created_ns for e in match.calls.values()),
        absent_ranks=tuple(skipped),
    )]


# --------------------------------------------------------------------------- P2P


def _p2p_findings(view: GroupView, p2p_matches: list, reliable: bool) -> list:
    findings, reported = [], set()
    for p2p in p2p_matches:
        present = p2p.send or p2p.recv
        if (p2p.send is None) == (p2p.recv is None) or (p2p.src, p2p.dst) in reported:
            continue
        # A completed op had its partner; the partner merely fell off a ring buffer.
        if reliable and present.completed:
            continue
        reported.add((p2p.src, p2p.dst))
        holder, absent = (p2p.src, p2p.dst) if p2p.send else (p2p.dst, p2p.src)
        absent_op = "recv" if p2p.send else "send"
        no_dump = absent in view.no_dump
        message = (
            f"rank {holder} posted {present.op} {p2p.src if p2p.src >= 0 else '?'}->{p2p.dst} "
            f"(p2p #{present.p2p_seq_id} in {_group_text(view)}) but rank {absent if absent >= 0 else '?'} never posted the matching {absent_op}"
            + (" (it has no dump)" if no_dump else "")
        )
        evidence = {"src": p2p.src, "dst": p2p.dst, "posted_by": holder, "missing_on": absent, "state": present.state}
        evidence.update(_call_sites(None, present))
        findings.append(_new_finding(
            "p2p_unmatched", view, op=present.op, collective_seq_id=None, p2p_seq_id=present.p2p_seq_id,
            ranks=tuple(sorted({holder, absent} - {-1})), suspect_ranks=(absent,) if absent >= 0 else (),
            message=message, evidence=evidence, waiting_ranks=(holder,), age_ns=present.time_created_ns,
            absent_ranks=(absent,) if absent >= 0 else (), anchor=present,
        ))
    return findings


# --------------------------------------------------------------------------- stragglers


def _recent_clean(matches: list, reliable: bool) -> list:
    """The group's newest collectives that every member issued alike and finished, at
    most STRAGGLER_SAMPLE_PER_GROUP: timing statistics need a sample, not every op, and
    the newest ops tell how ranks behave now."""
    clean = []
    for match in reversed(matches):
        if (match.disagreement is None and not match.no_dump
                and (not match.not_issued or _took_part_unrecorded(match, reliable))
                and (not reliable or len(match.completed_ranks) == len(match.calls))):
            clean.append(match)
            if len(clean) == STRAGGLER_SAMPLE_PER_GROUP:
                break
    clean.reverse()
    return clean


def _arrival_lateness(match: CollectiveMatch, offsets: dict) -> dict:
    """rank -> ms after the on-time arrival at one collective. On time is the median
    arrival; with two members it is the earlier one, as a median of two would make
    both ranks half late and half early."""
    ranks = match.calls.keys()
    created = [batch[0].time_created_ns for batch in match.calls.values()]
    if offsets:
        created = [t - offsets.get(rank, 0) for rank, t in zip(ranks, created)]
    on_time = min(created) if len(created) == 2 else statistics.median(created)
    return dict(zip(ranks, [(t - on_time) / 1e6 for t in created]))


def _typical_lateness(clean: list, offsets: dict) -> tuple:
    """(rank -> typical lateness in ms, rank -> all its samples), over every group the
    rank is in, two-member groups included. A straggler is late to every collective; a
    rank that merely waited for it is late only where it then meets others, so the
    median over all of a rank's collectives keeps such victims out."""
    samples_of = defaultdict(list)  # rank -> its lateness at each sample, in ms
    sampled_in = defaultdict(set)  # group id -> the ranks sampled there
    in_wide_group = set()
    for match in clean:
        if len(match.calls) < 2:
            continue
        for rank, ms in _arrival_lateness(match, offsets).items():
            samples_of[rank].append(ms)
        sampled_in[match.group_id].update(match.calls)
        if len(match.calls) > 2:
            in_wide_group.update(match.calls)
    groups_of = Counter(chain.from_iterable(sampled_in.values()))  # rank -> groups it was sampled in
    typical, samples = {}, {}
    for rank, values in samples_of.items():
        # One two-member group alone cannot say which of its two ranks is late.
        confirmed = groups_of[rank] >= 2 or rank in in_wide_group
        if len(values) >= STRAGGLER_MIN_SAMPLES and confirmed:
            typical[rank] = statistics.median(values)
            samples[rank] = values
    return typical, samples


def _straggler_findings(analysis: Analysis, clean: list) -> list:
    offsets = estimate_clock_offsets(clean) or None
    typical, lateness = _typical_lateness(clean, offsets or {})
    if len(typical) < 3:
        return []
    spread = statistics.median(abs(v) for v in typical.values())
    threshold = max(STRAGGLER_MIN_MS, 5 * spread)
    # "Consistently": late on at least two thirds of the collectives, not on one bad step.
    late = sorted(
        r for r, ms in typical.items()
        if ms >= threshold and 3 * sum(x >= threshold / 2 for x in lateness[r]) >= 2 * len(lateness[r])
    )
    if not late:
        return []
    worst = max(typical[r] for r in late)
    return [_new_finding(
        "straggler", None, op=None, collective_seq_id=None, p2p_seq_id=None, ranks=tuple(late), suspect_ranks=tuple(late),
        message=(f"{_ranks_text(late)} consistently {'issues' if len(late) == 1 else 'issue'} collectives late: typically "
                 + ", ".join(f"rank {r} +{typical[r]:.1f} ms" for r in late) + " behind the ranks on time"),
        evidence={
            "lateness_ms": {str(r): round(typical[r], 3) for r in late},
            "clock_offsets_estimated": offsets is not None,
            "samples": {str(r): len(lateness[r]) for r in late},
            "worst_ms": round(worst, 3),
        },
    )]


# --------------------------------------------------------------------------- program order
#
# A rank that is absent from an op because it waits in another group's op is either a
# victim (in its program that other op comes first) or went past the op (it skipped it,
# and blocks further on: a deadlock it caused). Sequence numbers cannot tell these apart
# across groups; the order in which ranks that play the same part issued their ops can.
# Ranks play the same part when their last few ops, named by group family (description
# and size), sequence number, op, group-local P2P ends and signature, are the same.

LIKENESS_WINDOW = 4  # ops two ranks must share before an op to be at the same place in the program
MAX_WITNESSES = 64  # ranks that issued an op, consulted on where it comes in the program
MAX_PROFILES = 4  # distinct places in the program the witnesses may come from
# With no like rank to compare with, a rank's own past (its earlier steps) is compared:
HISTORY_RANKS = 8  # absent ranks per finding checked that way, at most
HISTORY_SPAN = 256  # ops since its last op on the channel, at most
HISTORY_TRIES = 4  # earlier occurrences of the op to compare with


@dataclass(slots=True)
class WentPast:
    """Evidence that a rank went past an op its like ranks issued next."""

    instead: Entry  # what the rank issued where its like ranks issued the op
    instead_group: Optional[int]  # its group id
    like_ranks: int  # like ranks that issued the op right there (0: its own past says so)
    # Like ranks (or the rank itself, earlier) issued `instead` after the op: the rank
    # skipped it. Without that it may as well have inserted `instead` (an extra op).
    confirmed: bool


@dataclass(slots=True)
class _Place:
    """Where one witness issued the op: its own op just before, and its ops leading there."""

    rank: int
    position: int  # of the op in the witness's entries
    before: tuple  # token of the op just before it
    window: tuple  # tokens of the LIKENESS_WINDOW ops ending with `before`


def _entry_index(entry: Entry) -> int:
    return entry.index


def _p2p_seq(entry: Entry) -> int:
    return entry.p2p_seq_id


class ProgramOrder:
    """Each rank's own order of ops (the entries the diagnosis reasons on), and lookups
    of the op that plays the same part on another rank. Ops are found through the
    matcher's per-group indexes, so comparing ranks costs a few lookups per witness,
    and comparing a rank with its own past reads at most a few hundred of its ops."""

    def __init__(self, dumps: list, layout: Layout, views: tuple, matches: MatchResult):
        self.entries = {d.rank: d.entries for d in dumps}
        self.layout = layout
        self.views = {v.group.id: v for v in views}
        self.family = {v.group.id: _family(v.group) for v in views}
        self.members = defaultdict(list)  # family -> group ids
        self.group_in_family: dict = {}  # (rank, family) -> group id; None when ambiguous
        for view in views:
            family = self.family[view.group.id]
            self.members[family].append(view.group.id)
            for rank in view.group.ranks:
                key = (rank, family)
                self.group_in_family[key] = None if key in self.group_in_family else view.group.id
        self._tokens: dict = {}  # (rank, position) -> token
        self._signatures: dict = {}  # shared by batch_signature, as in the matcher
        self.collectives = {(m.group_id, m.seq): m for m in matches.collectives}
        self._p2p_of_group: dict = defaultdict(list)  # group id -> its P2PMatch pairs
        for pair in matches.p2p:
            self._p2p_of_group[pair.group_id].append(pair)
        self._partners: dict = {}  # group id -> {id(send or recv entry): the entry at the other end}
        self._p2p_seqs: dict = {}  # (group id, rank) -> p2p_seq_id of each of its P2P ops
        self._sibling_parts: dict = {}  # see sibling_part

    def partner(self, group_id: int, entry: Entry) -> Optional[Entry]:
        """The entry at the other end of a send or recv of the group. Indexed per group
        on first use: a diagnosis asks about the few groups its findings are in."""
        partners = self._partners.get(group_id)
        if partners is None:
            partners = self._partners[group_id] = {}
            for pair in self._p2p_of_group.get(group_id, ()):
                if pair.send is not None and pair.recv is not None:
                    partners[id(pair.send)] = pair.recv
                    partners[id(pair.recv)] = pair.send
        return partners.get(id(entry))

    def sibling_part(self, sibling: int, local_holder: int, local_absent: int, held: tuple) -> Optional[tuple]:
        """(rank, entry, token) of what the rank at `local_absent` in group `sibling` posted
        as partner of the op `held` names at `local_holder`; None when it did not. A job-wide
        hang leaves one P2P finding per pipeline channel, and each consults the same first
        siblings of its family: cached, that costs one lookup per sibling."""
        key = (sibling, local_holder, local_absent, held)
        if key not in self._sibling_parts:
            self._sibling_parts[key] = self._sibling_part(sibling, local_holder, local_absent, held)
        return self._sibling_parts[key]

    def _sibling_part(self, sibling: int, local_holder: int, local_absent: int, held: tuple) -> Optional[tuple]:
        others = self.views[sibling].group.ranks
        if max(local_holder, local_absent) >= len(others):
            return None  # a sibling of another size plays no comparable part
        their_holder, their_absent = others[local_holder], others[local_absent]
        mine = self.find(their_holder, held)
        partner = self.partner(sibling, self.entries[their_holder][mine]) if mine is not None else None
        token = self.token_of(their_absent, partner) if partner is not None else None
        return (their_absent, partner, token) if token is not None else None

    # ---- positions and tokens

    def position(self, rank: int, entry: Entry) -> Optional[int]:
        entries = self.entries.get(rank, ())
        i = entry.index
        if i >= len(entries) or entries[i] is not entry:
            i = bisect_left(entries, entry.index, key=_entry_index)
        return i if i < len(entries) and entries[i] is entry else None

    def _batch_bounds(self, rank: int, position: int) -> tuple:
        entries = self.entries[rank]
        key = _batch_key(entries[position])
        start = end = position
        while start > 0 and _batch_key(entries[start - 1]) == key:
            start -= 1
        while end + 1 < len(entries) and _batch_key(entries[end + 1]) == key:
            end += 1
        return start, end

    def previous(self, rank: int, position: int) -> Optional[int]:
        start, _ = self._batch_bounds(rank, position)
        return self._batch_bounds(rank, start - 1)[0] if start > 0 else None

    def following(self, rank: int, position: int) -> Optional[int]:
        _, end = self._batch_bounds(rank, position)
        return end + 1 if end + 1 < len(self.entries[rank]) else None

    def token(self, rank: int, position: int) -> Optional[tuple]:
        """What names the op at `position` the same on every rank that plays its part."""
        key = (rank, position)
        if key not in self._tokens:
            self._tokens[key] = self._token(rank, position)
        return self._tokens[key]

    def _token(self, rank: int, position: int) -> Optional[tuple]:
        start, end = self._batch_bounds(rank, position)
        entries = self.entries[rank]
        entry = entries[start]
        gid = self.layout.group_of(entry.pg_name, rank)
        if gid is None or gid not in self.family:
            return None
        name = entry.name
        seq = entry.p2p_seq_id if name.is_p2p else entry.collective_seq_id
        return (self.family[gid], name.is_p2p, seq, name.op, name.local_src, name.local_dst,
                batch_signature(entries[start:end + 1], self._signatures))

    def token_of(self, rank: int, entry: Entry) -> Optional[tuple]:
        position = self.position(rank, entry)
        return self.token(rank, position) if position is not None else None

    def window(self, rank: int, position: int) -> tuple:
        tokens = []
        while position is not None and len(tokens) < LIKENESS_WINDOW:
            tokens.append(self.token(rank, position))
            position = self.previous(rank, position)
        return tuple(tokens)

    def find(self, rank: int, token: tuple) -> Optional[int]:
        """Position of the rank's op with this token, if it issued it."""
        family, is_p2p, seq, op, src, dst, signature = token
        gid = self.group_in_family.get((rank, family))
        stream = self.views[gid].streams.get(rank) if gid is not None else None
        if stream is None:
            return None
        if is_p2p:
            seqs = self._p2p_seqs.get((gid, rank))
            if seqs is None:
                seqs = self._p2p_seqs[(gid, rank)] = list(map(_p2p_seq, stream.p2p))
            i = bisect_left(seqs, seq)
            while i < len(stream.p2p) and stream.p2p[i].p2p_seq_id == seq:
                entry = stream.p2p[i]
                if (entry.op, entry.name.local_src, entry.name.local_dst) == (op, src, dst):
                    return self.position(rank, entry)
                i += 1
            return None
        batch = stream.collectives.get(seq)
        if batch is None or batch[0].op != op:
            return None
        return self.position(rank, batch[0])

    # ---- where an op stands in the program

    def places(self, witnesses: list, absent: tuple) -> list:
        """The distinct places (op before, ops leading there) where witnesses issued the
        op, among those some absent rank has reached (the others cannot judge it)."""
        places: dict = {}
        reached: dict = {}  # token of the op before -> whether an absent rank issued it
        for rank, entry in witnesses[:MAX_WITNESSES]:
            position = self.position(rank, entry)
            before = self.previous(rank, position) if position is not None else None
            if before is None:
                continue  # the first op kept in its buffer: nothing tells where it stands
            token = self.token(rank, before)
            if token not in reached:
                reached[token] = token is not None and any(self.find(r, token) is not None for r in absent)
            if not reached[token]:
                continue
            window = self.window(rank, before)
            if None in window:
                continue
            key = (window[0], window)
            if key not in places and len(places) == MAX_PROFILES:
                continue
            places.setdefault(key, []).append(_Place(rank, position, window[0], window))
        return list(places.values())

    def _choices(self, rank: int, places: list) -> list:
        """[(place, position of what the rank issued there, or None when nothing)] for
        every place the rank shares with the witnesses."""
        choices = []
        for place in places:
            first = place[0]
            mine = self.find(rank, first.before)
            if mine is not None and self.window(rank, mine) == first.window:
                choices.append((place, self.following(rank, mine)))
        return choices

    def went_past(self, absent: tuple, op_token: tuple, places: list) -> tuple:
        """({rank: WentPast} for the absent ranks that reached the place where their
        like ranks issued the op and issued something else there instead, the ranks
        whose like ranks were found at all)."""
        choices, placed = {}, set()
        for rank in absent:
            mine = self._choices(rank, places)
            if mine:
                placed.add(rank)
            # A few ops in common may not single out one part of the program: a rank
            # that fits one place where it stands before the op has skipped nothing.
            tokens = [self.token(rank, position) if position is not None else None for _, position in mine]
            if mine and all(token is not None and token != op_token for token in tokens):
                choices[rank] = [(place, position, token) for (place, position), token in zip(mine, tokens)]
        # How many absent ranks made each choice at each place: a choice most like
        # ranks made is the program, not a deviation.
        same_choice = defaultdict(int)
        for options in choices.values():
            for place, _, token in options:
                same_choice[(id(place), token)] += 1
        found = {}
        for rank, options in choices.items():
            verdicts = [self._verdict(place, token, same_choice[(id(place), token)]) for place, _, token in options]
            if all(verdict is not None for verdict in verdicts):
                place, position, _ = options[0]
                found[rank] = self._went_past(rank, position, len(place), any(verdicts))
        return found, placed

    def _verdict(self, place: list, token: tuple, same_choice: int) -> Optional[bool]:
        """Whether issuing `token` where the witnesses at `place` issued the op went
        past it: True when they issue `token` after the op (it skipped the op), False
        when most like ranks issued the op there but nothing shows `token` comes after
        it, None when the witnesses issue `token` before the op or as many like ranks
        chose it (then it is the program, and the rank has not got to the op yet)."""
        after = before = 0
        for witness in place:
            theirs = self.find(witness.rank, token)
            if theirs is not None:
                after += theirs > witness.position
                before += theirs < witness.position
        if after > before:
            return True
        if before or len(place) <= same_choice:
            return None
        return False

    def _went_past(self, rank: int, position: int, like_ranks: int, confirmed: bool) -> WentPast:
        instead = self.entries[rank][position]
        return WentPast(instead, self.layout.group_of(instead.pg_name, rank), like_ranks, confirmed)

    # ---- the rank's own past

    def _shapes(self, rank: int, start: Optional[int], stop: int, limit: int) -> tuple:
        """(shapes of the rank's ops from `start` up to `stop`, at most `limit` of them;
        whether that reached `stop`)."""
        shapes = []
        while start is not None and start < stop and len(shapes) < limit:
            token = self.token(rank, start)
            if token is None:
                return shapes, False
            shapes.append(_shape(token))
            start = self.following(rank, start)
        return shapes, start is None or start >= stop

    def past_says_skipped(self, rank: int, channel: list, op_shape: Optional[tuple]) -> Optional[WentPast]:
        """With nobody like it to compare with, a rank's own past: if what it did since
        its last op on the channel (`channel`: positions, oldest first) repeats a stretch
        of its past that led up to an op shaped like the missing one (`op_shape`; None
        when every op on the channel is) and then goes on as its past went on after
        that op, it skipped the op this time."""
        if len(channel) < 2:
            return None
        start = self.following(rank, channel[-1])
        if start is None:
            return None  # it stands right after its last op there: behind
        now, whole = self._shapes(rank, start, len(self.entries[rank]), HISTORY_SPAN)
        tries = 0
        for j in range(len(channel) - 1, 0, -1):
            if tries == HISTORY_TRIES:
                break
            if op_shape is not None and _shape(self.token(rank, channel[j]) or ()) != op_shape:
                continue
            tries += 1
            before, complete = self._shapes(rank, self.following(rank, channel[j - 1]), channel[j], HISTORY_SPAN)
            if not (whole and complete) or now[:len(before)] != before[:len(now)]:
                continue
            if len(now) <= len(before):
                return None  # still on the stretch that leads up to the op: behind
            after, _ = self._shapes(rank, self.following(rank, channel[j]), len(self.entries[rank]), len(now) - len(before))
            if now[len(before):] == after:
                return self._went_past(rank, self._nth_following(rank, start, len(before)), 0, True)
        return None

    def neighbours_say_skipped(self, rank: int, channel: list, op_shape: tuple) -> Optional[WentPast]:
        """A rank's own past, op by op, where its steps differ too much for
        `past_says_skipped` to find a whole stretch repeated: if an op of one shape B
        always came right before the ops shaped like the missing one (`op_shape`; at
        least two of them), and every B it issued until now was followed by one, a B
        followed by an op that in its past came right after the missing op says it
        skipped the op this time. Its last HISTORY_TRIES such ops are read."""
        ops = [p for p in channel if _shape(self.token(rank, p) or ()) == op_shape][-HISTORY_TRIES:]
        if len(ops) < 2:
            return None
        befores = {self._shape_at(rank, self.previous(rank, p)) for p in ops}
        afters = {self._shape_at(rank, self.following(rank, p)) for p in ops} - {None}
        if len(befores) != 1 or None in befores:
            return None
        (before,) = befores
        position, read = self.previous(rank, ops[0]), 0
        while position is not None and read < 2 * HISTORY_SPAN:
            if self._shape_at(rank, position) == before:
                then = self.following(rank, position)
                if then is None:
                    return None  # it stands right after a B: behind
                shape = self._shape_at(rank, then)
                if shape != op_shape:
                    # The first B not followed by the op: a skip if it comes after the
                    # last op and goes on as the op used to; otherwise B is no sign.
                    skipped = position > ops[-1] and shape in afters
                    return self._went_past(rank, then, 0, True) if skipped else None
            position, read = self.following(rank, position), read + 1
        return None

    def turns_say_skipped(self, rank: int, p2p: list, skipped: tuple) -> Optional[WentPast]:
        """A rank whose P2P ops in a group (`p2p`, oldest first) took turns between the
        `skipped` channel and one other (a first pipeline stage's forward send and
        backward recv, one micro-batch per step: c d c d) and then posted on the other
        one twice (c d c d d) went past its op on the skipped channel: nothing in its past
        lets the second come first. Its own past says so with a single earlier step,
        where `past_says_skipped` needs two."""
        if len(p2p) < 3:
            return None
        newest = p2p[-1]
        other = _p2p_channel(newest)
        if other == skipped:
            return None
        # Newest first: other, other, skipped, other, skipped, other ... to the oldest read.
        # Read op by op: most ranks asked about break the pattern within a few ops.
        turns = 0
        for channel in map(_p2p_channel, islice(reversed(p2p), HISTORY_SPAN)):
            if channel == skipped or channel == other:
                if channel != (skipped if turns % 2 == 0 and turns > 0 else other):
                    return None
                turns += 1
        if turns < 3:
            return None
        position = self.position(rank, newest)
        return self._went_past(rank, position, 0, True) if position is not None else None

    def _shape_at(self, rank: int, position: Optional[int]) -> Optional[tuple]:
        token = self.token(rank, position) if position is not None else None
        return _shape(token) if token is not None else None

    def _nth_following(self, rank: int, position: int, n: int) -> int:
        for _ in range(n):
            position = self.following(rank, position)
        return position


def _collective_witnesses(order: ProgramOrder, finding: Finding) -> tuple:
    """(token, [(rank, entry)]) of the op a collective finding is about, as issued by
    the ranks waiting in it and by the members of its sibling groups."""
    gid, seq = finding.group_id, finding.collective_seq_id
    match = order.collectives.get((gid, seq))
    issuer = next((r for r in finding.waiting_ranks if match and r in match.calls), None)
    if issuer is None:
        return None, []
    op_token = order.token_of(issuer, match.calls[issuer][0])
    if op_token is None:
        return None, []
    near = finding.absent_ranks[0]
    witnesses = sorted(((r, e[0]) for r, e in match.calls.items()), key=lambda c: (abs(c[0] - near), c[0]))
    for sibling in order.members[order.family[gid]]:
        if len(witnesses) >= MAX_WITNESSES:
            break
        other = order.collectives.get((sibling, seq)) if sibling != gid else None
        if other is not None:
            witnesses.extend((r, e[0]) for r, e in sorted(other.calls.items()))
    return op_token, witnesses[:MAX_WITNESSES]


def _p2p_witnesses(order: ProgramOrder, finding: Finding) -> tuple:
    """(token, [(rank, entry)]) of the send or recv a P2P finding says was never posted,
    as posted by the ranks that play the absent rank's part in sibling groups."""
    holder, absent = finding.evidence.get("posted_by"), finding.evidence.get("missing_on")
    view = order.views.get(finding.group_id)
    if finding.anchor is None or view is None or not {holder, absent} <= set(view.group.ranks):
        return None, []  # an end outside the group (a stray rank, `recv ?`): no part to compare
    held = order.token_of(holder, finding.anchor)
    if held is None:
        return None, []
    ranks = view.group.ranks
    local_holder, local_absent = ranks.index(holder), ranks.index(absent)
    witnesses, tokens = [], defaultdict(int)
    siblings = (g for g in order.members[order.family[finding.group_id]] if g != finding.group_id)
    # Bounded like the witnesses: one finding per pipeline channel must not visit every
    # sibling channel of a large job (that is quadratic in ranks).
    for sibling in islice(siblings, MAX_WITNESSES):
        part = order.sibling_part(sibling, local_holder, local_absent, held)
        if part is not None:
            their_absent, partner, token = part
            witnesses.append((their_absent, partner))
            tokens[token] += 1
    if not tokens:
        return None, []
    op_token = max(tokens.items(), key=lambda kv: kv[1])[0]
    return op_token, witnesses


def _channel(order: ProgramOrder, finding: Finding, rank: int) -> list:
    """Positions of the rank's earlier ops on the finding's channel, oldest first: its
    collectives of the group before the op, or its P2P ops like the one never posted."""
    view = order.views.get(finding.group_id)
    stream = view.streams.get(rank) if view else None
    if stream is None:
        return []
    if finding.kind == "p2p_unmatched":
        wanted = _unposted_channel(finding)
        newest_first = (e for e in reversed(stream.p2p) if _p2p_channel(e) == wanted)
        positions = (order.position(rank, e) for e in newest_first)
        # Every op on the channel is like the one never posted, so `past_says_skipped`
        # reads no further back than its last HISTORY_TRIES + 1: finding the rest would
        # scan a long pipeline run's every send and recv, once per finding.
        return list(islice((p for p in positions if p is not None), HISTORY_TRIES + 1))[::-1]
    entries = [stream.collectives[s][0] for s in sorted(stream.collectives) if s < finding.collective_seq_id]
    positions = (order.position(rank, e) for e in entries)
    return [p for p in positions if p is not None]


def went_past_finding(order: ProgramOrder, finding: Finding, ranks: tuple) -> dict:
    """rank -> WentPast for those of `ranks` (absent from the finding, waiting
    elsewhere) that went past its op."""
    if finding.kind == "p2p_unmatched":
        if finding.anchor is None:
            return {}
        op_token, witnesses = _p2p_witnesses(order, finding)
    elif finding.collective_seq_id is not None and finding.group_id is not None:
        op_token, witnesses = _collective_witnesses(order, finding)
        if op_token is None:
            return {}
    else:
        return {}
    absent = tuple(r for r in ranks if r in order.entries)
    found, placed = {}, set()
    if op_token is not None:
        witnesses = [(r, e) for r, e in witnesses if order.token_of(r, e) == op_token]
        places = order.places(witnesses, absent)
        if places and absent:
            found, placed = order.went_past(absent, op_token, places)
    # Every op on a P2P channel is like the one never posted; collectives vary.
    op_shape = None if finding.kind == "p2p_unmatched" else _shape(op_token)
    # Ranks no like rank could judge are compared with their own past: a rank no like
    # rank plays the part of, as a whole; one whose like ranks split (as many chose one
    # way as the other), only by the stricter tests (op by op, or turns on P2P channels).
    unplaced = [r for r in absent if r not in placed]
    split = [r for r in absent if r in placed and r not in found]
    for rank in unplaced if len(unplaced) <= HISTORY_RANKS else ():
        channel = _channel(order, finding, rank)
        past = order.past_says_skipped(rank, channel, op_shape)
        if past is None and finding.kind == "p2p_unmatched":
            past = _turns_say_skipped(order, finding, rank)
        elif past is None:
            past = order.neighbours_say_skipped(rank, channel, op_shape)
        if past is not None:
            found[rank] = past
    for rank in split if len(split) <= HISTORY_RANKS else ():
        if finding.kind == "p2p_unmatched":
            past = _turns_say_skipped(order, finding, rank)
        else:
            past = order.neighbours_say_skipped(rank, _channel(order, finding, rank), op_shape)
        if past is not None:
            found[rank] = past
    return found


def _p2p_channel(entry: Entry) -> tuple:
    return entry.op, entry.name.local_src, entry.name.local_dst


def _turns_say_skipped(order: ProgramOrder, finding: Finding, rank: int) -> Optional[WentPast]:
    view = order.views.get(finding.group_id)
    stream = view.streams.get(rank) if view else None
    return order.turns_say_skipped(rank, stream.p2p, _unposted_channel(finding)) if stream else None


def _unposted_channel(finding: Finding) -> tuple:
    """The channel (op, group-local src, dst) of the send or recv a P2P finding says was
    never posted: the other end of its anchor."""
    anchor = finding.anchor
    return "recv" if anchor.op == "send" else "send", anchor.name.local_src, anchor.name.local_dst


def _shape(token: tuple) -> tuple:
    """A token without its sequence number: what the op is, wherever it comes."""
    return token[:2] + token[3:]


def _family(group) -> tuple:
    """Groups of one family run the same program (the TP groups, the DP groups ...)."""
    return (group.desc, group.size) if group.desc else ("", group.name, group.size)


# --------------------------------------------------------------------------- roots


# When findings explain each other in a circle, the most fundamental kind is the root.
# Which finding tells the story of one culprit best: a missed collective comes before
# the P2P its pipeline peer then waits for ...
ROOT_PRIORITY = {"missing_dump": 0, "op_mismatch": 1, "dtype_mismatch": 1, "size_mismatch": 1,
                 "extra_op": 2, "not_issued": 3, "stuck": 4, "p2p_unmatched": 5}
# ... but in a circle of findings waiting on each other (a deadlock), an unmatched P2P
# is the most specific evidence of who broke the symmetry.
CIRCLE_PRIORITY = dict(ROOT_PRIORITY, p2p_unmatched=2, extra_op=3, not_issued=4)


def _same_place(a: Finding, b: Finding) -> bool:
    """Findings about one collective stream, or one P2P channel, cannot explain each other."""
    if a.group_id != b.group_id or (a.kind == "p2p_unmatched") != (b.kind == "p2p_unmatched"):
        return False
    if a.kind == "p2p_unmatched":
        return (a.evidence.get("src"), a.evidence.get("dst")) == (b.evidence.get("src"), b.evidence.get("dst"))
    return True


def _source_circle(members: list, parents: dict, resolved: set) -> list:
    """Unresolved findings that nothing outside their own circle holds."""
    by_id = {id(f): f for f in members if id(f) not in resolved}

    def ancestors(key: int) -> set:
        seen, todo = set(), [key]
        while todo:
            for parent in parents.get(todo.pop(), ()):
                if parent in by_id and parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    lineage = {key: ancestors(key) for key in by_id}
    sources = [by_id[key] for key in by_id if all(key in lineage[a] for a in lineage[key])]
    return sources or list(by_id.values())


def _holders(blocking: list, candidates: list, gone_past: dict) -> dict:
    """id(finding) -> [(other finding, its absent ranks that wait in the other)]. A
    rank that went past the op is not held anywhere: it skipped it."""
    # Indexed by waiting rank: comparing every finding with every other is quadratic, and a
    # hang across thousands of ranks leaves thousands of findings.
    waiting_in = defaultdict(list)
    for position, candidate in enumerate(candidates):
        for rank in candidate.waiting_ranks:
            waiting_in[rank].append((position, candidate))
    holders = {}
    for finding in blocking:
        absent = set(finding.absent_ranks) - gone_past.get(id(finding), {}).keys()
        held: dict = {}  # candidate position -> (candidate, absent ranks waiting in it)
        for rank in absent:
            for position, candidate in waiting_in.get(rank, ()):
                if candidate is not finding and not _same_place(candidate, finding):
                    held.setdefault(position, (candidate, set()))[1].add(rank)
        holders[id(finding)] = [held[position] for position in sorted(held)]
    return holders


def _ranks_gone_past(blocking: list, candidates: list, holders: dict, went_past: Callable) -> dict:
    """id(finding) -> {rank: WentPast} for absent ranks that wait elsewhere only
    because they went past this finding's op."""
    extra_ops = {(f.group_id, f.collective_seq_id): set(f.suspect_ranks) for f in candidates if f.kind == "extra_op"}
    gone = {}
    for finding in blocking:
        held = set().union(*(ranks for _, ranks in holders[id(finding)]))
        if not held:
            continue
        found = went_past(finding, tuple(sorted(held)))
        # Issuing an op where like ranks issued this one, with nothing to show it comes
        # after this one in the program, may as well be an extra op inserted before it:
        # when an extra_op finding names the rank for that op, that story is the one to
        # tell. (An unmatched P2P finding would blame the other end, so not for P2P.)
        found = {rank: past for rank, past in found.items()
                 if past.confirmed or past.instead.is_p2p
                 or rank not in extra_ops.get((past.instead_group, past.instead.collective_seq_id), ())}
        if found:
            gone[id(finding)] = found
    return gone


def _op_text(entry: Entry) -> str:
    seq = f"p2p #{entry.p2p_seq_id}" if entry.is_p2p else f"#{entry.collective_seq_id}"
    group = f"group {entry.pg_name} ({entry.pg_desc})" if entry.pg_desc else f"group {entry.pg_name}"
    return f"{entry.op} {seq} in {group}"


def _gone_past_text(ranks: list, past: WentPast) -> str:
    one = len(ranks) == 1
    they, their = ("it", "its") if one else ("they", "their")
    text = f"{_ranks_text(ranks)} went on to {_op_text(past.instead)} instead"
    if not past.like_ranks:
        return text + f" ({their} earlier steps issue that after this op: {they} skipped it)"
    if past.confirmed:
        return text + f" (ranks like {they if one else 'them'} issue that after this op: {they} skipped it)"
    return text + f" (ranks like {they if one else 'them'} issued this op there)"


def _note_gone_past(finding: Finding, gone: dict) -> None:
    """Say in the finding that its absent ranks are not victims: they went past it."""
    stories = defaultdict(list)
    for rank in sorted(gone):
        past = gone[rank]
        stories[(_op_text(past.instead), not past.like_ranks, past.confirmed)].append(rank)
    texts = [_gone_past_text(ranks, gone[ranks[0]]) for ranks in stories.values()]
    finding.message = finding.message.replace(TIE_NOTE, "") + "; " + "; ".join(texts)
    finding.evidence.pop("tie_broken_by", None)
    finding.evidence["went_past"] = {str(rank): _gone_past_evidence(past) for rank, past in sorted(gone.items())}


def _gone_past_evidence(past: WentPast) -> dict:
    evidence = {
        "instead": _op_text(past.instead),
        "evidence": "own_past" if not past.like_ranks else "like_ranks",
        "like_ranks": past.like_ranks,
        "skipped": past.confirmed,
    }
    site = _frame_text(user_frame(past.instead))
    if site:
        evidence["call_site"] = site  # where its code went on: the skipped call comes before it
    return evidence


def _link_consequences(findings: list, went_past: Optional[Callable] = None) -> None:
    """Find the root causes among blocking findings. A rank that never issued an op
    because it is waiting in another group's unfinished op is a victim (a TP hang
    stalls DP, which stalls the pipeline's P2P), unless it went past the op (ranks
    like it issued the op where it issued something else); a rank that is waiting
    nowhere, or went past, is where the trouble starts, and every finding it is absent
    from is one story. Findings that wait on each other in a circle (a desync
    deadlock) get their most fundamental, oldest member as the root."""
    candidates = [f for f in findings if f.kind in ROOT_PRIORITY]
    blocking = [f for f in candidates if f.kind in BLOCKING_KINDS and f.absent_ranks]
    holders = _holders(blocking, candidates, {})
    gone_past = _ranks_gone_past(blocking, candidates, holders, went_past) if went_past else {}
    if gone_past:
        holders = _holders(blocking, candidates, gone_past)
        for finding in blocking:
            if id(finding) in gone_past:
                _note_gone_past(finding, gone_past[id(finding)])
    waited = {id(f): set().union(set(), *(held for _, held in holders[id(f)])) for f in blocking}
    roots = [f for f in candidates if id(f) not in holders]
    cause = {}
    # Findings with ranks that wait nowhere: the purest first (fewest victims in them).
    partial = [f for f in blocking if set(f.absent_ranks) - waited[id(f)]]
    for finding in sorted(partial, key=lambda f: (len(waited[id(f)]), ROOT_PRIORITY[f.kind], f.age_ns)):
        free = set(finding.absent_ranks) - waited[id(finding)]
        same = [r for r in roots if free <= set(r.suspect_ranks) and not _same_place(r, finding)]
        if same:
            cause[id(finding)] = (min(same, key=lambda r: (ROOT_PRIORITY[r.kind], r.age_ns)), "same_suspects")
        else:
            roots.append(finding)
    resolved = {id(f) for f in roots} | set(cause)
    parents = {key: {id(g) for g, _ in pairs} for key, pairs in holders.items()}
    pending = [f for f in blocking if id(f) not in resolved]
    while pending:
        ready = [f for f in pending if any(id(g) in resolved for g, _ in holders[id(f)])]
        if not ready:
            # The narrowest story wins: one rank to blame beats a whole half of the job.
            # An op that the sibling groups all issued is surely part of the program.
            best = min(_source_circle(pending, parents, resolved),
                       key=lambda f: (len(f.suspect_ranks), CIRCLE_PRIORITY[f.kind],
                                      not f.evidence.get("siblings_issued_it"), f.age_ns))
            roots.append(best)
            ready = [best]
        for finding in ready:
            if finding not in roots:
                settled = [(g, held) for g, held in holders[id(finding)] if id(g) in resolved]
                cause[id(finding)] = (max(settled, key=lambda p: (len(p[1]), -p[0].age_ns))[0], "blocked")
            resolved.add(id(finding))
        pending = [f for f in pending if id(f) not in resolved]
    index = {id(f): i for i, f in enumerate(findings)}
    for finding in blocking:
        if id(finding) in cause:
            root, link = cause[id(finding)]
            finding.caused_by = index[id(root)]
            finding.evidence["link"] = link


def _demote_consequences(findings: list) -> None:
    for finding in findings:
        if finding.caused_by is None:
            continue
        root = findings[finding.caused_by]
        where = f"{root.op} #{root.collective_seq_id or root.p2p_seq_id} of group {root.pg_name}"
        finding.message = finding.message.replace(TIE_NOTE, "")
        finding.evidence["consequence_of"] = {"kind": root.kind, "pg_name": root.pg_name, "collective_seq_id": root.collective_seq_id}
        finding.caused_by = f"{root.kind} in group {root.pg_name} #{root.collective_seq_id or root.p2p_seq_id}"
        if finding.evidence["link"] == "blocked":
            finding.evidence["blocked_ranks"] = list(finding.absent_ranks)
            finding.message += f" — a consequence: they are stuck in {where}"
            finding.suspect_ranks = ()
        else:
            finding.message += f" — the same rank(s) as the root cause in {where}"
        finding.severity = "warning"


def _missing_dump_notes(analysis: Analysis, findings: list) -> list:
    """Ranks without a dump that no finding already blames or mentions."""
    mentioned = {r for f in findings for r in f.suspect_ranks}
    missing = [r for r in analysis.layout.ranks_missing if r not in mentioned]
    if not missing:
        return []
    blamed = any(f.severity == "error" and f.is_root for f in findings)
    failed = set(analysis.load.failed_ranks)
    reason = "unreadable dump" if set(missing) <= failed else "no dump file"
    one = len(missing) == 1
    message = f"{_ranks_text(missing)}: {reason}" + (
        f"; the evidence points elsewhere, so {'it is probably a victim' if one else 'they are probably victims'}"
        if blamed else f"; nothing else shows what {'it was' if one else 'they were'} doing"
    )
    return [_new_finding("missing_dump", None, severity="info" if blamed else "warning", op=None, collective_seq_id=None,
                         p2p_seq_id=None, ranks=tuple(missing), suspect_ranks=(), message=message,
                         evidence={"ranks": list(missing), "unreadable": sorted(failed & set(missing))})]


def _empty_dump_notes(analysis: Analysis) -> list:
    """Dumps with no entries say nothing about collectives: make that visible."""
    dumps = _dumps(analysis)
    empty = [d.rank for d in dumps if not d.entries]
    if not empty:
        return []
    without_key = [d.rank for d in dumps if not d.entries and not d.has_entries]
    why = " (dumped without collectives: includeCollectives=False)" if without_key == empty else ""
    return [_new_finding("no_entries", None, severity="info", op=None, collective_seq_id=None, p2p_seq_id=None,
                         ranks=tuple(empty), suspect_ranks=(),
                         message=f"{_ranks_text(empty)}: the dump holds no entries{why}",
                         evidence={"ranks": empty})]


# --------------------------------------------------------------------------- verdict


def _verdict(status: str, roots: list, analysis: Analysis, findings: list) -> str:
    layout = analysis.layout
    if status == "healthy":
        ops = len(analysis.matches.collectives)
        return (f"HEALTHY: {plural(len(layout.ranks_found), 'rank')}, {plural(len(layout.groups), 'group')}, "
                f"{plural(ops, 'collective')} matched; no divergence, nothing stuck")
    if status == "inconclusive":
        notes = [f.message for f in findings if f.severity in ("warning", "info")]
        return "INCONCLUSIVE: " + (notes[0] if notes else "not enough evidence in the dumps")
    first = roots[0]
    more = f" (+{plural(len(roots) - 1, 'more root finding')})" if len(roots) > 1 else ""
    return f"FAULT: {first.message}{more}"


@dataclass(slots=True)
class _Siblings:
    """The other groups with the same description and size (the other TP groups of
    a TP group, and so on): in an SPMD program they run the same ops."""

    views: list
    by_seq: list  # per sibling: {seq: CollectiveMatch}

    def matches_at(self, seq: int) -> list:
        return [index[seq] for index in self.by_seq if seq in index]


def _sibling_index(views: tuple, by_group: dict):
    by_seq = {gid: {m.seq: m for m in matches} for gid, matches in by_group.items()}
    families = defaultdict(list)
    for view in views:
        if view.group.desc:
            families[(view.group.desc, view.group.size)].append(view)

    def siblings_of(view: GroupView) -> _Siblings:
        others = [v for v in families.get((view.group.desc, view.group.size), ()) if v.group.id != view.group.id]
        return _Siblings(others, [by_seq.get(v.group.id, {}) for v in others])

    return siblings_of


def _blocked_at(entries: tuple) -> int:
    """Index of the entry the rank is blocked in (len(entries) when it is in none): the
    oldest unfinished entry after the newest completed one. A rank's ops finish in the
    order it enqueued them, so an older unfinished entry followed by completed ones is
    stale, not where it waits."""
    start = len(entries)
    while start > 0 and not entries[start - 1].completed:
        start -= 1
    return start


def _batch_key(entry: Entry) -> tuple:
    """What the entries of one coalesced batch share."""
    return entry.pg_name, entry.is_p2p, entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id


def _without_queued_ops(dump: RankDump) -> RankDump:
    """The dump as the rank's GPU got it: without the ops the host only queued behind
    the one the rank is blocked in. The host enqueues ahead, so a stuck rank may list
    its next ops as `scheduled`; they have not reached the network, and counting them
    as issued makes peers look waiting in an op nobody entered (a false `stuck`) or a
    merely queued send look posted. An op that has started (timing on) is running and
    stays, and so does the rest of the blocked op's own batch."""
    entries = dump.entries
    blocked = _blocked_at(entries)
    if blocked >= len(entries) - 1:
        return dump
    batch = _batch_key(entries[blocked])
    behind = tuple(e for e in entries[blocked + 1:] if e.started or _batch_key(e) == batch)
    if len(behind) == len(entries) - blocked - 1:
        return dump
    return replace(dump, entries=entries[: blocked + 1] + behind)


def _device_matches(analysis: Analysis) -> tuple:
    """(matches, dumps) the diagnosis reasons on: every rank's entries up to where it
    is blocked. Matching again costs one more linear pass, and only when some rank has
    queued ops; the report and Database keep the matches of everything dumped."""
    dumps = _dumps(analysis)
    trimmed = [_without_queued_ops(d) for d in dumps]
    if all(t is d for t, d in zip(trimmed, dumps)):
        return analysis.matches, dumps
    return match_dumps(trimmed, analysis.layout), trimmed


def _went_past_judge(dumps: list, layout: Layout, device: MatchResult) -> Callable:
    """went_past_finding over a ProgramOrder built on first use: most jobs never ask."""
    order = []

    def judge(finding: Finding, ranks: tuple) -> dict:
        if not order:
            order.append(ProgramOrder(dumps, layout, device.views, device))
        return went_past_finding(order[0], finding, ranks)

    return judge


@dataclass(frozen=True, slots=True)
class _BlockedElsewhere:
    """The ranks blocked in an op other than `place`: a view of `blocked_in`, since a set
    per group would cost ranks x groups."""

    blocked_in: dict
    place: tuple

    def __contains__(self, rank: int) -> bool:
        where = self.blocked_in.get(rank)
        return where is not None and where != self.place


def _blocked_in(analysis: Analysis) -> dict:
    """rank -> (group name, is_p2p) of the op the rank is blocked in: where it waits now."""
    blocked = {}
    for dump in _dumps(analysis):
        index = _blocked_at(dump.entries)
        if index < len(dump.entries):
            entry = dump.entries[index]
            blocked[dump.rank] = (entry.pg_name, entry.is_p2p)
    return blocked


def diagnose(analysis: Analysis) -> Diagnosis:
    reliable = _completion_is_reliable(analysis)
    # Without a completion signal (gloo) nothing tells a blocked op from a queued one.
    device, seen = _device_matches(analysis) if reliable else (analysis.matches, _dumps(analysis))
    by_group = defaultdict(list)
    for collective in device.collectives:
        by_group[collective.group_id].append(collective)
    p2p_by_group = defaultdict(list)
    for p2p in device.p2p:
        p2p_by_group[p2p.group_id].append(p2p)
    findings, clean = [], []
    siblings_of = _sibling_index(device.views, by_group)
    blocked_in = _blocked_in(analysis) if reliable else {}
    for view in device.views:
        matches = by_group.get(view.group.id, [])
        elsewhere = _BlockedElsewhere(blocked_in, (view.group.name, False))
        findings.extend(_diagnose_group(view, matches, reliable, siblings_of(view), elsewhere))
        findings.extend(_p2p_findings(view, p2p_by_group.get(view.group.id, []), reliable))
        clean.extend(_recent_clean(matches, reliable))
    _link_consequences(findings, _went_past_judge(seen, analysis.layout, device))
    _demote_consequences(findings)
    findings.extend(_straggler_findings(analysis, clean))
    findings.extend(_missing_dump_notes(analysis, findings))
    findings.extend(_empty_dump_notes(analysis))
    # Roots first, oldest first; then consequences; then warnings and notes.
    rank_of = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (not f.is_root, rank_of[f.severity], f.age_ns, f.group_id if f.group_id is not None else -1, f.kind))
    roots = [f for f in findings if f.is_root and f.severity in ("error", "warning") and f.suspect_ranks]
    errors = [f for f in roots if f.severity == "error"]
    primary = errors or roots
    if primary:
        status = "faults"
    elif (analysis.layout.ranks_missing or analysis.load.errors or analysis.layout.ignored_files
          or any(f.severity == "warning" for f in findings)):
        status = "inconclusive"
    else:
        status = "healthy"
    suspects = tuple(sorted({r for f in primary for r in f.suspect_ranks}))
    return Diagnosis(status, suspects, _verdict(status, primary, analysis, findings), findings)
