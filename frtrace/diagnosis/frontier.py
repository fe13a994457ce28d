"""Where a group stands when its members agree on everything they hold: the oldest op
they have not all finished, and who is in it.

Takes `Facts`; returns `stuck` findings (every member issued the op, none finished, and
it outlived its timeout), `in_flight` findings (the same in an op younger than that: the
dumps cannot tell a hang from a job dumped mid-op) and `missing_dump` findings (members without a dump that the others wait
for, or that took part in everything, which clears them).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import islice
from typing import Any, Callable, Optional

from frtrace.diagnosis.facts import MAX_SIBLINGS_ASKED, Facts, Siblings, new_finding, oldest_created, unfinished
from frtrace.diagnosis.finding import Finding
from frtrace.match.matcher import CollectiveMatch, GroupView, RankStream
from frtrace.model import Entry
from frtrace.table.rank_dump import RankDump
from frtrace.wording import call_site, duration_text, group_text, groups_text, ranks_text, some_ranks_text

MS_NS = 1_000_000
# rank -> the newest time its own dump shows (its host's clock), None when it shows none
SeenUntil = Callable[[int], Optional[int]]


def frontiers(facts: Facts) -> list[Finding]:
    """The rule: per group without a divergence, its frontier op."""
    findings: list[Finding] = []
    seen_until = _seen_until(facts.analysis.dumps)
    records_starts = _records_starts(facts.analysis.dumps)
    for view in facts.device.views:
        if facts.divergence_at[view.group.id] is not None:
            continue
        frontier = _frontier(facts.collectives_of(view), facts.reliable)
        if frontier is None:
            continue
        if frontier.no_dump:
            findings.append(_missing_at_frontier(view, frontier, facts.reliable, facts.siblings_of(view)))
        else:
            findings.extend(stuck(view, frontier, facts.reliable, seen_until, records_starts))
    in_flight = [f for f in findings if f.rule == IN_FLIGHT]
    if len(in_flight) > 1:
        findings.append(_in_flight_job(in_flight, len(facts.analysis.layout.ranks_found)))
        for finding in in_flight:  # the job-wide line says it; each group's is a note
            finding.own_severity = "info"
    return findings


IN_FLIGHT = "frontier.in_flight"


def _seen_until(dumps: list[RankDump]) -> SeenUntil:
    """The newest time each rank's dump shows (an op created, or seen started or
    completed), read once per rank asked about: a lower bound on when it was dumped, on
    the rank's own clock (hosts' clocks differ, so never compared across ranks)."""
    by_rank = {dump.rank: dump for dump in dumps}
    newest: dict[int, Optional[int]] = {}

    def seen(rank: int) -> Optional[int]:
        if rank not in newest:
            dump = by_rank.get(rank)
            times = [] if dump is None else [
                max((t for t in dump.entries.field(name) if t), default=0)
                for name in ("time_created_ns", "time_started_ns", "time_completed_ns")]
            newest[rank] = max(times, default=0) or None
        return newest[rank]

    return seen


def _records_starts(dumps: list[RankDump]) -> Callable[[int], bool]:
    """Whether a rank's dump shows it records when ops start (timing on): an op seen
    started, or a pg_status row with a started number. Read once per rank asked about."""
    by_rank = {dump.rank: dump for dump in dumps}
    known: dict[int, bool] = {}

    def records(rank: int) -> bool:
        if rank not in known:
            dump = by_rank.get(rank)
            known[rank] = dump is not None and (
                any(status.last_started is not None and status.last_started >= 0 for status in dump.pg_status.values())
                or any(dump.entries.field("time_started_ns")))
        return known[rank]

    return records


def _frontier(matches: list[CollectiveMatch], reliable: bool) -> Optional[CollectiveMatch]:
    """The op where the group stands: its newest; with completion states, the oldest
    unfinished one, as ranks may have enqueued more behind the one they wait in."""
    if not matches:
        return None
    if reliable:
        return next(unfinished(matches), matches[-1])
    return matches[-1]


def _missing_at_frontier(view: GroupView, frontier: CollectiveMatch, reliable: bool, siblings: Siblings) -> Finding:
    if _all_issuers_finished(view, frontier):
        return took_part_without_dump(view, frontier, reliable)
    alike = _siblings_in_the_same_op(siblings, frontier) if reliable and not frontier.completed_ranks else []
    if alike:
        names = {v.group.id: v.group.name for v in siblings.views}
        return in_flight_like_its_siblings(view, frontier, [names[match.group_id] for match in alike])
    return waited_on_without_dump(view, frontier, reliable)


def _siblings_in_the_same_op(siblings: Siblings, frontier: CollectiveMatch) -> list[CollectiveMatch]:
    """The sibling groups' matches at the frontier's number where every member stands in
    that same op as this group does, none finished, when some sibling does and none went
    past it, of the first MAX_SIBLINGS_ASKED siblings (empty otherwise). A rank that never arrived holds up only its own group: the
    siblings, which do not wait for it, would have finished the op long before the dumps
    were taken. Standing in it alike, they show the whole job dumped mid-op (or stuck
    alike). A sibling that has not reached the op (no member issued it, or not every
    member yet) says neither: the other stages of a pipeline run other parts of the step."""
    op = frontier.first_entry.op
    found = []
    for match in islice(siblings.each_at(frontier.seq), MAX_SIBLINGS_ASKED):
        if match is None:
            continue
        if _in_it_unfinished(match, op):
            found.append(match)
        elif match.completed_ranks or match.finished_unseen or match.disagreement is not None or not match.not_issued:
            return []
    return found


def _in_it_unfinished(match: CollectiveMatch, op: str) -> bool:
    """Every member issued `op` at this number, agreeing, and none has finished it."""
    return match.held_by_all_unfinished and match.disagreement is None and match.first_entry.op == op


def in_flight_like_its_siblings(view: GroupView, frontier: CollectiveMatch, sibling_names: list[str]) -> Finding:
    """Members without a dump, and the others in the group's newest op, unfinished, as every
    member of each sibling group is: the missing dump explains nothing those groups do
    not show without one, so nobody is blamed for it."""
    issued, no_dump = frontier.issued, frontier.no_dump
    entry = frontier.first_entry
    group = group_text(view.group.name, view.group.desc)
    return new_finding(
        "missing_dump", "frontier.in_flight_like_its_siblings", view, severity="warning", op=entry.op,
        collective_seq_id=frontier.seq, p2p_seq_id=None, ranks=no_dump, suspect_ranks=(),
        message=(f"{ranks_text(no_dump)} left no usable dump; {ranks_text(issued)} "
                 f"{'is' if len(issued) == 1 else 'are'} in {entry.op} #{frontier.seq} of {group}, unfinished, as every "
                 f"member of {groups_text(sibling_names, view.group.desc, most_ranges=4)} is: the dumps cannot tell whether "
                 f"{'it' if len(issued) == 1 else 'they'} wait for {'it' if len(no_dump) == 1 else 'them'} "
                 "or the job was dumped mid-op"),
        evidence={"no_dump_ranks": list(no_dump), "issued_ranks": list(issued), "completed_ranks": [],
                  "siblings_in_the_same_op": len(sibling_names)},  # a count: a family may hold thousands
        waiting_ranks=issued, age_ns=oldest_created(frontier),
    )


def _all_issuers_finished(view: GroupView, match: CollectiveMatch) -> bool:
    """Every rank that issued the op finished it: by its entry (its state, or on gloo,
    whose entries never leave `scheduled`, its `retired` flag) or by its pg_status. A
    collective cannot finish without all its members (gloo's retirements include ops that
    timed out: see took_part_without_dump)."""
    finished = set(match.completed_ranks)
    finished.update(r for r in match.issued
                    if r in view.streams and (view.streams[r].finished or -1) >= match.seq)
    return bool(match.issued) and finished >= set(match.issued)


def took_part_without_dump(view: GroupView, frontier: CollectiveMatch, reliable: bool) -> Finding:
    """Every op of the group completed: members without a dump took part in them. Where
    completion is only a retirement (gloo), a timed-out op is retired as well, so that
    cannot be told from a hang: said so, and nobody is blamed either way."""
    no_dump = frontier.no_dump
    entry = frontier.calls[frontier.issued[0]][0]
    group = group_text(view.group.name, view.group.desc)
    if reliable:
        message = (f"{ranks_text(no_dump)} of {group} left no usable dump, but every op of the "
                   f"group up to #{frontier.seq} completed, so they took part; nothing here points at them")
    else:
        message = (f"{ranks_text(no_dump)} of {group} left no usable dump; every other member retired "
                   f"{entry.op} #{frontier.seq}, which {entry.name.backend or 'this backend'} also does when an op times out, "
                   f"so the dumps cannot tell whether {'it' if len(no_dump) == 1 else 'they'} took part or hung")
    return new_finding(
        "missing_dump", "frontier.took_part_without_dump", view, severity="warning", op=entry.op,
        collective_seq_id=frontier.seq, p2p_seq_id=None, ranks=no_dump, suspect_ranks=(),
        message=message,
        evidence={"no_dump_ranks": list(no_dump), "last_completed_seq": frontier.seq}, age_ns=oldest_created(frontier),
    )


def waited_on_without_dump(view: GroupView, frontier: CollectiveMatch, reliable: bool) -> Finding:
    """Members without a dump, and the others in the group's newest op waiting for them."""
    issued, no_dump, completed = frontier.issued, frontier.no_dump, frontier.completed_ranks
    entry = frontier.calls[issued[0]][0]
    waiting = tuple(r for r in issued if r not in completed)
    them = "it" if len(no_dump) == 1 else "them"
    group = group_text(view.group.name, view.group.desc)
    if reliable:
        message = (f"{ranks_text(no_dump)} left no usable dump, and {ranks_text(issued)} "
                   f"{'is' if len(issued) == 1 else 'are'} in {entry.op} #{frontier.seq} of {group} waiting for {them}")
    else:
        message = (f"{ranks_text(no_dump)} left no usable dump; {ranks_text(issued)} last issued "
                   f"{entry.op} #{frontier.seq} of {group}, which cannot finish without {them}")
    evidence: dict[str, Any] = {"no_dump_ranks": list(no_dump), "issued_ranks": list(issued), "completed_ranks": list(completed)}
    site = call_site(entry)
    if site:
        evidence["peer_call_site"] = site
    return new_finding(
        "missing_dump", "frontier.waited_on_without_dump", view, op=entry.op, collective_seq_id=frontier.seq,
        p2p_seq_id=None, ranks=tuple(sorted(issued + no_dump)), suspect_ranks=no_dump, message=message,
        evidence=evidence, waiting_ranks=waiting or issued, age_ns=oldest_created(frontier), absent_ranks=no_dump,
        call_entries={"peer_call_site": entry} if site else {},
    )


