"""How far each suspect's blame can be trusted: a number in [0, 1] and the evidence it rests on.

Takes a `Diagnosis` (its findings, linked) and the `Layout` of the job; returns one
`SuspectConfidence` per primary suspect, in rank order. Nothing is inferred anew: the score
is read off what the rules already recorded on their findings (the rule that made the
finding, its facts, whether it was a tie and how that was broken, what linking found), so
that automation can act on strong verdicts only and leave weak ones to a person.

A suspect's score is that of the strongest root finding naming it (`BASIS` below), raised a
little when other findings name it too, and lowered where the job holds root causes that
blame other ranks, or ranks the dumps cannot speak for. docs/confidence.md explains the
numbers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple, Optional

from frtrace.diagnosis.finding import Diagnosis, Finding
from frtrace.diagnosis.kinds import kind as kind_row

# Evidence -> how much a finding resting on it alone is worth. Ordered from the strongest:
# every other member of the group agrees on what the suspect did differently, down to a
# guess that one of two equal camps is to blame.
BASIS = {
    "unanimous_peers": 0.95,  # every other member (two or more, all with dumps) agrees: the suspect is the odd one out
    "later_ops_line_up": 0.9,  # its ops after this one are the majority's minus (or plus) exactly this one
    "gap_in_its_sequence": 0.9,  # it never issued #k but went on to later numbers
    "majority_of_peers": 0.85,  # a majority agrees, but not every other member (another camp, or members without a dump)
    "device_stall": 0.85,  # it holds an op its peers finished and went past
    "never_started": 0.8,  # its op never started where its peers' did, past the timeout: its GPU never got there
    "skipped_like_ranks": 0.85,  # ranks that play its part issued the op where it issued something else next
    "one_peer": 0.85,  # unanimous, but the group has one other member: a single witness
    "idle_while_peers_wait": 0.75,  # an even split, decided by the suspects waiting in nothing at all
    "skipped_own_past": 0.75,  # its own earlier steps issue what it did instead after this op
    "tie_broken_by_siblings": 0.7,  # an even split, decided by sibling groups running the same program
    "p2p_partner_never_posted": 0.7,  # a send (or recv) waits for a partner this rank never posted
    "queued_less_than_like_ranks": 0.7,  # waits where its victims do, but its host queued less after than ranks playing its part
    "waits_on_no_one": 0.7,  # of the ranks that never issued the op, it waits on nobody; the rest wait in ops other findings explain
    "tie_broken_by_blocked_elsewhere": 0.65,  # an even split, decided by the other camp waiting in another op
    "tie_broken_by_like_places": 0.7,  # an even split, the other camp idle where its places in every sibling group are
    "tie_broken_by_own_past": 0.65,  # an even split, decided by the group's earlier steps issuing only one camp's op
    "went_past_unconfirmed": 0.65,  # ranks like it issued the op where it issued another; nothing shows it skipped
    "missing_dump": 0.6,  # no dump: peers wait for it, nothing shows what it was doing
    "pg_status_only": 0.55,  # no entries to compare: only its pg_status counter places it
    "even_split": 0.5,  # two equal camps and nothing to decide between them: the behind camp is named
    "mismatch_tie": 0.5,  # two equal camps issued different ops: both are named
    "no_member_finished": 0.4,  # every member is in the op and none finished: the fault could be any of them (or none)
    "other_rule": 0.6,  # a finding of a rule this table does not know
}
# Modifiers: what the rest of the diagnosis says about a suspect's root finding.
CORROBORATION = 0.5  # each further finding naming the rank removes this share of the remaining doubt
# ... but never by more than this: agreeing findings are seldom independent (a hang shows in
# every group the culprit is in), and no pile of weak evidence may pass for strong evidence.
MAX_CORROBORATION = 0.05
SEVERAL_ROOT_CAUSES = 0.85  # root findings blaming different ranks: each story is less likely the whole truth
RANKS_WITHOUT_DUMP = 0.9  # ranks the dumps cannot speak for, other than the suspect, could hold the real cause
# A deadlock circle's root told from the rest only by being the oldest op (Finding.circle):
# in the project's sweeps of such circles the oldest was the start in 38 of 46.
CIRCLE_BY_AGE = 0.85


class SuspectConfidence(NamedTuple):
    rank: int
    confidence: float  # in [0, 1], two decimals
    evidence: tuple[str, ...]  # BASIS and modifier labels, strongest evidence first
    finding: Finding  # the root finding the score comes from


def suspect_confidences(diagnosis: Diagnosis, ranks_missing: tuple[int, ...] = ()) -> list[SuspectConfidence]:
    """A `SuspectConfidence` per primary suspect of `diagnosis` (none when it blames nobody);
    `ranks_missing` are the job's ranks without a usable dump."""
    suspects = set(diagnosis.suspect_ranks)
    if not suspects:
        return []
    primary = primary_findings(diagnosis.findings)
    several = len({f.suspect_ranks for f in primary}) > 1
    # One pass over the findings: a hang across thousands of ranks leaves thousands of each.
    chosen = set(primary)
    naming: dict[int, list[Finding]] = defaultdict(list)
    for finding in diagnosis.findings:
        if finding in chosen or finding.link == "same_suspects":
            for rank in suspects.intersection(finding.suspect_ranks):
                naming[rank].append(finding)
    missing = frozenset(ranks_missing)
    return [_confidence_of(rank, naming[rank], several, missing) for rank in sorted(suspects) if naming[rank]]


