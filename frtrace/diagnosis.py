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
finding is reported as a consequence of that one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Optional

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
STRAGGLER_SAMPLE_PER_GROUP = 256
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
                      waiting_elsewhere: frozenset = frozenset(), siblings_have_it: bool = False) -> Finding:
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
    ahead = tie and not siblings_have_it and set(missing) <= waiting_elsewhere
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
                    waiting_elsewhere: frozenset = frozenset()) -> list:
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
            absent_ranks=(absent,) if absent >= 0 else (),
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


def _straggler_findings(analysis: Analysis, clean: list) -> list:
    offsets = estimate_clock_offsets(clean) or None
    lateness = defaultdict(list)
    for match in clean:
        if len(match.calls) < 3:
            continue  # with two ranks, "late" has no majority to be late against
        created = {r: e[0].time_created_ns - (offsets or {}).get(r, 0) for r, e in match.calls.items()}
        middle = statistics.median(created.values())
        for rank, t in created.items():
            lateness[rank].append((t - middle) / 1e6)
    typical = {rank: statistics.median(v) for rank, v in lateness.items() if len(v) >= STRAGGLER_MIN_SAMPLES}
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
                 + ", ".join(f"rank {r} +{typical[r]:.1f} ms" for r in late) + " behind the median rank"),
        evidence={
            "lateness_ms": {str(r): round(typical[r], 3) for r in late},
            "clock_offsets_estimated": offsets is not None,
            "samples": {str(r): len(lateness[r]) for r in late},
            "worst_ms": round(worst, 3),
        },
    )]


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


def _link_consequences(findings: list) -> None:
    """Find the root causes among blocking findings. A rank that never issued an op
    because it is waiting in another group's unfinished op is a victim (a TP hang
    stalls DP, which stalls the pipeline's P2P); a rank that is waiting nowhere is
    where the trouble starts, and every finding it is absent from is one story.
    Findings that wait on each other in a circle (a desync deadlock) get their most
    fundamental, oldest member as the root."""
    candidates = [f for f in findings if f.kind in ROOT_PRIORITY]
    blocking = [f for f in candidates if f.kind in BLOCKING_KINDS and f.absent_ranks]
    holders = {
        id(f): [(g, set(f.absent_ranks) & set(g.waiting_ranks)) for g in candidates if g is not f and not _same_place(g, f)]
        for f in blocking
    }
    holders = {key: [(g, held) for g, held in pairs if held] for key, pairs in holders.items()}
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


def _device_matches(analysis: Analysis) -> MatchResult:
    """The matches the diagnosis reasons on: every rank's entries up to where it is
    blocked. Matching again costs one more linear pass, and only when some rank has
    queued ops; the report and Database keep the matches of everything dumped."""
    dumps = _dumps(analysis)
    trimmed = [_without_queued_ops(d) for d in dumps]
    if all(t is d for t, d in zip(trimmed, dumps)):
        return analysis.matches
    return match_dumps(trimmed, analysis.layout)


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
    device = _device_matches(analysis) if reliable else analysis.matches
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
        elsewhere = frozenset(rank for rank, place in blocked_in.items() if place != (view.group.name, False))
        findings.extend(_diagnose_group(view, matches, reliable, siblings_of(view), elsewhere))
        findings.extend(_p2p_findings(view, p2p_by_group.get(view.group.id, []), reliable))
        clean.extend(_recent_clean(matches, reliable))
    _link_consequences(findings)
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