def stuck(view: GroupView, frontier: CollectiveMatch, reliable: bool,
          seen_until: Optional[SeenUntil] = None, records_starts: Optional[Callable[[int], bool]] = None) -> list[Finding]:
    """Every member issued the op and none completed it. That is a hang only when the op
    outlived its timeout (its age, read on each member's own clock up to the newest time
    its dump shows, reaches `timeout_ms`): a job dumped while the op ran shows the same,
    so younger ops are in flight and the dumps cannot tell (`in_flight`). Without
    completion states that may just be the moment of the dump: a note, not a fault."""
    issued, completed = frontier.issued, frontier.completed_ranks
    if completed or frontier.finished_unseen or not issued:
        return []  # some member finished it: not the network's fault (see stuck_on_device)
    entry = frontier.calls[issued[0]][0]
    group = group_text(view.group.name, view.group.desc)
    if frontier.out_of_window:
        return [unknown_members(view, frontier)]
    evidence: dict[str, Any] = {"issued_ranks": list(issued), "states": sorted({e[0].state for e in frontier.calls.values()})}
    if reliable:
        age, timeout_ms = _age_ns(frontier, seen_until), entry.timeout_ms
        if age is not None:
            evidence["age_ms_at_least"] = round(age / MS_NS, 3)
        if timeout_ms:
            evidence["timeout_ms"] = timeout_ms
        if age is None or not timeout_ms or age < timeout_ms * MS_NS:
            return [_in_flight(view, frontier, evidence, age, timeout_ms)]
        never_started = _never_started(frontier, records_starts or (lambda rank: False))
        if never_started:
            return [_device_never_reached(view, frontier, never_started, evidence, age, timeout_ms)]
        severity = "error"
        message = (f"every member of {group} issued {entry.op} #{frontier.seq} and none completed it in "
                   f"{duration_text(age)} or more, past its {duration_text(timeout_ms * MS_NS)} timeout: "
                   "the network, a GPU or the communication library itself is stuck")
    else:
        severity = "info"
        message = (f"no member of {group} has retired {entry.op} #{frontier.seq} yet; "
                   f"{entry.name.backend or 'this backend'} gives no other progress signal, so this may just be the moment of the dump")
    return [new_finding(
        "stuck", "frontier.stuck", view, severity=severity, op=entry.op, collective_seq_id=frontier.seq, p2p_seq_id=None,
        ranks=issued, suspect_ranks=issued if severity == "error" else (), message=message,
        evidence=evidence, waiting_ranks=issued, age_ns=oldest_created(frontier),
    )]


