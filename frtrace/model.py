"""Plain data passed between the pipeline stages.

loader   -> RankDump (one per dump file, entries normalised into `Entry`)
builder  -> Group, Membership (the job's process groups)
matcher  -> MatchResult (entries paired across ranks per group and sequence number)
database -> Database of Group, Membership, Traceback, Collective, NCCLCall rows

Everything here is immutable or slotted so millions of entries stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

from frtrace.util import shortened


class Frame(NamedTuple):
    name: str
    filename: str
    line: int


class OpName(NamedTuple):
    """A parsed `profiling_name` such as `nccl:send 0->1`."""

    profiling_name: str
    backend: str
    op: str
    is_p2p: bool
    # Group-local peers written in P2P names (`send 0->1`, `recv 1<-0`); -1 means `?`.
    local_src: Optional[int] = None
    local_dst: Optional[int] = None
    # `nccl:coalesced`, `ALLGATHER_coalesced`, `REDUCE_SCATTER_coalesced` close a batch;
    # lower-case `*_coalesced` names are real collectives.
    is_coalesced_marker: bool = False


# The op of an entry whose profiling_name could not be read: never compared.
UNREADABLE_OP = OpName("", "", "unknown", False)


def numel(shapes: Iterable[Iterable[int]]) -> int:
    """Elements in a list of tensor shapes (`Shapes.input_sizes` and the like)."""
    total = 0
    for shape in shapes:
        count = 1
        for dim in shape:
            count *= dim
        total += count
    return total


# A list of tensor shapes (one tuple of dimensions per tensor), and their dtypes.
Sizes = tuple[tuple[int, ...], ...]
Dtypes = tuple[str, ...]


class Shapes(NamedTuple):
    input_sizes: Sizes
    input_dtypes: Dtypes
    output_sizes: Sizes
    output_dtypes: Dtypes
    # False when a size or dtype list could not be read: the sizes are then not compared.
    readable: bool = True
    # Elements sent to (received from) each member of the group, in group-local order,
    # for an all_to_all (dump format 2.11): () when the dump does not say.
    input_split_sizes: tuple[int, ...] = ()
    output_split_sizes: tuple[int, ...] = ()
    # The names of the fields above that could not be read (`readable` is False): what
    # the others say is still compared.
    unread: tuple[str, ...] = ()


# The dump fields a Shapes record reads, in its order (each may be unreadable: `unread`).
SHAPE_FIELDS = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")


class Entry(NamedTuple):
    """One Flight Recorder entry, normalised across dump versions and backends.

    Strings, shapes and tracebacks are interned, so equal values share one object.
    """

    index: int  # type: ignore[assignment]  # position in the rank's file, oldest first (shadows tuple.index)
    record_id: int
    pg_name: str
    pg_desc: str
    pg_id: int
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    name: OpName
    shapes: Shapes
    state: str  # scheduled | started | completed (or what the producer wrote)
    retired: Optional[bool]
    time_created_ns: int
    time_started_ns: Optional[int]
    time_completed_ns: Optional[int]
    duration_ms: Optional[float]
    timeout_ms: Optional[int]
    frames: tuple[Frame, ...]  # () when the dump has no stacks

    @property
    def op(self) -> str:
        return self.name.op

    @property
    def is_p2p(self) -> bool:
        return self.name.is_p2p

    @property
    def completed(self) -> bool:
        """Whether this rank finished the op (gloo only ever says so through `retired`)."""
        return has_completed(self.state, self.retired, self.time_completed_ns)

    @property
    def started(self) -> bool:
        return self.state == "started" or bool(self.time_started_ns)


def has_completed(state: str, retired: Optional[bool], time_completed_ns: Optional[int]) -> bool:
    """Entry.completed, from the three fields it reads (the matcher reads them off columns)."""
    return state == "completed" or bool(retired) or bool(time_completed_ns)


def says_more_than_scheduled(state: str, retired: Optional[bool], time_started_ns: Optional[int],
                             time_completed_ns: Optional[int]) -> bool:
    """Whether an op's entry records events of its own: an op inside a coalesced batch
    stays `scheduled` with none (see batches)."""
    return state != "scheduled" or bool(retired) or bool(time_completed_ns) or bool(time_started_ns)


class PgConfig(NamedTuple):
    name: str
    desc: str
    # global ranks, or None when the dump did not say (packed as a range or an array only
    # while it travels from a loader's worker: loader._for_transfer)
    ranks: Optional[tuple[int, ...]]


class PgStatus(NamedTuple):
    last_enqueued: Optional[int]
    last_started: Optional[int]
    last_completed: Optional[int]


# What torch writes as a group's description when the program gave none: it says nothing
# of what the group is for, so groups sharing it are no family.
UNDESCRIBED = frozenset({"", "undefined"})
# What groups of one family share (see family_of).
Family = tuple[object, ...]


class Group(NamedTuple):
    id: int
    name: str
    desc: str
    ranks: tuple[int, ...]  # sorted global ranks
    size: int
    # "pg_config" when the dumps listed the members, "entries" when rebuilt from who
    # carried entries of the group, "world" for the default group sized by the files.
    membership_source: str


def family_of(group: Group) -> Family:
    """Groups of one family run the same program (the TP groups, the DP groups ...): told
    apart by their description and size, or, for groups made without a description, by
    their size and how their ranks are spaced (a mesh's TP groups hold consecutive ranks,
    its DP groups every TP-th rank, its PP groups every TP x DP-th rank)."""
    if group.desc not in UNDESCRIBED:
        return (group.desc, group.size)
    ranks = group.ranks
    return ("", group.size, tuple(b - a for a, b in zip(ranks, ranks[1:])))


class Membership(NamedTuple):
    group_id: int
    global_rank: int
    local_rank: int


class Traceback(NamedTuple):
    id: int
    frames: tuple[Frame, ...]  # innermost first


class Collective(NamedTuple):
    """One operation as the whole group saw it: a collective (by group and
    `collective_seq_id`) or a P2P transfer (by group, ends and order)."""

    id: int
    group_id: int
    kind: str  # "collective" | "p2p"
    collective_seq_id: Optional[int]
    p2p_seq_id: Optional[int]
    op: str  # majority op name
    input_sizes: Sizes
    output_sizes: Sizes
    input_dtypes: Dtypes
    output_dtypes: Dtypes
    expected_ranks: tuple[int, ...]  # members whose window covers this op
    issued_ranks: tuple[int, ...]
    completed_ranks: tuple[int, ...]
    not_issued_ranks: tuple[int, ...]  # members with a dump, inside their window, no entry
    no_dump_ranks: tuple[int, ...]
    out_of_window_ranks: tuple[int, ...]  # their ring buffer no longer reaches back this far
    state: str  # completed | in_flight | partial | mismatch
    problem: Optional[str]  # what went wrong, e.g. "size_mismatch: rank 1 [[17]] vs [[16]]"


class NCCLCall(NamedTuple):
    """One rank's own view of one operation (one entry of its dump)."""

    id: int
    collective_id: int
    group_id: int
    global_rank: int
    record_id: int
    profiling_name: str
    op: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    input_sizes: Sizes
    output_sizes: Sizes
    input_dtypes: Dtypes
    output_dtypes: Dtypes
    state: str
    retired: Optional[bool]
    time_created_ns: int
    time_started_ns: Optional[int]
    time_completed_ns: Optional[int]
    duration_ms: Optional[float]
    timeout_ms: Optional[int]
    traceback_id: Optional[int]


class Database(NamedTuple):
    groups: list[Group]
    memberships: list[Membership]
    tracebacks: list[Traceback]
    collectives: list[Collective]
    ncclcalls: list[NCCLCall]


TABLE_TYPES = {
    "groups": Group,
    "memberships": Membership,
    "tracebacks": Traceback,
    "collectives": Collective,
    "ncclcalls": NCCLCall,
}


@dataclass(slots=True)
class LoadIssue:
    """A file that could not be used, or a note about one that could."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{shortened(self.path)}: {self.problem}"
