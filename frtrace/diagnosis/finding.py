"""What a rule finds, and what the diagnosis as a whole concludes.

A `Finding` holds what its rule saw (`statement`, `facts`) and, once the findings are
linked, how it relates to others (`went_past`, `caused_by`, `link`). The message,
evidence, severity and suspects the reports show are derived from both, so linking
never edits text. Findings compare and hash by identity.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from frtrace.diagnosis.kinds import kind as kind_row
from frtrace.model import Entry
from frtrace.wording import call_site, op_text, ranks_text

# Said of a not_issued finding on an even split until something better explains it.
TIE_NOTE = " (even split: the ranks that did not arrive are blamed, as they are behind)"


class P2PEnds(NamedTuple):
    """The channel of an unmatched send or recv, in global ranks (-1 for `?`)."""

    src: int
    dst: int
    posted_by: int  # the rank holding the op
    missing_on: int  # the rank that never posted its partner


@dataclass(slots=True)
class WentPast:
    """Evidence that a rank went past an op its like ranks issued next."""

    instead: Entry  # what the rank issued where its like ranks issued the op
    instead_group: Optional[int]  # its group id
    like_ranks: int  # like ranks that issued the op right there (0: its own past says so)
    # Like ranks (or the rank itself, earlier) issued `instead` after the op: the rank
    # skipped it. Without that it may as well have inserted `instead` (an extra op).
    confirmed: bool
    # `instead` is in the very batch its like ranks posted the op in, which the rank
    # posted without it (a batch is posted whole): it left the op out of that batch.
    in_batch: bool = False


class LikeRankAhead(NamedTuple):
    """A rank blocked in a send or recv whose like rank in a sibling group is blocked in
    the same op `ahead` P2P numbers further on, their peers standing alike
    (`Facts.like_rank_posted_more_p2p`): the rank left ops out."""

    rank: int
    op: str  # the op both are blocked in, as the rank numbered it, in words
    like_rank: int
    like_group: str  # the sibling group, in words
    ahead: int


class LikePartnerPosted(NamedTuple):
    """For a send or recv whose partner a rank never posted: the like ranks (in the
    holder's and that rank's places in a sibling group) where the holder's like rank
    finished its op of that number while the other stands where that rank does
    (`Facts.like_partner_posted`, `Facts.partner_went_on_as_like_rank`): the partner was
    posted, the holder's op never finished."""

    like_holder: int
    like_absent: int
    like_group: str  # the sibling group, in words


class LikeRanksSay(NamedTuple):
    """What the like ranks in sibling groups say of a P2P finding of a deadlock circle."""

    fell_behind: Optional[LikeRankAhead] = None  # of its suspect
    partner_posted: Optional[LikePartnerPosted] = None  # against its "never posted"