def _never_started(frontier: CollectiveMatch, records_starts: Callable[[int], bool]) -> tuple[int, ...]:
    """The members whose op never started (`scheduled`) where others' did (`started`,
    which only timing records), each of whose own dumps shows it records starts
    (`records_starts`: timing can be set per group, and where it is off every op in
    flight is `scheduled`): each member's kernel starts once its own GPU stream reaches
    the op, so these GPUs never got there. Empty unless both are seen."""
    states = {rank: {entry.state for entry in calls} for rank, calls in frontier.calls.items()}
    if not any("started" in seen for seen in states.values()):
        return ()
    never = tuple(sorted(rank for rank, seen in states.items() if seen == {"scheduled"}))
    if len(never) == len(states) or not all(records_starts(rank) for rank in never):
        return ()
    return never


def _device_never_reached(view: GroupView, frontier: CollectiveMatch, never_started: tuple[int, ...],
                          evidence: dict[str, Any], age: int, timeout_ms: int) -> Finding:
    """Every member issued the op and none finished it past its timeout, and the members
    whose op started wait in it for those whose op never started: their GPUs never
    reached the op (stopped before it, in their own work or a device fault)."""
    entry = frontier.calls[frontier.issued[0]][0]
    started = tuple(rank for rank in frontier.issued if rank not in never_started)
    one = len(never_started) == 1
    evidence.update(never_started_ranks=list(never_started), started_ranks=list(started))
    return new_finding(
        "stuck", "frontier.never_started", view, op=entry.op, collective_seq_id=frontier.seq, p2p_seq_id=None,
        ranks=frontier.issued, suspect_ranks=never_started,
        message=(f"{ranks_text(never_started)} issued {entry.op} #{frontier.seq} of "
                 f"{group_text(view.group.name, view.group.desc)} but {'its' if one else 'their'} op never started, "
                 f"while {ranks_text(started)} started it and {'has' if len(started) == 1 else 'have'} waited in it "
                 f"{duration_text(age)} or more, past its {duration_text(timeout_ms * MS_NS)} timeout: "
                 f"{'its GPU' if one else 'their GPUs'} never reached the op (stopped before it, in "
                 f"{'its' if one else 'their'} own work or a device fault)"),
        evidence=evidence, waiting_ranks=started, age_ns=oldest_created(frontier),
    )


