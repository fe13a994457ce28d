"""Across groups: which findings are root causes and which follow from them.

Takes the findings of the per-group rules, a judge of whether absent ranks went past
an op, one of what like ranks in sibling groups say of a P2P finding of a circle, and
the ranks without a dump;
sets each finding's `went_past`, `caused_by` and `link` (and a circle's `partner_posted`
and its root's `fell_behind`). A rank that never issued an op because it is waiting in
another group's unfinished op is a victim (a TP hang stalls DP, which stalls the
pipeline's P2P), unless it went past the op (ranks like it issued the op where it issued
something else); a rank that is waiting nowhere, or went past, is where the trouble
starts, and every finding it is absent from is one story. Findings that wait on each other in a circle (a desync deadlock) get their most
fundamental member as the root (one whose suspect's P2P numbering fell behind a like
rank's, where a sibling pipeline shows it), else their oldest. A root that blames only
ranks without a dump follows from roots the dumps decide (`unseen`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Optional

from frtrace.diagnosis.finding import Finding, LikeRanksSay, WentPast
from frtrace.diagnosis.frontier import STUCK_ON_DEVICE
from frtrace.diagnosis.kinds import kind as kind_row
from frtrace.diagnosis.waits import Waits

# Each (finding, absent ranks to judge) -> {rank: WentPast} for those that went past its op,
# in order: asked all at once, so that the questions can be answered side by side.
WentPastJudge = Callable[[list[tuple[Finding, tuple[int, ...]]]], list[dict[int, WentPast]]]
# A finding of a circle -> what like ranks in sibling groups say of it (LikeRanksSay).
LikeRanksJudge = Callable[[Finding], LikeRanksSay]
Held = list[tuple[Finding, set[int]]]  # other findings, and the absent ranks waiting in each
NOTHING_SAID = LikeRanksSay()


def _root_priority(finding: Finding) -> int:
    priority = kind_row(finding.kind).root_priority
    assert priority is not None
    return priority


def _circle_priority(finding: Finding) -> int:
    priority = kind_row(finding.kind).circle_priority
    assert priority is not None
    return priority


def _same_place(a: Finding, b: Finding) -> bool:
    """Findings about one collective stream, or one P2P channel, cannot explain each other."""
    if a.group_id != b.group_id or (a.p2p_ends is None) != (b.p2p_ends is None):
        return False
    if a.p2p_ends is not None and b.p2p_ends is not None:
        return a.p2p_ends[:2] == b.p2p_ends[:2]
    return True


def _stalled_before(root: Finding, finding: Finding) -> bool:
    """Whether `root` is a device stall at an earlier collective of `finding`'s group: the
    stalled ranks hold every later op of the group queued behind it, which is why they
    never started `finding`'s op (the one exception to `_same_place`)."""
    return (root.rule == STUCK_ON_DEVICE and finding.p2p_ends is None and root.collective_seq_id is not None
            and finding.collective_seq_id is not None and root.collective_seq_id < finding.collective_seq_id)


def _source_circle(members: list[Finding], parents: dict[Finding, set[Finding]], resolved: set[Finding]) -> list[Finding]:
    """Unresolved findings that nothing outside their own circle holds."""
    open_members = [f for f in members if f not in resolved]
    inside = set(open_members)

    def ancestors(finding: Finding) -> set[Finding]:
        seen: set[Finding] = set()
        todo = [finding]
        while todo:
            for parent in parents.get(todo.pop(), ()):
                if parent in inside and parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    lineage = {f: ancestors(f) for f in open_members}
    sources = [f for f in open_members if all(f in lineage[a] for a in lineage[f])]
    return sources or open_members


