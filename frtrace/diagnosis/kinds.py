"""The fault kinds: one row per kind says everything the diagnosis and the reports need.

Takes a kind name; returns its `Kind` row. An unregistered name raises `UnknownKind`,
so a rule cannot produce a kind that some table forgot (and silently turn a fault into
a healthy verdict).
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class UnknownKind(KeyError):
    """A rule produced a kind that is not in `KINDS`."""


class Kind(NamedTuple):
    name: str
    severity: str  # error | warning | info, unless the rule says otherwise
    # One thing to do next, with `{suspects}` for the folded suspect ranks; None for notes.
    next_step: Optional[str]
    # Peers wait on the suspects: the finding may be a consequence of a hang elsewhere.
    blocks_peers: bool
    # Which finding tells one culprit's story best (lower first); None: never a root cause.
    root_priority: Optional[int]
    # The same, among findings that wait on each other in a circle (a deadlock), where an
    # unmatched P2P is the most specific evidence of who broke the symmetry.
    circle_priority: Optional[int]
    # A root finding of this kind with suspects makes the job FAULT (exit 1). A straggler
    # does not: a slow rank is worth a warning, never a failed CI run on its own.
    decides_fault: bool = True


_ROWS = (
    Kind("missing_dump", "error",
         "find out why rank(s) {suspects} wrote no dump (crashed, killed, or stuck before dumping): check their logs and exit codes",
         True, 0, 0),
    Kind("op_mismatch", "error",
         "make every rank call the same collective at this point: look for a rank-dependent branch around the call site",
         False, 1, 1),
    Kind("dtype_mismatch", "error", "cast to one dtype before the collective on every rank", False, 1, 1),
    Kind("size_mismatch", "error",
         "check how the tensor passed by rank(s) {suspects} is sized (uneven batches or padding that depends on the rank)",
         False, 1, 1),
    Kind("extra_op", "error",
         "find the code path that lets rank(s) {suspects} issue one more collective than their peers (a rank-dependent branch or loop count)",
         True, 2, 3),
    Kind("not_issued", "error",
         "look at what rank(s) {suspects} were doing instead ({call_site}their last entries with -j, or py-spy dump on the live process)",
         True, 3, 4),
    Kind("stuck", "error",
         "check the GPUs and network of rank(s) {suspects}: GPU errors (Xid in dmesg), NCCL_DEBUG=INFO, link health",
         False, 4, 4),
    Kind("in_flight", "warning",
         "dump again in a few minutes and compare (frtrace diff OLD NEW): ranks that made no progress in the op are stuck",
         False, 4, 4),
    Kind("p2p_unmatched", "error",
         "check the pipeline schedule: the matching send/recv was never posted by rank(s) {suspects}",
         True, 5, 2),
    Kind("straggler", "warning", "profile rank(s) {suspects}: data loading, host contention or a slow GPU",
         False, None, None, decides_fault=False),
    Kind("no_entries", "info", None, False, None, None),
    # From logs (frtrace.diagnosis.logs):
    Kind("crashed", "error",
         "read how rank(s) {suspects} ended (the exception or signal above): their peers waited for them until the timeout",
         True, 0, 0),
    Kind("missing_log", "error",
         "find the output of rank(s) {suspects} (a log not given, or a process that printed nothing): its last lines, "
         "exit code and dmesg say why it never reached the op",
         True, 0, 0),
    Kind("evidence_conflict", "warning", None, False, None, None, decides_fault=False),
    # The dumps cannot be taken at their word: never a root cause or a fault, but a
    # warning leaves the job inconclusive rather than healthy.
    Kind("inconsistent_entry", "warning",
         "find out what wrote the dumps of rank(s) {suspects}: torch's c10d never records such an entry",
         False, None, None),
    Kind("not_compared", "warning",
         "look at the odd fields of rank(s) {suspects} (-v lists them): what could not be read was not compared",
         False, None, None),
)

KINDS: dict[str, Kind] = {row.name: row for row in _ROWS}


def kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownKind(f"fault kind {name!r} is not registered in frtrace.diagnosis.kinds.KINDS") from None