def _age_ns(match: CollectiveMatch, seen_until: Optional[SeenUntil]) -> Optional[int]:
    """How long the op had been in flight at least when the dumps were taken: per member,
    the newest time its dump shows less when it created the op (one host's clock), the
    longest of them. None when no member's dump shows a time."""
    if seen_until is None:
        return None
    ages = []
    for rank, entries in match.calls.items():
        created, newest = min(e.time_created_ns for e in entries), seen_until(rank)
        if created and newest:
            ages.append(max(newest - created, 0))
    return max(ages, default=None)


def _in_flight(view: GroupView, frontier: CollectiveMatch, evidence: dict[str, Any], age: Optional[int],
               timeout_ms: Optional[int]) -> Finding:
    """Every member is in the op and none finished it, yet it is younger than its
    timeout: as well a job dumped mid-op as a hang. Said so, blaming nobody."""
    issued = frontier.issued
    entry = frontier.calls[issued[0]][0]
    return new_finding(
        "in_flight", IN_FLIGHT, view, op=entry.op, collective_seq_id=frontier.seq, p2p_seq_id=None,
        ranks=issued, suspect_ranks=(),
        message=(f"{ranks_text(issued)} (every member of {group_text(view.group.name, view.group.desc)}) "
                 f"{'is' if len(issued) == 1 else 'are'} in flight in {entry.op} #{frontier.seq}, which none has "
                 f"completed; {_age_clause(age, timeout_ms)}: the dumps cannot tell a network or device hang "
                 "from a job dumped mid-op"),
        evidence=evidence, waiting_ranks=issued, age_ns=oldest_created(frontier),
    )