def _holders(blocking: list[Finding], candidates: list[Finding], gone_past: dict[Finding, dict[int, WentPast]],
             waits: Optional[Waits] = None) -> dict[Finding, Held]:
    """finding -> [(other finding, its absent ranks that wait in the other)]. A rank
    that went past the op is not held anywhere: it skipped it. A rank that waits in no
    finding's op but on other ranks (its send or recv is posted, and so is the other
    end's, which waits in turn) is held where the nearest of those waits."""
    # Indexed by waiting rank: comparing every finding with every other is quadratic, and a
    # hang across thousands of ranks leaves thousands of findings.
    waiting_in: dict[int, list[tuple[int, Finding]]] = defaultdict(list)
    for position, candidate in enumerate(candidates):
        for rank in candidate.waiting_ranks:
            waiting_in[rank].append((position, candidate))
    holders = {}
    for finding in blocking:
        absent = set(finding.absent_ranks) - gone_past.get(finding, {}).keys()
        held: dict[int, tuple[Finding, set[int]]] = {}  # candidate position -> (candidate, ranks waiting in it)
        for rank in absent:
            for position, candidate in _waits_in(rank, finding, waiting_in, waits):
                held.setdefault(position, (candidate, set()))[1].add(rank)
        holders[finding] = [held[position] for position in sorted(held)]
    return holders


def _waits_in(rank: int, finding: Finding, waiting_in: dict[int, list[tuple[int, Finding]]],
              waits: Optional[Waits]) -> list[tuple[int, Finding]]:
    """The other findings `rank` waits in: its own, else those of the nearest ranks it waits on."""
    def others(ranks: list[int]) -> list[tuple[int, Finding]]:
        return [(position, candidate) for r in ranks for position, candidate in waiting_in.get(r, ())
                if candidate is not finding and not _same_place(candidate, finding)]

    found = others([rank])
    if found or waits is None or rank in waiting_in:
        return found
    for layer in waits.layers(rank):
        found = others(layer)
        if found:
            return found
    return []


def _ranks_gone_past(blocking: list[Finding], candidates: list[Finding], holders: dict[Finding, Held],
                     went_past: WentPastJudge) -> dict[Finding, dict[int, WentPast]]:
    """finding -> {rank: WentPast} for absent ranks that wait elsewhere only because
    they went past this finding's op."""
    extra_ops = {(f.group_id, f.collective_seq_id): set(f.suspect_ranks) for f in candidates if f.kind == "extra_op"}
    asked = []
    for finding in blocking:
        held = set().union(*(ranks for _, ranks in holders[finding]))
        if held:
            asked.append((finding, tuple(sorted(held))))
    gone = {}
    for (finding, _), found in zip(asked, went_past(asked) if asked else []):
        # Issuing an op where like ranks issued this one, with nothing to show it comes
        # after this one in the program, may as well be an extra op inserted before it:
        # when an extra_op finding names the rank for that op, that story is the one to
        # tell. (An unmatched P2P finding would blame the other end, so not for P2P.)
        found = {rank: past for rank, past in found.items()
                 if past.confirmed or past.instead.is_p2p
                 or rank not in extra_ops.get((past.instead_group, past.instead.collective_seq_id), ())}
        if found:
            gone[finding] = found
    return gone


def link_consequences(findings: list[Finding], went_past: Optional[WentPastJudge] = None,
                      waits: Optional[Waits] = None, like_ranks: Optional[LikeRanksJudge] = None,
                      undumped: frozenset[int] = frozenset(), stopped: frozenset[int] = frozenset()) -> None:
    """Mark which findings are roots and which follow from them (see module docstring).
    `undumped`: the ranks without a usable dump; `stopped`: those whose GPU shows it
    stopped (they hold an op a peer finished: see `_circle_root`)."""
    candidates = [f for f in findings if kind_row(f.kind).root_priority is not None]
    blocking = [f for f in candidates if kind_row(f.kind).blocks_peers and f.absent_ranks]
    holders = _holders(blocking, candidates, {}, waits)
    gone_past = _ranks_gone_past(blocking, candidates, holders, went_past) if went_past else {}
    if gone_past:
        holders = _holders(blocking, candidates, gone_past, waits)
        for finding, gone in gone_past.items():
            finding.went_past = gone
    for finding, (root, link) in _causes(candidates, blocking, holders, like_ranks, stopped).items():
        finding.caused_by, finding.link = root, link
    _unseen_behind_seen(candidates, undumped)


