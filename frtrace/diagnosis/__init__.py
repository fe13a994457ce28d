"""Turn matched operations into findings and one verdict.

Takes an `Analysis` (loaded dumps, layout, the full and device-view matches); returns a
`Diagnosis`: findings in the DESIGN.md §3 vocabulary, each naming the rule that made
it and marked as a root cause or as a consequence of another, the primary suspect
ranks, and a status (healthy | faults | inconclusive).

The rules, one module per question, run in this order:

    divergence.divergences        per group: the first op members disagree on or never issued
    all_to_all.exchange_mismatches   per group: an all_to_all whose members' sends and receives do not add up
    frontier.stuck_on_device      per group: an op some members hold unfinished that others finished and went past
                                  (job-wide: the ranks behind so that no stall explains)
    frontier.frontiers            per group without a divergence: stuck ops, members without a dump
    p2p.unmatched_p2p             per P2P channel: a send or recv without its partner (or one
                                  its partner finished: the holder's device stall)
    peerless_p2p.blocked_in_peerless_p2p   ranks blocked in a P2P op with no peer named (CUPTI monitor)
    p2p.posted_pairs              P2P pairs posted on both ends that nothing else holds up
    p2p_sizes.mismatched_pairs    per P2P channel: a send and its recv that move different sizes or dtypes
    status_only.positions_from_pg_status   with no entry to compare anywhere: pg_status alone
    same_pair.one_finding_per_pair  one root finding per P2P pair that two rules explain
    divergence.skipped_not_ahead  an even split read as going ahead, whose absent ranks' own programs show they skipped the op
    p2p.ops_of_stalled_gpus       a send or recv without its partner, held by a rank whose GPU ran a later collective its peers finished
    linking.link_consequences     across groups: roots, and the findings that follow from them
    stopped_hosts.hosts_that_stopped  with a fault found: ranks waiting where their victims wait whose hosts queued less after than their like ranks
    running.unsettled_roots       ranks behind that no root blames: a job dumped while it ran, whose roots read off places blame nobody
    entry_checks.inconsistent_entries   entries that contradict their own op and group size (a warning)
    unchecked.unreadable_entries  collectives whose entries could not all be read, so not all compared
    stragglers.late_arrivals      ranks that consistently arrive late (a warning at most)
    missing.unaccounted_missing_ranks, missing.unseen_top_ranks, missing.empty_dumps   what the dumps lack

Each fault kind is one row of `kinds.KINDS`. With processes to spare, the costliest rules
(`COSTLY_FIRST`) run in forked children meanwhile (`side_by_side.py`): the same findings, in
the same order.
"""

from __future__ import annotations

from typing import Callable, Optional

from frtrace.diagnosis.all_to_all import absorb_stuck, exchange_mismatches
from frtrace.diagnosis.divergence import divergences, skipped_not_ahead
from frtrace.diagnosis.entry_checks import inconsistent_entries
from frtrace.diagnosis.facts import Facts
from frtrace.diagnosis.finding import Diagnosis, Finding, LikeRanksSay, P2PEnds, WentPast
from frtrace.diagnosis.frontier import frontiers, gpus_stopped, held_past_peers, stuck_on_device
from frtrace.diagnosis.running import unsettled_roots
from frtrace.diagnosis.kinds import KINDS, Kind, UnknownKind, kind
from frtrace.diagnosis.linking import LikeRanksJudge, WentPastJudge, link_consequences
from frtrace.diagnosis.missing import empty_dumps, unaccounted_missing_ranks, unseen_top_ranks
from frtrace.diagnosis.p2p import posted_pairs, ops_of_stalled_gpus, unmatched_p2p
from frtrace.diagnosis.peerless_p2p import blocked_in_peerless_p2p
from frtrace.diagnosis.p2p_sizes import mismatched_pairs
from frtrace.diagnosis.same_pair import one_finding_per_pair
from frtrace.diagnosis.side_by_side import RuleRuns, shared_out
from frtrace.diagnosis.program_order import ProgramOrder, went_past_finding
from frtrace.diagnosis.status_only import positions_from_pg_status
from frtrace.diagnosis.stopped_hosts import hosts_that_stopped
from frtrace.diagnosis.stragglers import late_arrivals
from frtrace.diagnosis.unchecked import unreadable_entries
from frtrace.diagnosis.verdict import conclude
from frtrace.match.analysis import Analysis
from frtrace.table.rank_dump import clocks_compare