def _age_clause(age: Optional[int], timeout_ms: Optional[int]) -> str:
    known = f"it had run {duration_text(age)} or more" if age is not None else "how long it had run is unknown"
    if not timeout_ms:
        return known + " and its timeout is unknown"
    return known + f", short of its {duration_text(timeout_ms * MS_NS)} timeout"


def _in_flight_evidence(places: dict[tuple[Optional[str], Optional[int], str], list[Finding]], ages: list[float],
                        timeouts: list[int]) -> dict[str, Any]:
    """The evidence of `_in_flight_job`: each op in flight, with its groups and ranks."""
    evidence: dict[str, Any] = {
        "in_flight": [{"op": op, "collective_seq_id": seq, "pg_desc": desc, "pg_names": [f.pg_name for f in found],
                       "ranks": sorted({r for f in found for r in f.ranks})} for (op, seq, desc), found in places.items()],
    }
    if ages:
        evidence["age_ms_at_least"] = max(ages)
    if timeouts:
        evidence["timeout_ms"] = timeouts[0]
    return evidence


def _in_flight_job(in_flight: list[Finding], ranks_found: int) -> Finding:
    """Several groups in flight at once: one line saying which ranks are in which op (a
    job dumped mid-step shows every rank so)."""
    places: dict[tuple[Optional[str], Optional[int], str], list[Finding]] = defaultdict(list)
    for finding in in_flight:
        places[(finding.op, finding.collective_seq_id, finding.pg_desc)].append(finding)
    ranks = sorted({r for f in in_flight for r in f.ranks})
    who = "every rank is" if len(ranks) == ranks_found else f"{ranks_text(ranks)} are"
    where = "; ".join(f"{op} #{seq} of {groups_text([f.pg_name for f in found], desc)}"
                      for (op, seq, desc), found in places.items())
    ages = [f.facts["age_ms_at_least"] for f in in_flight if "age_ms_at_least" in f.facts]
    timeouts = sorted({f.facts["timeout_ms"] for f in in_flight if "timeout_ms" in f.facts})
    evidence = _in_flight_evidence(places, ages, timeouts)
    age = int(max(ages) * MS_NS) if ages else None
    return new_finding(
        "in_flight", IN_FLIGHT, None, op=None, collective_seq_id=None, p2p_seq_id=None,
        ranks=tuple(ranks), suspect_ranks=(),
        message=(f"{who} in flight in {where}, and none has completed the op it is in; "
                 f"{_age_clause(age, timeouts[0] if timeouts else None)}: the dumps cannot tell a network "
                 "or device hang from a job dumped mid-op"),
        evidence=evidence, age_ns=min(f.age_ns for f in in_flight),
    )


