"""Where pg_status alone puts the ranks, when the dumps hold no entry to compare.

Takes `Facts`; returns findings only when no collective or P2P op could be matched at
all (every dump taken without collectives, empty, or unreadable). Then the one record
every dump still keeps, pg_status, says how many collectives each rank enqueued in the
default group (pg_id 0, which every rank is a member of): ranks behind the others never
issued the newest one (`not_issued`), and dumps that say nothing at all leave the job
inconclusive, never healthy.
"""

from __future__ import annotations

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.match.matcher import DEFAULT_PG_ID
from frtrace.model import PgStatus
from frtrace.wording import ranks_text


def positions_from_pg_status(facts: Facts) -> list[Finding]:
    """The rule (see module docstring)."""
    analysis = facts.analysis
    if analysis.matches.collectives or analysis.matches.p2p:
        return []
    dumps = analysis.dumps
    enqueued = {d.rank: _enqueued(d.pg_status.get(DEFAULT_PG_ID)) for d in dumps}
    known = {rank: seq for rank, seq in enqueued.items() if seq is not None}
    if len(known) < 2:
        return [_no_evidence(sorted(enqueued))]
    newest = max(known.values())
    behind = tuple(sorted(r for r, seq in known.items() if seq < newest))
    if not behind:
        return []  # every rank enqueued the same collectives
    ahead = tuple(sorted(r for r in known if r not in behind))
    if 2 * len(behind) > len(known):
        return [_ahead(ahead, behind, newest)]
    return [_behind(behind, ahead, newest, known)]


def _enqueued(status: PgStatus | None) -> int | None:
    if status is None or status.last_enqueued is None:
        return None
    return status.last_enqueued


def _behind(behind: tuple[int, ...], ahead: tuple[int, ...], newest: int, known: dict[int, int]) -> Finding:
    return new_finding(
        "not_issued", "status_only.positions_from_pg_status", None, op=None, collective_seq_id=newest, p2p_seq_id=None,
        ranks=tuple(sorted(behind + ahead)), suspect_ranks=behind,
        message=(f"{ranks_text(behind)} never issued collective #{newest} of the default group, which "
                 f"{ranks_text(ahead)} enqueued (their pg_status; the dumps hold no entries to say more)"),
        evidence={"last_enqueued": {str(r): known[r] for r in sorted(known)}, "source": "pg_status"},
        waiting_ranks=ahead, absent_ranks=behind, tie=2 * len(behind) == len(known),
    )


def _ahead(ahead: tuple[int, ...], behind: tuple[int, ...], newest: int) -> Finding:
    return new_finding(
        "extra_op", "status_only.positions_from_pg_status", None, op=None, collective_seq_id=newest, p2p_seq_id=None,
        ranks=tuple(sorted(behind + ahead)), suspect_ranks=ahead,
        message=(f"{ranks_text(ahead)} enqueued collective #{newest} of the default group, which "
                 f"{ranks_text(behind)} never issued (their pg_status; the dumps hold no entries to say more)"),
        evidence={"source": "pg_status"}, waiting_ranks=ahead, absent_ranks=behind,
    )


def _no_evidence(ranks: list[int]) -> Finding:
    return new_finding(
        "no_entries", "status_only.positions_from_pg_status", None, severity="warning", op=None,
        collective_seq_id=None, p2p_seq_id=None, ranks=tuple(ranks), suspect_ranks=(),
        message="no dump holds an entry or a pg_status that can be compared: nothing shows whether the job was healthy",
        evidence={"ranks": ranks},
    )
