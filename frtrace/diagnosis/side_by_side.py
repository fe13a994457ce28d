"""Rules run side by side: the costliest rules that read only the Facts, each in a forked
child while this process runs the others.

Takes the Facts, how many processes may run at once and the rules the diagnosis will ask
for; returns a `RuleRuns` whose `findings(rule)` gives each rule's findings, the same as
`rule(facts)` in this process gives (its plain twin: `processes=1`, where nothing forks).

A rule here reads the Facts and changes nothing outside its own findings (the lazily
worked-out parts of the Facts, such as `waits`, are worked out again where needed), so
running it in a child that inherited the Facts gives what running it here gives. Nothing
is sent to a child; each sends back its findings, read back allowing frtrace's own
records only (`OwnResultUnpickler`). A child that fails (no fork, killed, a result that
will not read back) costs only time: its rule then runs here.

`shared_out` does the same for many like questions (linking's went-past questions): it
answers them in runs, one here and each other in a child, in their order; `by_views`
for a rule's groups (the longest rules share theirs out again in their own child).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional, Protocol, Sequence, TypeVar

from frtrace.diagnosis.facts import Facts
from frtrace.diagnosis.finding import Finding
from frtrace.load.forked import Forked, in_children, may_fork
from frtrace.match.matcher import GroupView
from frtrace.table.rank_dump import RankDump

Rule = Callable[[Facts], list[Finding]]


class SpreadRule(Protocol):
    """A rule that can use several processes itself: `processes`, how many."""

    def __call__(self, facts: Facts, processes: int = 1) -> list[Finding]: ...


# Below this many entries a fork costs more than the rules it would take off this process.
FORK_FROM_ENTRIES = 500_000
# The fewest questions (see shared_out) a child answers: at about 0.2 ms each (went-past
# questions at 4,096 ranks), some 100 ms of work, against 10 to 50 ms to fork a large job.
QUESTIONS_PER_RUN = 512

_Question = TypeVar("_Question")
_Answer = TypeVar("_Answer")


class RuleRuns:
    """The rules of one diagnosis, some running in forked children (`started`)."""

    __slots__ = ("_facts", "_children", "_collected", "processes")

    def __init__(self, facts: Facts, children: dict[Rule, Forked[list[Finding]]], processes: int = 1) -> None:
        self._facts = facts
        self._children = children
        self._collected: list[Forked[list[Finding]]] = []  # to reap (see close)
        self.processes = processes  # how many may run at once

    @classmethod
    def start(cls, facts: Facts, costly_first: Sequence[Rule], processes: int,
              spread: Sequence[SpreadRule] = ()) -> "RuleRuns":
        """A forked child for each of the first `processes - 1` rules of `costly_first`
        (this process is the last one), when the job is large enough to pay for it. The
        rules in `spread` (the longest by far: the stragglers' sampling and the
        all_to_all sizes, a group at a time), where among them, share the processes no
        other child takes, and at least half of them between them: each child shares its
        rule's groups out again."""
        children: dict[Rule, Forked[list[Finding]]] = {}
        if worth_forking(facts.seen, processes):
            forked = costly_first[:processes - 1]
            among = max(1, sum(1 for rule in forked if _spread_as(rule, spread) is not None))
            each = max(1 + (processes - len(forked)) // among, processes // (2 * among))
            works = [_given(rule, spread, each) for rule in forked]
            # Forked as a tree (start_each): this process forks one child, not one per rule.
            started = Forked.start_each(partial(_run_on, facts), works)
            children = {rule: child for rule, child in zip(forked, started) if child is not None}
        return cls(facts, children, processes)

    @property
    def started(self) -> tuple[Rule, ...]:
        """The rules running (or run) in a child and not yet collected."""
        return tuple(self._children)

    def findings(self, rule: Rule) -> list[Finding]:
        """`rule(facts)`: the child's result where one ran it, else run here."""
        child = self._children.pop(rule, None)
        found = None
        if child is not None:
            self._collected.append(child)
            found = child.result(wait=False)  # reaped in close, once it has given its memory back
        return found if found is not None else rule(self._facts)

    def close(self) -> None:
        """Collect what is left (a diagnosis that stopped early) and reap every child: no
        child is left unwaited."""
        for child in self._children.values():
            child.result()  # unwanted: only reaped
        self._children.clear()
        for child in self._collected:
            child.reap()
        self._collected.clear()


def _spread_as(rule: Rule, spread: Sequence[SpreadRule]) -> Optional[SpreadRule]:
    """`rule` as one of `spread` (a rule that takes its processes), if it is one."""
    return next((wide for wide in spread if wide is rule), None)


def _given(rule: Rule, spread: Sequence[SpreadRule], processes: int) -> Rule:
    """What a rule's child runs: the rule, given `processes` where it is one of `spread`."""
    wide = _spread_as(rule, spread)
    return rule if wide is None else partial(wide, processes=processes)


def _run_on(facts: Facts, work: Rule) -> list[Finding]:
    return work(facts)


def shared_out(answer: Callable[[list[_Question]], list[_Answer]], questions: list[_Question], processes: int,
               facts: Facts) -> list[_Answer]:
    """`answer(questions)`, the questions of a large job (FORK_FROM_ENTRIES) shared out
    in runs of about equal length, at most `processes` and at least QUESTIONS_PER_RUN
    long: this process answers the first, a forked child each other one meanwhile
    (`in_children`). `answer` must answer each question alone, as it would among the
    others."""
    runs = min(processes, len(questions) // max(1, QUESTIONS_PER_RUN))
    if runs <= 1 or not worth_forking(facts.seen, processes):
        return answer(questions)
    size = -(-len(questions) // runs)
    shares = [questions[start:start + size] for start in range(0, len(questions), size)]
    return [found for answered in in_children(answer, shares) for found in answered]


def by_views(answer: Callable[[Sequence[GroupView]], _Answer], views: Sequence[GroupView],
             processes: int) -> list[_Answer]:
    """`answer` of `views` cut into at most `processes` runs of about as many members (what
    a rule that reads each member's entries of a group costs), in their order: the first
    answered here, each other in a forked child meanwhile (`in_children`). One run, here,
    where a fork may not pay (`may_fork`)."""
    if not may_fork(processes) or len(views) < 2:
        return [answer(views)]
    return in_children(answer, view_shares(views, processes))


def view_shares(views: Sequence[GroupView], parts: int) -> list[list[GroupView]]:
    """`views` cut into at most `parts` runs of about as many members, in their order."""
    total = sum(len(view.streams) for view in views)
    shares: list[list[GroupView]] = [[]]
    size = 0
    for view in views:
        if size * parts >= total * len(shares) and len(shares) < parts:
            shares.append([])
        shares[-1].append(view)
        size += len(view.streams)
    return [share for share in shares if share]


def worth_forking(dumps: Sequence[RankDump], processes: int) -> bool:
    """Whether work on these dumps may go to forked children: `processes` to spare
    (may_fork) and a job large enough (FORK_FROM_ENTRIES) to pay for the forks."""
    return may_fork(processes) and sum(len(dump.entries) for dump in dumps) >= FORK_FROM_ENTRIES