def unknown_members(view: GroupView, frontier: CollectiveMatch) -> Finding:
    """No member that holds the op finished it, but some members' dumps no longer reach
    back to it and their pg_status does not say: nothing shows every member issued it,
    so nobody is blamed for it being stuck."""
    issued, unknown = frontier.issued, frontier.out_of_window
    entry = frontier.calls[issued[0]][0]
    # A dump of only active entries reaches back as far as any: it left the op out because
    # it finished, or never held it; its pg_status row, unplaced, cannot say which.
    only_active = all(view.streams[rank].only_active for rank in unknown if rank in view.streams)
    why = ("hold only active entries, none of it, and their pg_status does not say how far they got in the group"
           if only_active else "no longer reach back that far")
    return new_finding(
        "stuck", "frontier.unknown_members", view, severity="warning", op=entry.op, collective_seq_id=frontier.seq,
        p2p_seq_id=None, ranks=tuple(sorted(issued + unknown)), suspect_ranks=(),
        message=(f"{ranks_text(issued)} {'is' if len(issued) == 1 else 'are'} in {entry.op} #{frontier.seq} of "
                 f"{group_text(view.group.name, view.group.desc)}, unfinished; the dumps of {ranks_text(unknown)} "
                 f"{why}, so whether they issued it is unknown"),
        evidence={"issued_ranks": list(issued), "unknown_ranks": list(unknown)},
        waiting_ranks=issued, age_ns=oldest_created(frontier),
    )


# An op some members hold unfinished and others finished: (group, op, holders, finishers).
_Split = tuple[GroupView, CollectiveMatch, tuple[int, ...], tuple[int, ...]]


def stuck_on_device(facts: Facts) -> list[Finding]:
    """The rule: per group, the oldest collective some members still hold unfinished
    while others finished it and went on to finish later ones. The holders issued it,
    and their peers could not have gone on without them on the network: their GPU work
    stopped completing (the peers' progress is read off their entries or, where dumps
    keep only active entries, their pg_status)."""
    if not facts.reliable:
        return []
    # Read off everything dumped, not the device view: ops a stalled rank's host queued did
    # reach its GPU when its peers finished them.
    full = facts.analysis.matches
    findings: list[Finding] = []
    stalls: list[_Split] = []
    lagging: set[int] = set()  # ranks holding an op a peer finished
    stalled: set[int] = set()  # of those, the ranks a device stall explains somewhere
    for view in full.views:
        matches = full.index.collectives_of.get(view.group.id, [])
        finished = _newest_finished(view, matches)
        stall: Optional[_Split] = None  # the group's oldest op some members finished and went past, others hold
        note: Optional[Finding] = None  # else the group's oldest op some members finished and others hold
        for match in unfinished(matches):
            done = tuple(sorted(set(match.completed_ranks) | set(match.finished_unseen)))
            holders = tuple(r for r in match.issued if r not in done)
            if not holders or not done:
                continue
            lagging.update(holders)
            went_on = any(finished.get(r, -1) > match.seq for r in done)
            if went_on and _stall_explains(facts, holders, done, match.no_dump):
                stalled.update(holders)
                stall = stall or (view, match, holders, done)
            elif stall is None and note is None:
                note = _dumped_at_other_moments(view, match, holders, done, went_on, facts.blocked_entry)
        if stall is not None:
            stalls.append(stall)
        elif note is not None:
            findings.append(note)
    findings += (_stuck_on_device(view, match, holders, done) for view, match, holders, done in stalls)
    unexplained = tuple(sorted(lagging - stalled))
    if unexplained:
        findings.append(_lagging_ranks(unexplained))
    return findings


