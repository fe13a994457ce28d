"""The `-j/--just-print-entries` views: raw entries, as lines to write as they come.

Two layouts, both generators of lines (no newline), so the CLI writes each as it is
produced instead of building one string:

* `side_by_side_lines(MatchResult, ranks, ...)`: one column per rank with a dump (`rank N`)
  and one row per operation, aligned by group and sequence number (P2P rows by channel and
  order), so the same collective sits on one line whatever each rank's buffer position.
  For a few ranks only (`SIDE_BY_SIDE_MAX`): every cell is capped in width and lines.
* `rank_block_lines(rank, RankDump or LoadIssue, ...)`: one rank's entries in its own
  order, newest last, the last `last` of them: what the rank was doing last. Needs that
  one dump only, so a caller can print each rank's block as soon as its file is read.

Every string that comes from a dump (group names, ops, dtypes, stack frames, file
names) goes through `wording.printable`: a hostile dump cannot move the cursor, clear
the screen or forge a line.
"""

from __future__ import annotations

import datetime
from typing import Iterable, Iterator, NamedTuple, Optional, Sequence, Union

from frtrace.match.matcher import MatchResult
from frtrace.model import Entry, Frame, Group, LoadIssue
from frtrace.table.rank_dump import RankDump
from frtrace.wording import group_label, printable, seq_text

# The side-by-side table is for this many ranks at most; more get one block per rank.
SIDE_BY_SIDE_MAX = 8
# Caps that keep every line short whatever the dump holds (characters, lines per cell).
CELL_WIDTH = 48
GROUP_WIDTH = 32
OP_WIDTH = 34
SIZES_WIDTH = 40
DTYPES_WIDTH = 20
FRAME_WIDTH = 160
CELL_LINES = 6
SHAPES_SHOWN = 3
# What a rank block shows by default: its newest entries.
DEFAULT_LAST = 20
GAP = "  "


def clip(text: str, width: int) -> str:
    """`text` made printable and cut to `width` characters (ending in `…` when cut)."""
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- cells


def _shapes_short(sizes: tuple[tuple[int, ...], ...]) -> str:
    shown = ",".join("[" + ",".join(map(str, shape)) + "]" for shape in sizes[:SHAPES_SHOWN])
    more = f",+{len(sizes) - SHAPES_SHOWN}" if len(sizes) > SHAPES_SHOWN else ""
    return "[" + shown + more + "]"


def sizes_text(entry: Entry) -> str:
    """`[[1024]]`, or `[[8,4]]->[[32,4]]` when the output differs; at most three shapes
    each (`[[4],[4],[4],+61]`)."""
    shapes = entry.shapes
    text = _shapes_short(shapes.input_sizes)
    if shapes.output_sizes != shapes.input_sizes:
        text += "->" + _shapes_short(shapes.output_sizes)
    return clip(text, SIZES_WIDTH)


def dtypes_text(entry: Entry) -> str:
    shapes = entry.shapes
    return clip("/".join(sorted(set(shapes.input_dtypes) | set(shapes.output_dtypes))), DTYPES_WIDTH)


def op_label(entry: Entry) -> str:
    """`all_reduce`, `send 0->1`, `recv 1<-0` (group-local peers, `?` for any)."""
    name = entry.name
    if name.is_p2p and name.local_src is not None and name.local_dst is not None:
        src = "?" if name.local_src < 0 else name.local_src
        dst = "?" if name.local_dst < 0 else name.local_dst
        text = f"{name.op} {src}->{dst}" if name.op != "recv" else f"recv {dst}<-{src}"
    else:
        text = name.op
    return clip(text, OP_WIDTH)


def state_text(entry: Entry) -> str:
    """The entry's state as the report words it: `retired` where that is all the dump says
    of its end (gloo retires an op that timed out too), `completed` where it says more."""
    if entry.state == "completed" or entry.time_completed_ns:
        return "completed"
    if entry.retired:
        return "retired"
    return clip(entry.state, 16)


def _group_label(group: Group) -> str:
    return clip(group_label(group.name, group.desc), GROUP_WIDTH)


class StackNumbers:
    """`tbN` per distinct stack, shared by every block and table of one run."""

    def __init__(self) -> None:
        self.ids: dict[tuple[Frame, ...], int] = {}
        self.new: list[tuple[Frame, ...]] = []  # stacks numbered since the last `take_new`

    def number(self, frames: tuple[Frame, ...]) -> int:
        tid = self.ids.get(frames)
        if tid is None:
            tid = self.ids[frames] = len(self.ids)
            self.new.append(frames)
        return tid

    def take_new(self) -> list[tuple[Frame, ...]]:
        new, self.new = self.new, []
        return new


def _stack_lines(stacks: StackNumbers, frames_list: list[tuple[Frame, ...]]) -> Iterator[str]:
    for frames in frames_list:
        yield f"tb{stacks.ids[frames]}:"
        for frame in frames:
            yield clip(f"    {frame.name} at {frame.filename}:{frame.line}", FRAME_WIDTH)