def _confidence_of(rank: int, naming: list[Finding], several: bool, ranks_missing: frozenset[int]) -> SuspectConfidence:
    """The strongest finding's score, corroborated by the others naming `rank`, then the modifiers."""
    scored = sorted(((score_of(f, rank, rank in ranks_missing), f) for f in naming), key=lambda sf: -sf[0][0])
    (base, basis), finding = scored[0]
    labels: list[str] = list(basis)
    score = base
    for (other, _), _finding in scored[1:]:
        score += (1 - score) * CORROBORATION * other
    score = min(score, base + MAX_CORROBORATION)
    if len(scored) > 1:
        labels.append(f"named_by_{len(scored)}_findings")
    if several:
        score *= SEVERAL_ROOT_CAUSES
        labels.append("several_root_causes")
    others = ranks_missing - {rank}
    if others and others - _weighed_missing(finding):
        score *= RANKS_WITHOUT_DUMP
        labels.append("other_ranks_without_dump")
    if finding.circle:
        score *= CIRCLE_BY_AGE
        labels.append("deadlock_circle_by_age")
    return SuspectConfidence(rank, round(min(1.0, max(0.0, score)), 2), tuple(labels), finding)


def _weighed_missing(finding: Finding) -> set[int]:
    """Ranks without a dump the finding's own score already allows for."""
    weighed = set(finding.facts.get("no_dump_ranks", ()))
    if finding.kind == "missing_dump":
        weighed.update(finding.ranks)
    return weighed


def primary_findings(findings: list[Finding]) -> list[Finding]:
    """The root findings the verdict rests on (as `verdict.conclude` picks them): roots with
    suspects of a kind that decides a fault, errors first."""
    roots = [f for f in findings if f.is_root and f.severity in ("error", "warning") and f.suspect_ranks
             and kind_row(f.kind).decides_fault]
    return [f for f in roots if f.severity == "error"] or roots


def score_of(finding: Finding, rank: int, without_dump: bool = False) -> tuple[float, tuple[str, ...]]:
    """(score, evidence labels) of one finding naming `rank`, before the modifiers. A rank
    `without_dump` is blamed only on what its peers show, whatever the finding's kind (a
    send that waits for it, a collective it is missing from): a missing dump."""
    label = "missing_dump" if without_dump else _went_past_basis(finding, rank) or _basis(finding)
    if finding.held_elsewhere and BASIS[label] > BASIS["waits_on_no_one"]:
        # Its peers' agreement was counted against every rank that never issued the op;
        # linking took those that wait elsewhere out: the rest is all it rests on.
        label = "waits_on_no_one"
    return BASIS[label], (label,)


def _went_past_basis(finding: Finding, rank: int) -> Optional[str]:
    past = finding.went_past.get(rank)
    if past is None:
        return None
    if past.like_ranks and past.confirmed:
        return "skipped_like_ranks"
    return "skipped_own_past" if not past.like_ranks else "went_past_unconfirmed"


def _basis(finding: Finding) -> str:
    rule = finding.rule
    if rule.startswith("divergence."):
        basis = _divergence_basis(finding)
        if basis is not None:
            return basis
    if rule == "status_only.positions_from_pg_status":
        return "pg_status_only" if not finding.tie else "even_split"
    if finding.kind == "missing_dump":
        return "missing_dump"
    if rule in ("frontier.stuck_on_device", "p2p.partner_went_on"):
        return "device_stall"
    if rule == "frontier.stuck":
        return "no_member_finished"
    if rule == "frontier.never_started":
        return "never_started"
    if finding.kind == "p2p_unmatched":
        return "p2p_partner_never_posted"
    if rule == "p2p.left_out_step":
        return "skipped_like_ranks"
    if rule == "stopped_hosts.queued_less_than_like_ranks":
        return "queued_less_than_like_ranks"
    return "other_rule"


def _divergence_basis(finding: Finding) -> Optional[str]:
    """The basis of a divergence rule's finding; None for a rule of it not listed here."""
    facts, rule = finding.facts, finding.rule
    if rule in ("divergence.skipped_one_op", "divergence.added_one_op"):
        return "later_ops_line_up"
    if rule == "divergence.gap":
        return "gap_in_its_sequence"
    if rule == "divergence.mismatch_tie":
        return "tie_broken_by_siblings" if facts.get("tie_broken_by_sibling_groups") else "mismatch_tie"
    if rule == "divergence.mismatch":
        if facts.get("tie_broken_by_sibling_groups"):
            return "tie_broken_by_siblings"
        if facts.get("tie_broken_by_own_past"):
            return "tie_broken_by_own_past"
        return _agreement(finding, len(facts.get("classes", ())) == 2)
    if rule == "divergence.never_issued":
        return _never_issued_basis(finding)
    if rule == "divergence.went_ahead":
        if facts.get("tie_broken_by"):
            return "tie_broken_by_like_places" if facts.get("idle_like_their_places") else "tie_broken_by_blocked_elsewhere"
        return _agreement(finding, True)
    return None


def _never_issued_basis(finding: Finding) -> str:
    facts = finding.facts
    if facts.get("idle_ranks"):
        return "idle_while_peers_wait"
    if facts.get("tie"):
        return "tie_broken_by_siblings" if facts.get("siblings_issued_it") else "even_split"
    return _agreement(finding, set(facts.get("not_issued_ranks", ())) == set(finding.suspect_ranks))


def _agreement(finding: Finding, one_camp: bool) -> str:
    """unanimous_peers, one_peer or majority_of_peers: how many members with a dump stand
    against the suspects, and whether they all agree."""
    peers = [r for r in finding.ranks if r not in finding.suspect_ranks]
    if not one_camp or finding.facts.get("no_dump_ranks"):
        return "majority_of_peers"
    return "unanimous_peers" if len(peers) >= 2 else "one_peer"