def _stall_explains(facts: Facts, holders: tuple[int, ...], done: tuple[int, ...], unseen: tuple[int, ...]) -> bool:
    """Whether a device stall of `holders` explains an op they hold unfinished and `done`
    finished, better than dumps taken at different moments (the holders' before the op
    ended on their side) do. A stalled rank holds up its peers: the ranks that finished
    the op would wait in the next one that needs it, so at least one of them waits in some
    op; and it is a fault of the holders' GPUs, so they are no more than the ranks that
    finished it (more holders than finishers ask more GPUs to fail at one op than ranks
    to have been dumped a moment later). Members without a dump (`unseen`) may have
    finished it too, and count with those that did."""
    return len(holders) <= len(done) + len(unseen) and any(rank in facts.blocked_entry for rank in done)


def _lagging_ranks(lagging: tuple[int, ...]) -> Finding:
    """The job-wide note of the ranks that hold an op unfinished which a peer finished,
    where no device stall is shown: dumped a moment before the op ended on their side, or
    stopped there (`running.unsettled_roots` asks which)."""
    one = len(lagging) == 1
    return new_finding(
        "in_flight", LAGGING_RANKS, None, severity="info", op=None, collective_seq_id=None, p2p_seq_id=None,
        ranks=lagging, suspect_ranks=(),
        message=(f"{some_ranks_text(lagging)} {'holds' if one else 'hold'} ops unfinished that {'its' if one else 'their'} "
                 "peers finished, and no device stall is shown there: each rank dumps at its own moment"),
        evidence={"lagging_ranks": list(lagging)},
    )


# The job-wide note of ranks behind their peers in ops the peers finished (`_lagging_ranks`).
LAGGING_RANKS = "frontier.lagging_ranks"
DUMPED_AT_OTHER_MOMENTS = "frontier.dumped_at_other_moments"
# The rule of a device stall: ranks holding an op their peers finished and went past.
STUCK_ON_DEVICE = "frontier.stuck_on_device"


def held_past_peers(findings: list[Finding]) -> frozenset[int]:
    """The ranks that hold an op unfinished which a peer finished (`_dumped_at_other_moments`):
    alone a note, as each rank dumps at its own moment; in a deadlock, the one sign in the
    dumps of a GPU that stopped."""
    return frozenset(rank for f in findings if f.rule == DUMPED_AT_OTHER_MOMENTS for rank in f.facts["holding_ranks"])


def gpus_stopped(findings: list[Finding]) -> frozenset[int]:
    """The ranks whose GPU the findings show stopped: those holding an op unfinished that a
    peer finished, a device stall (`stuck_on_device`) or a note of it (`held_past_peers`)."""
    stalled = (rank for f in findings if f.rule == STUCK_ON_DEVICE for rank in f.facts["holding_ranks"])
    return held_past_peers(findings).union(stalled)