def _cell(entry: Entry, stacks: Optional[StackNumbers]) -> str:
    """`op sizes dtypes state`: the op and sizes cut to fit `CELL_WIDTH`, never the state."""
    dtypes = dtypes_text(entry)
    tail = (f" {dtypes}" if dtypes else "") + f" {state_text(entry)}"
    text = clip(f"{op_label(entry)} {sizes_text(entry)}", max(12, CELL_WIDTH - len(tail))) + tail
    if stacks is not None and entry.frames:
        text += f" tb{stacks.number(entry.frames)}"
    return text


def _cell_of_batch(entries: tuple[Entry, ...], stacks: Optional[StackNumbers]) -> str:
    lines = [_cell(e, stacks) for e in entries[:CELL_LINES]]
    if len(entries) > CELL_LINES:
        lines[-1] = f"... {len(entries) - CELL_LINES + 1} more"
    return "\n".join(lines)


# --------------------------------------------------------------------------- side by side


def _wanted_groups(result: MatchResult, pg_filters: Iterable[str]) -> set[int]:
    filters = list(pg_filters)
    if not filters:
        return {view.group.id for view in result.views}
    return {view.group.id for view in result.views if view.group.name in filters or view.group.desc in filters}


def _rows(result: MatchResult, columns: list[int], wanted: set[int],
          stacks: Optional[StackNumbers]) -> Iterator[list[str]]:
    groups = {view.group.id: view.group for view in result.views}
    for match in result.collectives:
        if match.group_id not in wanted:
            continue
        cells = []
        for rank in columns:
            entries = match.calls.get(rank)
            if entries:
                cells.append(_cell_of_batch(entries, stacks))
            elif rank in match.no_dump:
                cells.append("(no dump)")
            elif rank in match.out_of_window:
                cells.append("(before window)")
            elif rank in match.not_issued:
                cells.append("-- not issued --")
            else:
                cells.append("")
        if any(cells):
            yield [_group_label(groups[match.group_id]), f"#{match.seq}"] + cells
    for p2p in result.p2p:
        if p2p.group_id not in wanted:
            continue
        by_rank = {p2p.src: p2p.send, p2p.dst: p2p.recv}
        cells = []
        for rank in columns:
            if rank in by_rank:
                entry = by_rank[rank]
                cells.append(_cell(entry, stacks) if entry else "-- unmatched --")
            else:
                cells.append("")
        if any(cells):
            label = f"p2p {p2p.src if p2p.src >= 0 else '?'}->{p2p.dst} #{p2p.ordinal + 1}"
            yield [_group_label(groups[p2p.group_id]), label] + cells