def _unseen_behind_seen(candidates: list[Finding], undumped: frozenset[int]) -> None:
    """A root that blames only ranks without a dump, for ops they never joined, says no
    more than that nobody saw them: where they wait is unknown. When other roots blame
    ranks whose dumps show what they did, and decide them, it is read as following from
    those ("unseen"): a rank stuck behind them leaves its peers waiting the same way, and
    a dump lost besides proves nothing against it. Alone, it stays the root (a host that
    hung hard enough to write no dump)."""
    roots = [f for f in candidates if f.caused_by is None and f.own_suspects]
    # Only a root that decides its suspects, not an even split blamed on the ranks that
    # did not arrive: with a hung rank's dump lost, the ranks stuck behind it can split
    # a two-member group that way.
    seen = [f for f in roots if not set(f.own_suspects) <= undumped and not f.tie]
    if not seen:
        return
    for finding in roots:
        if set(finding.own_suspects) <= undumped:
            finding.caused_by, finding.link = seen[0], "unseen"


def _circle_root(circle: list[Finding], like_ranks: Optional[LikeRanksJudge] = None,
                 stopped: frozenset[int] = frozenset()) -> Finding:
    """The root of findings that wait on each other in a circle (a deadlock). The
    narrowest story wins: one rank to blame beats a whole half of the job. Then the rank
    the circle blames most often: a rank that broke the program (skipped one op, issued
    another) turns up in a finding for each. An op the sibling groups all issued is
    surely part of the program. Then what like ranks in sibling groups say (`like_ranks`):
    a finding whose "never posted" they belie comes last (the like rank of its suspect,
    standing where it does, posted that op); a finding whose suspect's P2P numbering fell
    behind its like rank's, while its peer keeps pace, first (it left ops out). Last, before
    the age: a finding whose suspect holds an op elsewhere that a peer finished (`stopped`),
    the sign of a GPU that stopped, where the circle's findings are otherwise alike."""
    # A pair of ranks' two channels count once: a rank stuck elsewhere leaves both its send
    # to a peer and its recv from it unposted, one story told twice.
    blamed = Counter(rank for rank, _ in {(rank, _told(finding)) for finding in circle for rank in finding.suspect_ranks})

    def support(finding: Finding) -> int:
        return max((blamed[rank] for rank in finding.suspect_ranks), default=0)

    said = {f: like_ranks(f) for f in circle} if like_ranks is not None else {}
    for finding, say in said.items():
        finding.partner_posted = say.partner_posted

    def weight(finding: Finding) -> tuple[int, int, int, bool, bool, bool, bool]:
        say = said.get(finding, NOTHING_SAID)
        return (len(finding.suspect_ranks), -support(finding), _circle_priority(finding), not finding.siblings_issued_it,
                say.partner_posted is not None, say.fell_behind is None, not stopped & set(finding.suspect_ranks))

    root = min(circle, key=lambda f: (weight(f), f.age_ns))
    root.fell_behind = said.get(root, NOTHING_SAID).fell_behind
    # Only the age told the root from findings that blame other ranks: say so (the report
    # names the circle, the confidence drops). The oldest op is where a circle most often
    # starts, not always.
    alike = {rank for f in circle if weight(f) == weight(root) for rank in f.suspect_ranks}
    if alike - set(root.suspect_ranks):
        root.circle = tuple(sorted(alike))
    return root


def _told(finding: Finding) -> object:
    """What a finding tells of its suspects: itself, or for a P2P finding, its pair of ranks."""
    if finding.p2p_ends is None:
        return finding
    return finding.group_id, frozenset(finding.p2p_ends[:2])