__all__ = ["Diagnosis", "Finding", "KINDS", "Kind", "P2PEnds", "UnknownKind", "WentPast", "diagnose", "kind"]


Rule = Callable[[Facts], list[Finding]]
# The rules whose findings are linked into root causes and consequences, in order.
FINDING_RULES: tuple[Rule, ...] = (divergences, exchange_mismatches, stuck_on_device, frontiers, unmatched_p2p,
                                   mismatched_pairs, posted_pairs, blocked_in_peerless_p2p, positions_from_pg_status)


# The rules that read only the Facts, costliest first (seconds at 32,768 ranks x 500 entries,
# a hang, on this project's 2-core machine: 4.2, 0.83, 0.37, 0.36, 0.28, 0.21, 0.13): with
# processes to spare, each of the first ones runs in a forked child (side_by_side.py).
COSTLY_FIRST: tuple[Rule, ...] = (late_arrivals, exchange_mismatches, posted_pairs, unmatched_p2p, mismatched_pairs,
                                  inconsistent_entries, stuck_on_device)


def diagnose(analysis: Analysis, processes: int = 1, meanwhile: Optional[Callable[[], object]] = None) -> Diagnosis:
    """The diagnosis of `analysis`; with `processes` of 4 or more (load/forked.py:
    FORK_FROM_PROCESSES), a large job's costliest rules run in forked children meanwhile,
    and its went-past questions are shared out (side_by_side.py): the same findings
    either way. Where children were started, `meanwhile()` is called once, after this
    process's own rules and before it first waits for a child's findings: the caller's
    work that does not depend on the diagnosis then takes the time this process would
    spend waiting (api.diagnose readies the report's parts there). Not called otherwise."""
    facts = Facts.of(analysis)
    runs = RuleRuns.start(facts, COSTLY_FIRST, processes, spread=(late_arrivals, exchange_mismatches))
    try:
        return _diagnose(facts, runs, meanwhile)
    finally:
        runs.close()


def _diagnose(facts: Facts, runs: RuleRuns, meanwhile: Optional[Callable[[], object]] = None) -> Diagnosis:
    # The rules this process runs first, then the children's: their results come meanwhile.
    found = {rule: runs.findings(rule) for rule in FINDING_RULES if rule not in runs.started}
    if meanwhile is not None and runs.started:
        meanwhile()
    found.update((rule, runs.findings(rule)) for rule in FINDING_RULES if rule in runs.started)
    findings = one_finding_per_pair(absorb_stuck([finding for rule in FINDING_RULES for finding in found[rule]]))
    went_past = _went_past_judge(facts, runs.processes, gpus_stopped(findings))
    findings = skipped_not_ahead(facts, findings, went_past)
    findings = ops_of_stalled_gpus(facts, findings)
    if not clocks_compare(facts.seen):
        for finding in findings:
            finding.age_ns = 0  # times of different hosts' CUPTI clocks say nothing of which came first
    # Linking breaks ties by the order it is given: per group, collectives before P2P.
    findings.sort(key=_group_then_p2p)
    link_consequences(findings, went_past, facts.waits, _like_ranks_judge(facts),
                      frozenset(facts.analysis.layout.ranks_missing), held_past_peers(findings))
    findings += hosts_that_stopped(facts, findings)
    findings = unsettled_roots(findings)
    findings += runs.findings(inconsistent_entries)
    findings += runs.findings(unreadable_entries)
    findings += runs.findings(late_arrivals)
    findings += unaccounted_missing_ranks(facts, findings)
    findings += unseen_top_ranks(facts, findings)
    findings += empty_dumps(facts)
    return conclude(facts, findings)