def _table_lines(headers: list[str], rows: list[list[str]]) -> Iterator[str]:
    """A plain table (tabulate's `simple` look), one physical line at a time."""
    split = [[cell.split("\n") for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in split:
        for i, lines in enumerate(row):
            widths[i] = max(widths[i], max(map(len, lines)))
    yield GAP.join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()
    yield GAP.join("-" * w for w in widths)
    for row in split:
        for n in range(max(map(len, row))):
            yield GAP.join((lines[n] if n < len(lines) else "").ljust(w) for lines, w in zip(row, widths)).rstrip()


# Two numberings meet in a P2P row: say which is which.
P2P_LEGEND = ("P2P rows: the seq column names global ranks (p2p SRC->DST #k: the channel's k-th op);",
              "op names keep torch's group-local ranks (recv 1<-0: group rank 1 from group rank 0).")


def side_by_side_lines(result: MatchResult, ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = (),
                       with_stacks: bool = False) -> Iterator[str]:
    """Lines of the table of every operation (rows) by rank (columns): a column per rank
    with a dump (of `ranks`, when given). Never one per rank the dumps only claim: two
    dumps of a 128-rank job are two columns, and a claimed world of a million costs nothing."""
    found = set(result.layout.ranks_found)
    columns = sorted(found if ranks is None else found.intersection(ranks))
    stacks = StackNumbers() if with_stacks else None
    rows = list(_rows(result, columns, _wanted_groups(result, pg_filters), stacks))
    if not rows:
        yield "No entries match the selected ranks and groups."
        return
    yield from _table_lines(["group", "seq"] + [f"rank {r}" for r in columns], rows)
    if any(row[1].startswith("p2p ") for row in rows):
        yield ""
        yield from P2P_LEGEND
    if stacks is not None and stacks.ids:
        yield ""
        yield "Stack traces (innermost first):"
        yield from _stack_lines(stacks, stacks.take_new())


def render_raw_entries(result: MatchResult, ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = (),
                       with_stacks: bool = False) -> str:
    """The side-by-side table as one string (for a few ranks; the CLI streams instead)."""
    return "\n".join(side_by_side_lines(result, ranks, pg_filters, with_stacks))


# --------------------------------------------------------------------------- per rank


def relative_time(ns: Optional[int], newest_ns: Optional[int]) -> str:
    """`-2m03.456s`: how long before the rank's newest entry this one was created."""
    if not ns or not newest_ns:
        return "?"
    seconds = (ns - newest_ns) / 1e9
    sign = "-" if seconds < 0 else ("+" if seconds > 0 else "")
    seconds = abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds:.3f}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{sign}{int(minutes)}m{seconds:06.3f}s"
    hours, minutes = divmod(int(minutes), 60)
    if hours < 10_000:
        return f"{sign}{hours}h{minutes:02d}m{int(seconds):02d}s"
    return f"{sign}{hours / 24 / 365.25:.0f}y"


def wall_clock(ns: Optional[int]) -> str:
    """`2025-06-01 12:00:03.120 UTC`, or `?` for a time no clock could show."""
    if ns is None:
        return "?"
    try:
        moment = datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _in_groups(entry: Entry, filters: frozenset[str]) -> bool:
    return entry.pg_name in filters or entry.pg_desc in filters


def rank_block_lines(rank: int, dump: Union[RankDump, LoadIssue], pg_filters: Iterable[str] = (),
                     last: Optional[int] = DEFAULT_LAST,
                     stacks: Optional[StackNumbers] = None) -> Iterator[str]:
    """One rank's block: a header line, then its entries oldest to newest, at most `last`
    of them (None or 0: all), with a line saying how many older ones were left out.

    `dump` is the rank's `RankDump`, or the `LoadIssue` that says why it could not be
    read. `stacks` numbers the stacks of the entries shown; those not shown before
    follow the block."""
    if isinstance(dump, LoadIssue):
        yield f"rank {rank}: {printable(dump.path)} could not be read: {clip(dump.problem, 200)}"
        return
    filters = frozenset(pg_filters)
    entries: Sequence[Entry] = dump.entries
    total = len(entries)
    newest_ns = entries[-1].time_created_ns if entries else None
    if entries and not newest_ns:  # an op still in flight in a CUPTI monitor's dump has no time yet
        newest_ns = next((e.time_created_ns for e in reversed(entries) if e.time_created_ns), None)
    where = f"{printable(dump.path)} ({dump.encoding}, version {clip(dump.version, 16)})"
    if not entries:
        why = "" if dump.has_entries else " (dumped without collectives)"
        yield f"rank {rank}: no entries in {where}{why}"
        return
    if filters:
        entries = tuple(e for e in entries if _in_groups(e, filters))
    selected = f", {len(entries):,} in the selected groups" if filters else ""
    count = f"{total:,} {'entry' if total == 1 else 'entries'}"
    newest = wall_clock(newest_ns) if dump.clock == "wall" else f"at {newest_ns or 0:,} ns on CUPTI's own clock"
    yield f"rank {rank}: {count}{selected} in {where}; newest created {newest}"
    if not entries:
        return
    shown = entries[-last:] if last else entries
    if len(shown) < len(entries):
        left = len(entries) - len(shown)
        yield f"  ... {left:,} older {'entry' if left == 1 else 'entries'} not shown (--last N shows more, --last 0 all)"
    # A P2P op names its peers by rank in the group, as torch writes it: the header says so.
    op_header = "op (group ranks)" if any(entry.name.is_p2p and not entry.name.is_coalesced_marker for entry in shown) else "op"
    headers = ["record_id", "time", "group", "seq", op_header, "sizes", "dtypes", "state"]
    if stacks is not None:
        headers.append("stack")
    rows = []
    for entry in shown:
        row = [str(entry.record_id), relative_time(entry.time_created_ns, newest_ns),
               clip(group_label(entry.pg_name, entry.pg_desc), GROUP_WIDTH), seq_text(entry), op_label(entry),
               sizes_text(entry), dtypes_text(entry), state_text(entry)]
        if stacks is not None:
            row.append(f"tb{stacks.number(entry.frames)}" if entry.frames else "")
        rows.append(row)
    for line in _table_lines(headers, rows):
        yield "  " + line
    if stacks is not None:
        new = stacks.take_new()
        if new:
            yield "  stack traces (innermost first):"
            for line in _stack_lines(stacks, new):
                yield "  " + line


class RenderedBlock(NamedTuple):
    """A rank block as text (see `render_block`), with what the caller notes about it."""

    text: str
    has_frames: bool
    issue: Optional[LoadIssue]


def render_block(rank: int, dump: Union[RankDump, LoadIssue], pg_filters: tuple[str, ...] = (),
                 last: Optional[int] = DEFAULT_LAST) -> RenderedBlock:
    """`rank_block_lines` as one text (each line ended, then a blank line): picklable
    with `functools.partial`, so loader worker processes can render the blocks and send
    only their text (stack numbers need one numbering for the run: not with stacks)."""
    text = "".join(line + "\n" for line in rank_block_lines(rank, dump, pg_filters, last)) + "\n"
    if isinstance(dump, LoadIssue):
        return RenderedBlock(text, False, dump)
    return RenderedBlock(text, dump.has_frames, None)
