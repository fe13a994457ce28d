"""Where a group stands when its members agree on everything they hold: the oldest op
they have not all finished, and who is in it.

Takes `Facts`; returns `stuck` findings (every member issued the op, none finished)
and `missing_dump` findings (members without a dump that the others wait for, or that
took part in everything, which clears them).
"""

from __future__ import annotations

from typing import Any, Optional

from frtrace.diagnosis.facts import Facts, new_finding, oldest_created, unfinished
from frtrace.diagnosis.finding import Finding
from frtrace.match.matcher import CollectiveMatch, GroupView, RankStream
from frtrace.wording import call_site, group_text, ranks_text


def frontiers(facts: Facts) -> list[Finding]:
    """The rule: per group without a divergence, its frontier op."""
    findings: list[Finding] = []
    for view in facts.device.views:
        if facts.divergence_at[view.group.id] is not None:
            continue
        frontier = _frontier(facts.collectives_of(view), facts.reliable)
        if frontier is None:
            continue
        if frontier.no_dump:
            findings.append(_missing_at_frontier(view, frontier, facts.reliable))
        else:
            findings.extend(stuck(view, frontier, facts.reliable))
    return findings


def _frontier(matches: list[CollectiveMatch], reliable: bool) -> Optional[CollectiveMatch]:
    """The op where the group stands: its newest; with completion states, the oldest
    unfinished one, as ranks may have enqueued more behind the one they wait in."""
    if not matches:
        return None
    if reliable:
        return next(unfinished(matches), matches[-1])
    return matches[-1]


def _missing_at_frontier(view: GroupView, frontier: CollectiveMatch, reliable: bool) -> Finding:
    if _all_issuers_finished(view, frontier):
        return took_part_without_dump(view, frontier, reliable)
    return waited_on_without_dump(view, frontier, reliable)


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


def stuck(view: GroupView, frontier: CollectiveMatch, reliable: bool) -> list[Finding]:
    """Every member issued the op and none completed it. Without completion states that
    may just be the moment of the dump: a note, not a fault."""
    issued, completed = frontier.issued, frontier.completed_ranks
    if completed or frontier.finished_unseen or not issued:
        return []  # some member finished it: not the network's fault (see stuck_on_device)
    entry = frontier.calls[issued[0]][0]
    group = group_text(view.group.name, view.group.desc)
    if frontier.out_of_window:
        return [unknown_members(view, frontier)]
    if reliable:
        severity = "error"
        message = (f"every member of {group} issued {entry.op} #{frontier.seq} and none completed it: "
                   "the network, a GPU or the communication library itself is stuck")
    else:
        severity = "info"
        message = (f"no member of {group} has retired {entry.op} #{frontier.seq} yet; "
                   f"{entry.name.backend or 'this backend'} gives no other progress signal, so this may just be the moment of the dump")
    return [new_finding(
        "stuck", "frontier.stuck", view, severity=severity, op=entry.op, collective_seq_id=frontier.seq, p2p_seq_id=None,
        ranks=issued, suspect_ranks=issued if severity == "error" else (), message=message,
        evidence={"issued_ranks": list(issued), "states": sorted({e[0].state for e in frontier.calls.values()})},
        waiting_ranks=issued, age_ns=oldest_created(frontier),
    )]


def unknown_members(view: GroupView, frontier: CollectiveMatch) -> Finding:
    """No member that holds the op finished it, but some members' dumps no longer reach
    back to it and their pg_status does not say: nothing shows every member issued it,
    so nobody is blamed for it being stuck."""
    issued, unknown = frontier.issued, frontier.out_of_window
    entry = frontier.calls[issued[0]][0]
    return new_finding(
        "stuck", "frontier.unknown_members", view, severity="warning", op=entry.op, collective_seq_id=frontier.seq,
        p2p_seq_id=None, ranks=tuple(sorted(issued + unknown)), suspect_ranks=(),
        message=(f"{ranks_text(issued)} {'is' if len(issued) == 1 else 'are'} in {entry.op} #{frontier.seq} of "
                 f"{group_text(view.group.name, view.group.desc)}, unfinished; the dumps of {ranks_text(unknown)} "
                 "no longer reach back that far, so whether they issued it is unknown"),
        evidence={"issued_ranks": list(issued), "unknown_ranks": list(unknown)},
        waiting_ranks=issued, age_ns=oldest_created(frontier),
    )


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
    for view in full.views:
        matches = full.index.collectives_of.get(view.group.id, [])
        finished = _newest_finished(view, matches)
        for match in unfinished(matches):
            done = set(match.completed_ranks) | set(match.finished_unseen)
            holders = tuple(r for r in match.issued if r not in done)
            if holders and any(finished.get(r, -1) > match.seq for r in done):
                findings.append(_stuck_on_device(view, match, holders, tuple(sorted(done))))
                break
    return findings


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
        "stuck", "frontier.stuck_on_device", view, op=entry.op, collective_seq_id=match.seq, p2p_seq_id=None,
        ranks=tuple(sorted(holders + done)), suspect_ranks=holders,
        message=(f"{ranks_text(holders)} still {'holds' if len(holders) == 1 else 'hold'} {entry.op} #{match.seq} of "
                 f"{group_text(view.group.name, view.group.desc)} unfinished, while {ranks_text(done)} finished it and "
                 "went on: their GPU work stopped completing (a device-side stall)"),
        evidence={"holding_ranks": list(holders), "finished_ranks": list(done),
                  "states": sorted({match.calls[r][0].state for r in holders})},
        waiting_ranks=holders, age_ns=oldest_created(match),
    )