@dataclass(eq=False, slots=True)
class Finding:
    kind: str
    rule: str  # the function that produced it
    own_severity: str  # before linking: a consequence of another finding is a warning
    group_id: Optional[int]
    pg_name: str
    pg_desc: str
    op: Optional[str]
    collective_seq_id: Optional[int]
    p2p_seq_id: Optional[int]
    ranks: tuple[int, ...]  # every rank the finding is about
    own_suspects: tuple[int, ...]  # before linking: a blocked consequence blames nobody
    statement: str  # what the rule saw, in words
    facts: dict[str, Any] = field(default_factory=dict)  # what the rule saw, as evidence
    waiting_ranks: tuple[int, ...] = ()  # ranks that issued the op and wait for the suspects
    # Ranks whose absence the finding is about (who never issued the op); when they are
    # all waiting somewhere else, this finding is a consequence of that other one.
    absent_ranks: tuple[int, ...] = ()
    # The entry the finding is about (for P2P, the posted send or recv): it locates the
    # same op in sibling groups when deciding whether an absent rank went past it.
    anchor: Optional[Entry] = None
    age_ns: int = 0  # creation time of the oldest entry involved: older roots come first
    p2p_ends: Optional[P2PEnds] = None
    # The entries its evidence's call sites were read from (`suspect_call_site` ->
    # entry): `-v` says which frames were passed over to reach the user's code.
    call_entries: dict[str, Entry] = field(default_factory=dict)
    tie: bool = False  # an even split blamed on the ranks that did not arrive
    siblings_issued_it: bool = False  # every sibling group issued the op
    # Set by linking:
    went_past: dict[int, WentPast] = field(default_factory=dict)  # absent ranks that skipped the op
    # The ranks of a deadlock circle whose findings nothing but their age told apart, when
    # this one was made its root as the oldest (linking._circle_root): any of them may have
    # started it.
    circle: tuple[int, ...] = ()
    # When this circle's root was told from the others by its suspect's numbering having
    # fallen behind a like rank's (linking._circle_root), that evidence.
    fell_behind: Optional[LikeRankAhead] = None
    # Set by linking for a P2P finding of a circle whose "never posted" like ranks belie.
    partner_posted: Optional[LikePartnerPosted] = None
    # Set by linking for a root whose absent ranks partly wait in other findings' ops: those
    # (victims, blamed by the ops they wait in) leave its suspects; the others wait nowhere.
    held_elsewhere: tuple[int, ...] = ()
    caused_by: Optional["Finding"] = None  # the root cause this finding follows from
    # "blocked" (its ranks wait in the root) | "same_suspects" | "unseen" (it blames only
    # ranks without a dump, while the root blames ranks whose dumps show what they did) |
    # "running" (it reads a hang off where ranks stand, in dumps of a job that still ran:
    # running.unsettled_roots) | "lagging" (a note of ranks behind their peers there, which
    # the job-wide root lists)
    link: Optional[str] = None

    def __post_init__(self) -> None:
        kind_row(self.kind)  # an unregistered kind fails here, where the rule made it

    @property
    def is_root(self) -> bool:
        return self.caused_by is None

    @property
    def severity(self) -> str:
        # A note folded under a root as its detail stays a note.
        return self.own_severity if self.caused_by is None or self.link == "lagging" else "warning"

    @property
    def suspect_ranks(self) -> tuple[int, ...]:
        if self.link in ("blocked", "unseen", "running"):
            return ()
        if self.held_elsewhere and self.caused_by is None:
            return tuple(r for r in self.own_suspects if r not in self.held_elsewhere)
        return self.own_suspects

    @property
    def message(self) -> str:
        text = self.statement
        if self.tie and not self.went_past and self.caused_by is None:
            text += TIE_NOTE
        if self.went_past:
            text += "; " + "; ".join(_went_past_texts(self.went_past))
        if self.partner_posted is not None and self.p2p_ends is not None:
            text += _partner_posted_text(self.partner_posted, self.p2p_ends)
        if self.fell_behind is not None and self.caused_by is None:
            text += "; " + _fell_behind_text(self.fell_behind)
        if self.held_elsewhere and self.caused_by is None:
            held = self.held_elsewhere
            text += (f"; of those, {ranks_text(held)} {'waits' if len(held) == 1 else 'wait'} in ops that other "
                     f"findings explain (a consequence of those), and {ranks_text(self.suspect_ranks)} on no other rank")
        if self.circle and self.caused_by is None:
            text += (f" (findings that wait on each other in a circle blame {ranks_text(self.circle)} alike; this op"
                     f" is the oldest of theirs, and any of those ranks may have started it)")
        if self.link == "running":
            text += " — if the job had hung: it was still running when dumped (the job-wide warning says why)"
        elif self.caused_by is not None and self.link != "lagging":
            where = _root_place(self.caused_by)
            if self.link == "blocked":
                text += f" — a consequence: they are stuck in {where}"
            elif self.link == "unseen":
                they = "it waits" if len(self.own_suspects) == 1 else "they wait"
                text += (f" — which may follow from the root cause in {where}: {ranks_text(self.own_suspects)} left "
                         f"no dump to show where {they}")
            else:
                text += f" — the same rank(s) as the root cause in {where}"
        return text

    @property
    def evidence(self) -> dict[str, Any]:
        evidence = dict(self.facts)
        if self.went_past:
            evidence.pop("tie_broken_by", None)
            evidence["went_past"] = {str(rank): _went_past_evidence(past) for rank, past in sorted(self.went_past.items())}
        if self.fell_behind is not None and self.caused_by is None:
            evidence["fell_behind"] = self.fell_behind._asdict()
        if self.partner_posted is not None:
            evidence["partner_posted"] = self.partner_posted._asdict()
        if self.held_elsewhere and self.caused_by is None:
            evidence["held_elsewhere"] = list(self.held_elsewhere)
        if self.circle and self.caused_by is None:
            evidence["deadlock_circle_ranks"] = list(self.circle)
        root = self.caused_by
        if root is not None:
            evidence["link"] = self.link
            evidence["consequence_of"] = {"kind": root.kind, "pg_name": root.pg_name,
                                          "collective_seq_id": root.collective_seq_id}
            if self.link == "blocked":
                evidence["blocked_ranks"] = list(self.absent_ranks)
        return evidence


