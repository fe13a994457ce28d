"""Entries that contradict their own op and group size.

Takes `Facts`; returns `inconsistent_entry` warnings, one per group, naming the first
collective whose entries cannot be what c10d records: an all_reduce whose output is not
its input, an all_gather whose output is not group size times its input, a reduce_scatter
whose input is not group size times its output, a list-form all_gather or reduce_scatter
with a buffer count other than the group size, input and output dtypes that differ.
Real c10d refuses such calls before it records them, so even when every rank recorded
the entry alike it is evidence of a corrupt dump or one from another producer: the
ranks agree, yet the dumps cannot be taken at their word (a warning, which makes a job
with nothing else wrong inconclusive, never a fault).

`contradiction` is the check itself (the divergence rule also asks it, to tell which
camp of an even split recorded the impossible entry). Gloo's own ways are respected:
its all_gather output is one stacked tensor whose first dimension is not always the
group size (all_gather_coalesced), and it records a reduce_scatter as an all_reduce.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional, Sequence

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.model import Group, OpName, Shapes, numel
from frtrace.table.entry_table import EntryTable, StaticRow
from frtrace.wording import group_text, ranks_text

ShapeList = Sequence[Sequence[int]]  # the sizes of an op's input (or output) tensors

REDUCE_OPS = frozenset({"all_reduce", "allreduce_coalesced"})
GATHER_OPS = frozenset({"all_gather", "_all_gather_base", "all_gather_into_tensor", "all_gather_into_tensor_coalesced"})
SCATTER_OPS = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor",
                         "reduce_scatter_tensor_coalesced"})
# Ops whose every tensor has one dtype (c10d checks it before recording).
_ONE_DTYPE_OPS = REDUCE_OPS | GATHER_OPS | SCATTER_OPS


def contradiction(name: OpName, shapes: Shapes, group_size: Optional[int]) -> Optional[str]:
    """Why an entry of op `name` with `shapes`, in a group of `group_size` members (None:
    not reliably known), cannot be what c10d records; None when it can."""
    op = name.op
    if op not in _ONE_DTYPE_OPS or not shapes.readable:
        return None
    in_dtypes, out_dtypes = set(shapes.input_dtypes), set(shapes.output_dtypes)
    if in_dtypes and out_dtypes and in_dtypes != out_dtypes:
        return f"input dtype {'/'.join(sorted(in_dtypes))} but output dtype {'/'.join(sorted(out_dtypes))}"
    ins, outs = shapes.input_sizes, shapes.output_sizes
    if not ins or not outs:  # a side not recorded: nothing to hold the other against
        return None
    gloo = name.backend == "gloo"
    if op in REDUCE_OPS:
        return _reduced(ins, outs, gloo)
    if group_size is None:
        return None
    if op in GATHER_OPS:
        return _gathered(ins, outs, group_size, gloo)
    return _scattered(ins, outs, group_size)


def _reduced(ins: ShapeList, outs: ShapeList, gloo: bool) -> Optional[str]:
    """An all_reduce works in place: its output is its input."""
    if ins == outs:
        return None
    # gloo records a reduce_scatter as an all_reduce (of the whole input, whatever its
    # output), in groups whose size its dumps do not say.
    if gloo and numel(outs) and numel(ins) % numel(outs) == 0:
        return None
    return f"input {_sizes(ins)} but output {_sizes(outs)} (an all_reduce's output is its input)"


def _gathered(ins: ShapeList, outs: ShapeList, group_size: int, gloo: bool) -> Optional[str]:
    if gloo:  # one stacked output of input-shaped slices, however many
        if all(len(out) == len(ins[0]) + 1 and tuple(out[1:]) == tuple(ins[0]) for out in outs) and len(ins) == 1:
            return None
    elif len(outs) != len(ins) and len(outs) != group_size * len(ins):
        return f"{len(outs)} output buffers for {len(ins)} input(s) in a group of {group_size}"
    if numel(outs) != group_size * numel(ins):
        return (f"output {_sizes(outs)} holds {numel(outs)} elements, not the group size {group_size} "
                f"x the input's {numel(ins)}")
    return None


def _scattered(ins: ShapeList, outs: ShapeList, group_size: int) -> Optional[str]:
    if len(ins) != len(outs) and len(ins) != group_size * len(outs):
        return f"{len(ins)} input buffers for {len(outs)} output(s) in a group of {group_size}"
    if numel(ins) != group_size * numel(outs):
        return (f"input {_sizes(ins)} holds {numel(ins)} elements, not the group size {group_size} "
                f"x the output's {numel(outs)}")
    return None


def _sizes(shapes: ShapeList) -> str:
    return str([list(shape) for shape in shapes])


def trusted_size(group: Group) -> Optional[int]:
    """The group's size where the dumps' pg_config lists its members; None where it was
    pieced together from the entries (gloo) or the files found, which may lack a member."""
    return group.size if group.membership_source == "pg_config" else None


class _Found:
    """Contradicting entries of one group: the sequence numbers they are at, and for the
    lowest, its reason and an entry and the ranks that hold one (a corrupt dump may hold
    thousands: an Entry is built for the one shown)."""

    __slots__ = ("seqs", "first", "reason", "where", "ranks")

    def __init__(self) -> None:
        self.seqs: set[int] = set()
        self.first: Optional[int] = None
        self.reason = ""
        self.where: Optional[tuple[EntryTable, int]] = None  # (table, row) of an entry at `first`
        self.ranks: set[int] = set()

    def add(self, seq: int, reason: str, table: Any, row: int, rank: int) -> None:
        self.seqs.add(seq)
        if self.first is None or seq < self.first:
            self.first, self.reason, self.where, self.ranks = seq, reason, (table, row), set()
        if seq == self.first:
            self.ranks.add(rank)


def inconsistent_entries(facts: Facts) -> list[Finding]:
    """The rule: per group, the first collective some rank recorded in a shape its op and
    the group's size rule out (see module docstring)."""
    layout = facts.analysis.layout
    sizes = {group.id: trusted_size(group) for group in layout.groups}
    found: dict[int, _Found] = defaultdict(_Found)
    checked: dict[tuple[int, int, Optional[int]], Optional[str]] = {}  # ids of name, shapes; size -> reason
    for dump in facts.seen:
        table = dump.entries

        def judge(static: StaticRow, rank: int = dump.rank) -> Optional[tuple[int, str]]:
            """(group id, reason) when the static part contradicts its op and group size."""
            name, shapes = static.name, static.shapes
            if name.op not in _ONE_DTYPE_OPS:
                return None
            group_id = layout.group_of(static.pg_name, rank)
            if group_id is None:
                return None
            size = sizes[group_id]
            key = (id(name), id(shapes), size)
            if key not in checked:
                checked[key] = contradiction(name, shapes, size)
            reason = checked[key]
            return None if reason is None else (group_id, reason)

        bad = table.rows_where(judge)
        if not bad:  # as a rule
            continue
        rows = [row for row, _ in bad]
        for (row, (group_id, reason)), seq in zip(bad, table.field_at("collective_seq_id", rows)):
            found[group_id].add(seq, reason, table, row, dump.rank)
    return [_finding(facts, group_id, found[group_id]) for group_id in sorted(found)]