def _like_ranks_judge(facts: Facts) -> LikeRanksJudge:
    """Of a P2P finding in a circle: whether the rank that never posted the partner op is
    blocked with a numbering fallen behind a like rank's (`Facts.like_rank_posted_more_p2p`),
    and whether its like rank, standing where it does, posted that partner
    (`Facts.like_partner_posted`)."""
    def judge(finding: Finding) -> LikeRanksSay:
        ends = finding.p2p_ends
        if (finding.kind != "p2p_unmatched" or ends is None or finding.group_id is None or ends.missing_on < 0
                or finding.p2p_seq_id is None):
            return LikeRanksSay()
        view = facts.device.views[finding.group_id]
        return LikeRanksSay(facts.like_rank_posted_more_p2p(view, ends.missing_on),
                            facts.like_partner_posted(view, ends.posted_by, ends.missing_on, finding.p2p_seq_id))

    return judge


def _group_then_p2p(finding: Finding) -> tuple[int, bool]:
    return finding.group_id if finding.group_id is not None else -1, finding.p2p_ends is not None


def _with_like_ranks_blocked(facts: Facts, finding: Finding, ranks: tuple[int, ...],
                             found: dict[int, WentPast], stopped: frozenset[int] = frozenset()) -> dict[int, WentPast]:
    """`found`, plus the ranks of a job of only active entries (whose programs the dumps
    do not hold) that a like rank shows went past the finding's collective: it ran the
    op, then reached the op the rank is blocked in (`Facts.like_rank_went_on`); for a send
    or recv never posted, the rank that never posted it, where a like rank blocked in the
    same op finished more of its group's work (`Facts.like_rank_ran_more_p2p`).

    Not a rank whose pg_status does not say how far it got in the group, where every rank
    waiting in the op has a GPU that stopped (`stopped`: it holds an op a peer finished):
    a dump of active entries leaves out the op it finished, and it may have finished its
    side before their GPUs stopped, as a peer of a stalled GPU does (`stuck_on_device`);
    its going on then says nothing of a skip."""
    if finding.group_id is None:
        return found
    view = facts.device.views[finding.group_id]
    if finding.kind == "p2p_unmatched" and finding.p2p_ends is not None:
        rank = finding.p2p_ends.missing_on
        stream = view.streams.get(rank)
        if rank in ranks and rank not in found and stream is not None and stream.only_active:
            instead = facts.like_rank_ran_more_p2p(view, rank)
            if instead is not None:
                found[rank] = WentPast(instead, facts.analysis.layout.group_of(instead.pg_name, rank), 1, True)
        return found
    if finding.collective_seq_id is None or finding.p2p_ends is not None:
        return found
    behind_stopped_gpus = bool(finding.waiting_ranks) and stopped.issuperset(finding.waiting_ranks)
    for rank in ranks:
        stream = view.streams.get(rank)
        if rank in found or stream is None or not stream.only_active:
            continue
        if behind_stopped_gpus and stream.enqueued is None:
            continue
        instead = facts.like_rank_went_on(view, finding.collective_seq_id, rank)
        if instead is not None:
            found[rank] = WentPast(instead, facts.analysis.layout.group_of(instead.pg_name, rank), 1, True)
    return found


def _own_went_past(finding: Finding, ranks: tuple[int, ...]) -> dict[int, WentPast]:
    """What the finding's own rule found of its ranks going past its op (a step left out:
    p2p.posted_pairs), for those of `ranks`."""
    return {rank: past for rank, past in finding.went_past.items() if rank in ranks}


def _went_past_judge(facts: Facts, processes: int, stopped: frozenset[int] = frozenset()) -> WentPastJudge:
    """went_past_finding of each question over one ProgramOrder, built when first asked
    (most jobs never ask) and kept for the diagnosis's later questions (skipped_not_ahead
    asks before linking does); a large job's many questions (a hang asks one per blocked
    group) shared among `processes` (side_by_side.shared_out)."""
    built: list[ProgramOrder] = []

    def judge(asked: list[tuple[Finding, tuple[int, ...]]]) -> list[dict[int, WentPast]]:
        if not built:
            built.append(ProgramOrder(facts.seen, facts.analysis.layout, facts.device))
        order = built[0]

        def answers(questions: list[tuple[Finding, tuple[int, ...]]]) -> list[dict[int, WentPast]]:
            return [_own_went_past(finding, ranks)
                    or _with_like_ranks_blocked(facts, finding, ranks, went_past_finding(order, finding, ranks), stopped)
                    for finding, ranks in questions]

        return shared_out(answers, asked, processes, facts)

    return judge