@dataclass(slots=True)
class Diagnosis:
    status: str  # healthy | faults | inconclusive
    suspect_ranks: tuple[int, ...]
    verdict: str
    findings: list[Finding]  # roots first, then consequences, then notes


def _root_place(root: Finding) -> str:
    seq = root.collective_seq_id if root.collective_seq_id is not None else root.p2p_seq_id
    return f"{root.op} #{seq} of group {root.pg_name}"


def _went_past_texts(gone: dict[int, WentPast]) -> list[str]:
    """One clause per story: ranks that went on to the same op the same way share it."""
    stories: dict[tuple[str, bool, bool, bool], list[int]] = defaultdict(list)
    for rank in sorted(gone):
        past = gone[rank]
        stories[(op_text(past.instead), not past.like_ranks, past.confirmed, past.in_batch)].append(rank)
    return [_went_past_text(ranks, gone[ranks[0]]) for ranks in stories.values()]


def _went_past_text(ranks: list[int], past: WentPast) -> str:
    one = len(ranks) == 1
    they, their = ("it", "its") if one else ("they", "their")
    if past.in_batch:
        return (f"{ranks_text(ranks)} posted {op_text(past.instead)} without it (ranks like "
                f"{they if one else 'them'} posted both in that batch: {they} left it out)")
    text = f"{ranks_text(ranks)} went on to {op_text(past.instead)} instead"
    if not past.like_ranks:
        return text + f" ({their} earlier steps issue that after this op: {they} skipped it)"
    if past.confirmed:
        return text + f" (ranks like {they if one else 'them'} issue that after this op: {they} skipped it)"
    return text + f" (ranks like {they if one else 'them'} issued this op there)"


def _fell_behind_text(behind: LikeRankAhead) -> str:
    count = "one op" if behind.ahead == 1 else f"{behind.ahead} ops"
    return (f"rank {behind.rank} waits in {behind.op}, numbered {count} short of rank {behind.like_rank}, which plays "
            f"its part in {behind.like_group} and waits in the same op on a peer that stands where rank "
            f"{behind.rank}'s does: rank {behind.rank} left {count} out")


def _partner_posted_text(posted: LikePartnerPosted, ends: P2PEnds) -> str:
    return (f", or so its dump suggests: rank {posted.like_absent}, in rank {ends.missing_on}'s place in "
            f"{posted.like_group}, waits in the same op as rank {ends.missing_on} and posted the partner of rank "
            f"{posted.like_holder}'s op of this number, which finished; rank {ends.missing_on} likely posted it too, "
            f"and it is rank {ends.posted_by}'s op that never finished")


def _went_past_evidence(past: WentPast) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "instead": op_text(past.instead),
        "evidence": "own_past" if not past.like_ranks else "like_ranks",
        "like_ranks": past.like_ranks,
        "skipped": past.confirmed,
    }
    site = call_site(past.instead)
    if site:
        evidence["call_site"] = site  # where its code went on: the skipped call comes before it
    return evidence