def _causes(candidates: list[Finding], blocking: list[Finding], holders: dict[Finding, Held],
            like_ranks: Optional[LikeRanksJudge] = None,
            stopped: frozenset[int] = frozenset()) -> dict[Finding, tuple[Finding, str]]:
    """finding -> (its root cause, how: "same_suspects" or "blocked")."""
    roots = [f for f in candidates if f not in holders]
    cause = _same_suspects(blocking, holders, roots)
    cause.update(_blocked(blocking, holders, roots, set(roots) | set(cause), like_ranks, stopped))
    return cause


def _same_suspects(blocking: list[Finding], holders: dict[Finding, Held], roots: list[Finding]) -> dict[Finding, tuple[Finding, str]]:
    """Findings with ranks that wait nowhere, the purest first (fewest victims in them):
    one whose free ranks a root (not about the same place) blames already follows from
    it; the others are roots too (appended to `roots`)."""
    waited = {f: set().union(set(), *(held for _, held in holders[f])) for f in blocking}
    cause: dict[Finding, tuple[Finding, str]] = {}
    partial = [f for f in blocking if set(f.absent_ranks) - waited[f]]
    for finding in sorted(partial, key=lambda f: (len(waited[f]), _root_priority(f), f.age_ns)):
        free = set(finding.absent_ranks) - waited[finding]
        others = [r for r in roots if not _same_place(r, finding) or _stalled_before(r, finding)]
        same = _blaming_together(others, free)
        if same:  # one root that blames them all comes first: it blames the most of them
            cause[finding] = (min(same, key=lambda r: (-len(free & set(r.suspect_ranks)), _root_priority(r), r.age_ns)),
                              "same_suspects")
        else:
            _narrow_to_free(finding, waited[finding])
            roots.append(finding)
    return cause


def _narrow_to_free(finding: Finding, waiting_elsewhere: set[int]) -> None:
    """A root some of whose absent ranks wait in other findings' ops blames the rest: those
    wait nowhere, and the others are victims whose own ops tell their story (a job-wide op
    that two ranks stopped before, at once, while the ranks behind them wait in theirs)."""
    held = waiting_elsewhere & set(finding.own_suspects)
    if held and set(finding.own_suspects) - held:
        finding.held_elsewhere = tuple(sorted(held))


def _blaming_together(roots: list[Finding], free: set[int]) -> list[Finding]:
    """The roots that blame some of `free`, where together they blame them all: one root,
    or several (two ranks that stopped at once, each the root of its own group's finding,
    leave a job-wide op both never issued); empty where they do not."""
    blaming = [r for r in roots if free & set(r.suspect_ranks)]
    return blaming if blaming and free <= set().union(*(r.suspect_ranks for r in blaming)) else []


def _blocked(blocking: list[Finding], holders: dict[Finding, Held], roots: list[Finding],
             resolved: set[Finding], like_ranks: Optional[LikeRanksJudge] = None,
             stopped: frozenset[int] = frozenset()) -> dict[Finding, tuple[Finding, str]]:
    """The findings left, each blocked in the settled finding that holds most of its
    ranks, settled in waves from the roots (`resolved`); where none is ready, the
    findings wait on each other in a circle, whose root joins `roots`."""
    cause: dict[Finding, tuple[Finding, str]] = {}
    parents = {f: {g for g, _ in pairs} for f, pairs in holders.items()}
    pending = [f for f in blocking if f not in resolved]
    while pending:
        ready = [f for f in pending if any(g in resolved for g, _ in holders[f])]
        if not ready:
            best = _circle_root(_source_circle(pending, parents, resolved), like_ranks, stopped)
            roots.append(best)
            ready = [best]
        for finding in ready:
            if finding not in roots:
                cause[finding] = (_main_holder(holders[finding], resolved), "blocked")
            resolved.add(finding)
        pending = [f for f in pending if f not in resolved]
    return cause


def _main_holder(held: Held, resolved: set[Finding]) -> Finding:
    """Of the settled findings holding a finding's ranks, the one that holds most (the
    newest of those)."""
    settled = [(g, ranks) for g, ranks in held if g in resolved]
    return max(settled, key=lambda p: (len(p[1]), -p[0].age_ns))[0]