def _finding(facts: Facts, group_id: int, found: _Found) -> Finding:
    view = next(v for v in facts.device.views if v.group.id == group_id)
    assert found.where is not None  # set with `first`, and a group is found when an entry is
    table, row = found.where
    entry, seq, reason, ranks = table[row], found.first, found.reason, sorted(found.ranks)
    more = len(found.seqs) - 1
    message = (f"{entry.op} #{seq} in {group_text(view.group.name, view.group.desc)} contradicts its own op on "
               f"{ranks_text(ranks)}: {reason}; c10d refuses such a call before recording it, so the dumps are "
               f"corrupt or not torch's own" + (f" ({more} more such collective{'s' if more > 1 else ''} in the group)"
                                                if more else ""))
    evidence = {"reason": reason, "profiling_name": entry.name.profiling_name,
                "input_sizes": [list(s) for s in entry.shapes.input_sizes],
                "output_sizes": [list(s) for s in entry.shapes.output_sizes],
                "input_dtypes": list(entry.shapes.input_dtypes), "output_dtypes": list(entry.shapes.output_dtypes),
                "group_size": view.group.size, "collectives": len(found.seqs)}
    return new_finding("inconsistent_entry", "entry_checks.inconsistent_entries", view, op=entry.op,
                       collective_seq_id=seq, p2p_seq_id=None, ranks=tuple(ranks), suspect_ranks=(),
                       message=message, evidence=evidence, age_ns=entry.time_created_ns)
