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
"""

from __future__ import annotations

import pickle
from typing import Callable, Optional, Sequence

from frtrace.diagnosis.facts import Facts
from frtrace.diagnosis.finding import Finding
from frtrace.load.forked import Forked

Rule = Callable[[Facts], list[Finding]]

# Below this many entries a fork costs more than the rules it would take off this process.
FORK_FROM_ENTRIES = 500_000


class RuleRuns:
    """The rules of one diagnosis, some running in forked children (`started`)."""

    __slots__ = ("_facts", "_children")

    def __init__(self, facts: Facts, children: dict[Rule, Forked[list[Finding]]]) -> None:
        self._facts = facts
        self._children = children

    @classmethod
    def start(cls, facts: Facts, costly_first: Sequence[Rule], processes: int) -> "RuleRuns":
        """Fork a child for each of the first `processes - 1` rules of `costly_first`
        (this process is the last one), when the job is large enough to pay for it."""
        children: dict[Rule, Forked[list[Finding]]] = {}
        if processes > 1 and _entries(facts) >= FORK_FROM_ENTRIES:
            for rule in costly_first[:processes - 1]:
                child = _fork(rule, facts)
                if child is None:
                    break
                children[rule] = child
        return cls(facts, children)

    @property
    def started(self) -> tuple[Rule, ...]:
        """The rules running (or run) in a child and not yet collected."""
        return tuple(self._children)

    def findings(self, rule: Rule) -> list[Finding]:
        """`rule(facts)`: the child's result where one ran it, else run here."""
        child = self._children.pop(rule, None)
        if child is not None:
            try:
                found, _ = child.collect()
            except (pickle.UnpicklingError, EOFError, OSError):  # a result that does not read back
                found = None
            if found is not None:
                return found
        return rule(self._facts)

    def close(self) -> None:
        """Collect what is left (a diagnosis that stopped early): no child is left unwaited."""
        for rule in list(self._children):
            try:
                self._children.pop(rule).collect()
            except (pickle.UnpicklingError, EOFError, OSError):
                pass  # unwanted anyway


def _fork(rule: Rule, facts: Facts) -> Optional[Forked[list[Finding]]]:
    try:
        return Forked.start(rule, facts)
    except (OSError, AttributeError):  # no fork here (AttributeError: no os.fork at all)
        return None


def _entries(facts: Facts) -> int:
    return sum(len(dump.entries) for dump in facts.seen)