def _dumped_at_other_moments(view: GroupView, match: CollectiveMatch, holders: tuple[int, ...], done: tuple[int, ...],
                             went_on: bool, blocked: dict[int, Entry]) -> Finding:
    """Some members hold the op unfinished where others finished it, and no device stall
    is shown (`_stall_explains`, or the finishers `went_on` to finish nothing later in the
    group): each rank's dump is a picture of its own moment, and the holders' may have
    been taken before the op ended on their side. A note that blames nobody: nothing
    here shows a hang (an op some member finished was not stuck on the network). It says
    the strongest reason: nothing waits for the holders; else the finishers stopped at the
    op (a stall there looks the same); else too many holders for a stall."""
    entry = match.calls[holders[0]][0]
    one = len(holders) == 1
    idle = tuple(rank for rank in done if rank not in blocked)
    moment = (f"{'its dump was' if one else 'their dumps were'} most likely taken a moment before the op ended "
              "there (each rank dumps at its own moment)")
    if len(idle) == len(done):
        why = f"{'it waits' if len(done) == 1 else 'they wait'} in no op, so nothing waits for {'it' if one else 'them'}: {moment}"
    elif not went_on:
        why = (f"{'it' if len(done) == 1 else 'they'} finished nothing of the group after it, so the dumps cannot "
               f"tell a GPU that stopped there from {'a dump' if one else 'dumps'} taken a moment before the op "
               "ended (each rank dumps at its own moment)")
    else:
        why = f"more members hold it than finished it, too many GPUs to stop at one op: {moment}"
    return new_finding(
        "in_flight", DUMPED_AT_OTHER_MOMENTS, view, severity="info", op=entry.op, collective_seq_id=match.seq,
        p2p_seq_id=None, ranks=tuple(sorted(holders + done)), suspect_ranks=(),
        message=(f"{ranks_text(holders)} still {'holds' if one else 'hold'} {entry.op} #{match.seq} of "
                 f"{group_text(view.group.name, view.group.desc)} unfinished, which {ranks_text(done)} finished; {why}"),
        evidence={"holding_ranks": list(holders), "finished_ranks": list(done), "idle_finished_ranks": list(idle),
                  "finished_a_later_op": went_on, "states": sorted({match.calls[r][0].state for r in holders})},
        waiting_ranks=(), age_ns=oldest_created(match),
    )


def _newest_finished(view: GroupView, matches: list[CollectiveMatch]) -> dict[int, int]:
    """rank -> the newest collective of the group it is known to have finished."""
    newest: dict[int, int] = {}
    # Newest first (matches are by seq): the first a rank completed is its newest, and
    # the read stops once every rank that issued any collective of the group has one,
    # a few ops back, instead of visiting every rank of every op (a job-wide group
    # holds thousands of each). Calls hold only ranks of the streams.
    unknown = {rank for rank, stream in view.streams.items() if _holds_collectives(stream)}
    for match in reversed(matches):
        if not unknown:
            break
        found = unknown.intersection(match.completed_ranks)
        newest.update(dict.fromkeys(found, match.seq))
        unknown -= found
    for rank, stream in view.streams.items():
        if stream.finished is not None:
            newest[rank] = max(newest.get(rank, -1), stream.finished)
    return newest


def _holds_collectives(stream: RankStream) -> bool:
    """Whether the rank holds any collective of the group (a SeqMap's size takes a set of its
    numbers where a batch holds several entries: its last number says as much)."""
    return stream.collectives.last is not None


def _stuck_on_device(view: GroupView, match: CollectiveMatch, holders: tuple[int, ...], done: tuple[int, ...]) -> Finding:
    entry = match.calls[holders[0]][0]
    return new_finding(
        "stuck", STUCK_ON_DEVICE, view, op=entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(holders + done)), suspect_ranks=holders,
        message=(f"{ranks_text(holders)} still {'holds' if len(holders) == 1 else 'hold'} {entry.op} #{match.seq} of "
                 f"{group_text(view.group.name, view.group.desc)} unfinished, while {ranks_text(done)} finished it and "
                 "went on: their GPU work stopped completing (a device-side stall)"),
        evidence={"holding_ranks": list(holders), "finished_ranks": list(done),
                  "states": sorted({match.calls[r][0].state for r in holders})},
        waiting_ranks=holders, age_ns=oldest_created(match),
    )
