"""Synthetic NCCL-shaped Flight Recorder dumps, for tests and benchmarks.

A dev tool, not part of the analyzer: nothing else in the package imports it. Standard
library only. Usage:

    job = generate(world_size=16, tp=2, pp=2, steps=3, fault=Fault("hang", rank=5, group="tp"))
    write_job(job, "out/hang")        # one pickle per rank, named nccl_trace_rank_<rank>
    job.truth["suspect_ranks"]        # [5]

    python -m frtrace.testing.synth out/hang --world-size 64 --tp 4 --pp 2 --fault hang --fault-rank 5

How a job is made:

1. **Layout.** world = dp x pp x tp, tp innermost (rank = dp_idx*pp*tp + pp_idx*tp + tp_idx).
   Groups are created in one global order that every rank agrees on: the default group "0",
   then the TP groups, the PP groups and the DP groups, named "1", "2", ... Each rank's
   `pg_id` counts only the groups it belongs to (default 0, tp 1, pp 2, dp 3).
2. **Programs.** Every rank gets the list of operations it would issue: a prologue, then
   `steps` training steps (forward TP collectives, pipeline send/recv of activations, an
   uneven MoE all_to_all on even steps, backward, a PP grad-norm all_reduce, a coalesced DP
   gradient batch plus a parameter all_gather, and a default-group loss all_reduce).
3. **Fault injection** edits the programs (a rank stops early, skips, adds or changes one
   operation, omits a send) or marks one collective as never finishing.
4. **Simulation.** Operations match across ranks the way NCCL matches them: the k-th
   collective of a group on every member, the n-th send a->b with the n-th recv at b from a.
   A rank's operations complete in program order; an operation completes once every
   participant has it as its next operation and they all agree on op, shapes and dtypes.
   The first operation a rank cannot complete is where it blocks; it may have enqueued
   `lookahead` more. Hangs therefore cascade across groups as they do in a real job.
5. **Dumps** are built per rank from the simulation (lazily: see `RankDumps`) in the exact
   shape `torch._C._distributed_c10d._dump_nccl_trace()` pickles, ring buffer included.

What the entries look like (NCCL, dump version 2.10):

* `profiling_name` is `nccl:<op>`: `all_reduce`, `_all_gather_base` (all_gather_into_tensor:
  output = input with dim 0 x group size), `all_gather` (list form: one output per rank),
  `_reduce_scatter_base` (the reverse), `broadcast`, `all_reduce_barrier`, `all_to_all_single`
  (uneven: sizes legitimately differ per rank), and coalesced batches.
* A coalesced batch (DP gradients) is one entry per tensor (`reduce_scatter_tensor_coalesced`
  or `all_reduce`) followed by a `nccl:coalesced` marker with empty sizes. All share one
  `collective_seq_id`; `op_id` goes +1 per member, and the marker repeats the last member's.
* P2P: `nccl:send 0->1` / `nccl:recv 1<-0` in the PP group, with group-local ranks; `is_p2p`
  True; `p2p_seq_id` +1 per send or recv of the rank in that group (so it is not aligned across
  ranks when pp > 2); `collective_seq_id` keeps the group's current value.
* `state`: completed ops "completed" (retired); the op a rank is blocked in "started" with
  timing on, else "scheduled"; the `lookahead` ops enqueued behind it "scheduled".
  `time_discovered_*` and `duration_ms` only with timing on (duration_ms on completed ops).
* `pg_status` counts collectives only (P2P ops do not move it), -1 meaning none; it covers
  everything the rank did, including what fell off the ring buffer.

Faults (`Fault.rank` is the culprit, `group` which of its groups, `step` 0-based). A "plain"
collective is one that is neither a coalesced batch nor an all_to_all. `truth` names the root
cause; `truth["fault_kind"]` uses the DESIGN.md section 3 vocabulary.

* `hang`: the culprit stops issuing anything just before its first plain collective of the
  group in that step (stuck in host code). not_issued; its peers wait in collective #k.
  With several culprits (`Fault.ranks`, as NVRx's LOCK_GIL stops two hosts at once), each
  stops so at that collective of its own group of the family; suspects are the culprits
  (one that waits behind another before it gets there shows as a victim). With
  `Fault.at_once` the others stop at the moment the first (`Fault.rank`) reaches its
  collective instead, wherever each then is (NVRx starts both faults after one delay).
* `missing_dump_hang`: the same, and the culprit's dump is absent. missing_dump.
* `skip_op`: the culprit skips the step's *last* plain collective of the group and carries on,
  to block later in another group. not_issued. (The last one, so that the culprit's next
  collective of the group lies beyond a collective its stalled peers never finish.)
* `stuck`: every member issues the first plain collective of the group in that step and it
  never completes. stuck; suspects are all the members.
* `extra_op`: the culprit issues an extra `all_reduce [[1]]` in the group just before the step's
  loss all_reduce, which its peers then wait in. For the default group it comes after the
  culprit's last step instead (any earlier, everyone's next default collective would pair
  with it). extra_op; collective_seq_id is the extra one's.
* `size_mismatch` / `dtype_mismatch` / `op_mismatch`: the culprit's first plain collective of
  the group in that step has dim 0 + 1 / Float <-> BFloat16 / `broadcast` instead. Everyone is
  in it, nobody completes. `truth["op"]` is what the peers issued; `truth["tie"]` is True when
  the group has two members (consensus cannot single out the culprit).
* `p2p_unmatched` (group "pp"): the culprit never posts its first send of the step and carries
  on; the receiver blocks in its recv. Suspect the culprit; `truth["p2p_peer"]` is the
  receiver and `p2p_seq_id` the p2p_seq_id of the recv it waits in (`op` is "send").
* `missing_dump`: a healthy job without the culprit's dump. Status inconclusive, no suspect.
* `straggler`: a healthy job in which the culprit issues every op `straggler_ms` later than it
  could (with `straggler_share` below 1, only that share of its ops, now and then).
  `truth["lateness_ms"]` is that delay; observed against the other participants of each
  collective it is the last to arrive, by about that much (more in DP collectives, as its delay
  piles up over the step before it meets those peers again).

* `gpu_error` (`Fault.ranks` may name several culprits): from the step on, a culprit's GPU work
  stops completing on its side (its entries stay scheduled, the first started with timing)
  though its kernels ran, so its peers complete them; its host enqueues a few more ops (the
  j-th culprit 4 + 3j), then blocks, and its peers wait in the next op that needs it. stuck;
  suspects are the culprits. With `Fault.at_once` every culprit's GPU stops at one moment
  in the step (when the first issues the middle op of its step), each from its first op not
  finished by then.
* `in_flight` (not a fault): the job is dumped while every group of the culprit's family
  (`Fault.group`: all the dp groups, say) is in the step's first plain collective of the
  group, every member in it, none done. Like `stuck`, judged by age (below). `Fault.dumped_late`:
  ranks whose dumps were taken a moment later, once the op had ended: every op they had issued
  finished (still no fault, no suspect).
* `skip_ring_step` (group "cp", with `ring=True`): the culprit leaves out one ring step of the
  step's first forward attention layer (`Fault.ring_step`, -1 the last), its send and its recv,
  and goes on. NCCL pairs a channel's ops in order, so its later ring ops pair with its
  neighbours' earlier ones until two move different tensors; the ring hangs there, the culprit
  one ring step short of its neighbours. not_issued; suspect the culprit.
* `Fault.last_op`: `hang` and the mismatches hit the step's last plain collective of the group
  (in the backward pass) instead of its first.

`stuck` and `in_flight` are judged by age, as the dumps allow: the truth is a hang (stuck,
suspects every member of the groups in it) only when some member's dump shows a time (an op
created, or seen started or completed, on its own clock) at least `timeout_ms` after it
created the op; else a job dumped mid-op looks the same, and the truth is inconclusive
(`fault_kind` "in_flight", no suspect). `truth["age_ms_at_least"]` is that age.

Faithful options (keyword arguments of `generate`; each defaults to the historical behaviour
above, which is not what PyTorch records):

* `p2p="batched"`: every pipeline op is a `batch_isend_irecv` (a stage's forward send and
  backward recv share one): one entry per send/recv, all with the batch's p2p_seq_id (+1 per
  batch), the group's current collective_seq_id, op_id +1 per op, is_p2p True, `scheduled`
  forever with no discovered times, duration or retired flag (torch records them without
  events); then the `nccl:coalesced` marker, is_p2p False, same seqs, the only state that
  advances. A plain op never pairs with a batched one (its own communicator). `"mixed"`:
  even steps plain, odd steps batched.
* `coalesced_events="marker"`: coalesced collective batches record their ops the same way.
* `watchdog_ms=100`: time_discovered_* are watchdog polls: the first tick after the event on a
  per-rank grid of that period with a random per-rank phase. A completed op always has its
  discovered-completed time; only the started time and duration_ms need timing.
* `bubble_ms=100`: a stage computes that long before each send, so a receiver's recv is
  created about that much before its matching send (pipeline bubbles).
* `pg_status="work"`: pg_status holds the seq of the group's last Work: the p2p seq after P2P
  work (plain or batch), the collective seq after a collective.
* `only_active=True`: the dump drops every entry with a discovered-completed time (completed
  ones); per-op entries of batches never get one and stay. pg_status is kept.
* `timeout_ms`: the process groups' timeout written in every entry (default NCCL's 10 min).

Job shapes (keyword arguments of `generate`):

* `ring=True`: context-parallel ring attention instead of a pipeline: the `pp` dimension is a
  ring (groups described "cp"); per layer, forward then backward, cp - 1 ring steps in which
  each rank sends to the next rank of the ring and receives from the previous one (plain: even
  positions send first; batched: one batch_isend_irecv per ring step); the backward ring moves
  tensors twice the forward's.
* `vchunks=V`: an interleaved pipeline (virtual pipeline parallelism), V model chunks per
  stage, the last stage handing chunk c to the first stage's chunk c + 1. Batched: Megatron's
  interleaved 1F1B schedule (warmup, steady state, cooldown; every exchange one batch of up
  to four ops, to the previous stage first); plain: one micro batch at a time.
* `pg_order="rotated"`: each rank creates its groups (after the default one, always pg_id 0)
  in an order of its own, tp, pp, dp rotated by the rank: its pg_id for a group is not its
  peers'. `hashed_names=True`: groups other than the default are named by a hash of their
  ranks, as torch does when asked to. `pg_order="unnamed"`: the order is the same on every
  rank, but each rank also makes groups no dump names (two after the default group, and on
  an odd pipeline stage one more after its TP group), which take pg_ids and never run an op:
  ids with no row and no entry, as in the real NVRx dumps.

Another writer: `cupti_monitor_job(job)` rewrites a job (generated with a buffer holding the
whole history) as PyTorch's CUPTI comms monitor dumps it, and `write_cupti_job` writes it
(`--writer cupti` on the command line; see those functions for what changes).

With `lookahead` = 0 every fault shows its textbook pattern (e.g. for hang, the culprit has no
entry with seq k in the group while its peers wait in k). With lookahead > 0 the ops enqueued
behind a blocked op are visible too, so a stalled peer may show a later, scheduled entry with
the same seq (skip_op, extra_op): still the truth, but harder to read.
"""

from __future__ import annotations

import argparse
import hashlib
import gzip
import json
import os
import pickle
import random
import sys
import time
import traceback
from array import array
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from frtrace.util import cyclic_gc_paused

# `slots=True` needs Python 3.10; the package still supports 3.9.
_SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}

FAULT_KINDS = (
    "hang", "stuck", "extra_op", "skip_op", "size_mismatch", "op_mismatch", "dtype_mismatch",
    "missing_dump", "missing_dump_hang", "p2p_unmatched", "straggler", "gpu_error", "in_flight",
    "skip_ring_step",
)
GROUP_KINDS = ("tp", "pp", "cp", "dp", "default")
SEVERAL_CULPRITS = ("gpu_error", "hang")  # fault kinds that take several culprit ranks (`Fault.ranks`)
# Fault kind -> the DESIGN.md section 3 finding kind an analyzer should report.
_DIAGNOSIS = {
    "hang": "not_issued", "skip_op": "not_issued", "stuck": "stuck", "extra_op": "extra_op",
    "size_mismatch": "size_mismatch", "op_mismatch": "op_mismatch",
    "dtype_mismatch": "dtype_mismatch", "missing_dump": "missing_dump",
    "missing_dump_hang": "missing_dump", "p2p_unmatched": "p2p_unmatched", "straggler": "straggler",
    "gpu_error": "stuck", "in_flight": "in_flight", "skip_ring_step": "not_issued",
}
P2P_MODES = ("plain", "batched", "mixed")
COALESCED_EVENTS = ("batch", "marker")
PG_STATUS_MODES = ("collectives", "work")
PG_ORDERS = ("same", "rotated", "unnamed")

BACKEND = "nccl"
COMM_LIB_VERSION = "2.27.5"
TIMEOUT_MS = 600_000  # NCCL's default process-group timeout (10 min)
THREAD_NAME = "pt_main_thread"
EPOCH_NS = 1_761_000_000 * 10**9  # wall clock of the first operation (October 2025)

_TORCH = "/opt/conda/lib/python3.11/site-packages/torch/distributed/"
_C10D = _TORCH + "distributed_c10d.py"
_LOGGER = _TORCH + "c10d_logger.py"
_JOB = "/workspace/job/"

# Operation kinds in the simulation.
_COLL, _SEND, _RECV, _BATCH = 0, 1, 2, 3  # _BATCH: a batch_isend_irecv of several sends/recvs
_MS = 1_000_000


@dataclass(**_SLOTS)
class Fault:
    """What goes wrong, and where: the culprit rank, which of its groups, which step (0-based)."""

    kind: str
    rank: int = 1
    group: str = "tp"
    step: int = 1
    straggler_ms: float = 50.0
    straggler_share: float = 1.0  # straggler: the share of its ops it is late at (spread evenly)
    ranks: tuple = ()  # several culprits (SEVERAL_CULPRITS only); empty: just `rank`
    ring_step: int = -1  # skip_ring_step: which of the first layer's forward ring steps (-1: the last)
    last_op: bool = False  # hang, mismatches: at the step's last plain collective of the group (backward)
    # in_flight: ranks dumped a moment later than the rest, once the op had ended: every op
    # they had issued finished (each rank dumps at its own moment).
    dumped_late: tuple = ()
    # Several culprits (hang, gpu_error): the first stops at its target and the others at that
    # same moment, wherever each is in its own program (NVRx starts both faults after one delay),
    # rather than each at the same place of its own program.
    at_once: bool = False

    def culprits(self) -> tuple:
        return tuple(sorted(set(self.ranks))) if self.ranks else (self.rank,)


@dataclass(**_SLOTS)
class SynthJob:
    # rank -> dump dict. A `RankDumps` (dict-like, built lazily) from `generate`; any mapping works.
    dumps: MutableMapping
    truth: dict


# --------------------------------------------------------------------------- building blocks


@dataclass(**_SLOTS)
class _Group:
    idx: int
    name: str
    desc: str
    ranks: tuple  # sorted global ranks; group-local rank = position
    ranks_str: str  # pg_config writes ranks as a string: "[0, 1, 2, 3]"
    pg_tuple: tuple  # (name, desc): shared by every entry of the group

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass(**_SLOTS)
class _Part:
    """The payload of one FR entry. Shared by every entry that looks the same (cheap dumps)."""

    profiling_name: str
    input_sizes: list
    input_dtypes: list
    output_sizes: list
    output_dtypes: list
    frames: list
    marker: bool = False  # `nccl:coalesced` closes a batch and does not bump op_id


@dataclass(**_SLOTS)
class _Op:
    """One unit of the simulation: a collective, a coalesced batch, or one send/recv."""

    kind: int  # _COLL | _SEND | _RECV
    group: _Group
    name: str  # op as in profiling_name ("all_reduce", "send", ...)
    tag: str  # role in the training step; used to place faults and pick stacks
    parts: tuple  # the entries it records: one, or a batch's members then the marker
    sig: tuple  # what all participants must agree on for it to complete
    peer: int = -1  # global rank at the other end of a send/recv
    gap_ns: int = 0  # compute between the previous op and this one
    dur_ns: int = 0  # time on the wire once everybody is there
    # A _BATCH's sends and recvs, in order: (kind, peer, tag, shape tuple, dtype) each.
    subs: tuple = ()
    # Copies kept flat for the simulation's inner loop.
    gidx: int = field(init=False)  # group.idx
    need: int = field(init=False)  # participants: the group's size, or 2 for a send/recv

    def __post_init__(self) -> None:
        self.gidx = self.group.idx
        self.need = len(self.group.ranks) if self.kind == _COLL else 2

    @property
    def plain(self) -> bool:
        # A collective whose shapes must agree and that is not a batch: where faults land.
        return self.kind == _COLL and len(self.parts) == 1 and self.sig[0] is not None


def _frame(name: str, filename: str, line: int) -> dict:
    return {"name": name, "filename": filename, "line": line}


# torch API function -> (line in distributed_c10d.py). Made-up but plausible line numbers.
_API_LINES = {
    "all_reduce": 2806, "broadcast": 2714, "all_gather": 3470, "all_gather_into_tensor": 3624,
    "reduce_scatter_tensor": 4140, "all_to_all_single": 4431, "barrier": 4695, "send": 2293,
    "recv": 2340, "_coalescing_manager": 2563,
    "batch_isend_irecv": 2618,
}
# Step role -> (torch API called, user frames innermost first below the API).
_USER_STACKS = {
    "bcast_config": ("broadcast", [("broadcast_config", _JOB + "setup.py", 57), ("setup", _JOB + "setup.py", 90)]),
    "barrier": ("barrier", [("setup", _JOB + "setup.py", 98)]),
    "param_sync": ("broadcast", [("sync_params", _JOB + "parallel/ddp.py", 64), ("setup", _JOB + "setup.py", 104)]),
    "fwd_attn": ("all_reduce", [("reduce_from_tp_region", _JOB + "parallel/tensor_parallel.py", 88),
                                ("forward", _JOB + "model.py", 212), ("forward_step", _JOB + "train.py", 210)]),
    "fwd_sp_gather": ("all_gather_into_tensor", [("gather_sequence", _JOB + "parallel/tensor_parallel.py", 131),
                                                 ("forward", _JOB + "model.py", 251), ("forward_step", _JOB + "train.py", 210)]),
    "fwd_sp_scatter": ("reduce_scatter_tensor", [("scatter_sequence", _JOB + "parallel/tensor_parallel.py", 152),
                                                 ("forward", _JOB + "model.py", 268), ("forward_step", _JOB + "train.py", 210)]),
    "moe_a2a": ("all_to_all_single", [("dispatch_tokens", _JOB + "moe.py", 77),
                                      ("forward", _JOB + "moe.py", 140), ("forward_step", _JOB + "train.py", 212)]),
    "bwd_gather": ("all_gather", [("gather_from_tp_region", _JOB + "parallel/tensor_parallel.py", 109),
                                  ("backward", _JOB + "model.py", 330), ("backward_step", _JOB + "train.py", 240)]),
    "bwd_attn": ("all_reduce", [("reduce_from_tp_region", _JOB + "parallel/tensor_parallel.py", 88),
                                ("backward", _JOB + "model.py", 344), ("backward_step", _JOB + "train.py", 240)]),
    "send_fwd": ("send", [("send_forward", _JOB + "match/analysis.py", 41), ("forward_step", _JOB + "train.py", 218)]),
    "recv_fwd": ("recv", [("recv_forward", _JOB + "match/analysis.py", 29), ("forward_step", _JOB + "train.py", 205)]),
    "send_bwd": ("send", [("send_backward", _JOB + "match/analysis.py", 63), ("backward_step", _JOB + "train.py", 247)]),
    "recv_bwd": ("recv", [("recv_backward", _JOB + "match/analysis.py", 52), ("backward_step", _JOB + "train.py", 236)]),
    "ring_send_fwd": ("send", [("ring_exchange", _JOB + "context_parallel.py", 73),
                               ("attention_forward", _JOB + "context_parallel.py", 118)]),
    "ring_recv_fwd": ("recv", [("ring_exchange", _JOB + "context_parallel.py", 76),
                               ("attention_forward", _JOB + "context_parallel.py", 118)]),
    "ring_send_bwd": ("send", [("ring_exchange", _JOB + "context_parallel.py", 73),
                               ("attention_backward", _JOB + "context_parallel.py", 161)]),
    "ring_recv_bwd": ("recv", [("ring_exchange", _JOB + "context_parallel.py", 76),
                               ("attention_backward", _JOB + "context_parallel.py", 161)]),
    "pp_norm": ("all_reduce", [("clip_grad_norm", _JOB + "optimizer.py", 97), ("step", _JOB + "optimizer.py", 160)]),
    "dp_grads_rs": ("reduce_scatter_tensor", [("reduce_scatter_grads", _JOB + "optimizer.py", 133),
                                              ("step", _JOB + "optimizer.py", 155)]),
    "dp_grads_ar": ("all_reduce", [("allreduce_grads", _JOB + "parallel/ddp.py", 118),
                                   ("step", _JOB + "optimizer.py", 152)]),
    "dp_grads_end": ("_coalescing_manager", [("__exit__", "/opt/conda/lib/python3.11/contextlib.py", 144),
                                             ("reduce_grads", _JOB + "optimizer.py", 136),
                                             ("step", _JOB + "optimizer.py", 155)]),
    "dp_params": ("all_gather_into_tensor", [("all_gather_params", _JOB + "optimizer.py", 171),
                                             ("step", _JOB + "optimizer.py", 163)]),
    "loss": ("all_reduce", [("average_loss", _JOB + "train.py", 288)]),
    "extra": ("all_reduce", [("log_debug_metric", _JOB + "metrics.py", 23), ("train_step", _JOB + "train.py", 309)]),
}
_OUTER_FRAMES = [("train_step", _JOB + "train.py", 301), ("train", _JOB + "train.py", 388),
                 ("main", _JOB + "train.py", 452), ("<module>", _JOB + "train.py", 470)]
_SETUP_OUTER = [("main", _JOB + "train.py", 447), ("<module>", _JOB + "train.py", 470)]


# profiling_name op -> the torch API that records it (for the stack of a changed op).
_API_OF_OP = {"all_reduce": "all_reduce", "broadcast": "broadcast", "all_gather": "all_gather",
              "_all_gather_base": "all_gather_into_tensor", "_reduce_scatter_base": "reduce_scatter_tensor"}


def _stack(tag: str, api: Optional[str] = None) -> list:
    """Frames innermost first: the torch API, its logging wrapper, then the user's code."""
    default_api, user = _USER_STACKS[tag]
    api = api or default_api
    outer = _SETUP_OUTER if tag in ("bcast_config", "barrier", "param_sync") else _OUTER_FRAMES
    frames = [_frame(api, _C10D, _API_LINES[api])]
    if api != "_coalescing_manager":  # the context manager's exit is not wrapped by the logger
        frames.append(_frame("wrapper", _LOGGER, 81))
    frames += [_frame(*f) for f in user]
    # The step-level helpers already name train_step's caller chain through forward_step etc.
    frames += [_frame(*f) for f in outer if not any(f[0] == u[0] for u in user)]
    return frames


def _shapes(name: str, shape: list, n: int) -> tuple:
    """(input_sizes, output_sizes) of a collective over n ranks whose per-rank tensor is `shape`."""
    if name in ("_all_gather_base",):  # all_gather_into_tensor: output stacks n inputs
        return [shape], [[shape[0] * n] + shape[1:]]
    if name in ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):  # the reverse
        return [[shape[0] * n] + shape[1:]], [shape]
    if name == "all_gather":  # list form: n separate outputs
        return [shape], [shape] * n
    return [shape], [shape]


def _moe_tokens(members: tuple, rank: int, sums: tuple[int, int]) -> tuple[int, int]:
    """(tokens `rank` sends, tokens it receives) in an uneven MoE all_to_all of `members`
    (whose `_moe_sums` are `sums`): rank i sends rank j `base + lean(i) + pull(j)` tokens,
    so each rank's totals differ but what the group sends adds up to what it receives, as
    in a real exchange."""
    size = len(members)
    step = max(1, 128 // size)
    leans, pulls = sums
    # Never below 8: lean and pull each go down to -4, and no pair sends fewer than 0
    # tokens (a DP group of more than 512 ranks had pairs at -4: a negative dimension).
    base = max(8, 4096 // size)
    return size * (base + _lean(rank) * step) + pulls * step, size * (base + _pull(rank) * step) + leans * step


def _lean(rank: int) -> int:
    return (rank * 37) % 9 - 4


def _pull(rank: int) -> int:
    return (rank * 53 + 3) % 9 - 4


def _moe_sums(members: tuple) -> tuple[int, int]:
    """(sum of _lean, sum of _pull) over a group's members."""
    return sum(map(_lean, members)), sum(map(_pull, members))


# --------------------------------------------------------------------------- the world


class _World:
    """Layout, groups and the (shared) operation objects every rank's program is made of."""

    def __init__(self, world_size: int, tp: int, pp: int, with_frames: bool, *, p2p: str = "plain",
                 bubble_ms: float = 0.0, hashed_names: bool = False, ring: bool = False, vchunks: int = 1):
        if tp < 1 or pp < 1 or world_size < 1 or world_size % (tp * pp):
            raise ValueError(f"world_size {world_size} is not a multiple of tp*pp = {tp}*{pp}")
        self.world, self.tp, self.pp = world_size, tp, pp
        self.dp = world_size // (tp * pp)
        self.with_frames = with_frames
        if p2p not in P2P_MODES:
            raise ValueError(f"unknown p2p mode {p2p!r}; expected one of {P2P_MODES}")
        if bubble_ms < 0:
            raise ValueError("bubble_ms must not be negative")
        self.p2p_mode, self.bubble_ms = p2p, bubble_ms
        self.hashed_names = hashed_names
        if ring and vchunks > 1:
            raise ValueError("a context-parallel ring (ring=True) has no virtual pipeline chunks")
        if vchunks < 1:
            raise ValueError("vchunks must be at least 1")
        # ring: the second dimension is a context-parallel ring, not pipeline stages.
        self.ring, self.vchunks = ring, vchunks
        self.groups: list = []
        self.tp_of = [0] * world_size  # rank -> group idx
        self.pp_of = [0] * world_size
        self.dp_of = [0] * world_size
        self._make_groups()
        self._ops: dict = {}
        self._moe_sums: dict = {}  # group members -> _moe_sums of them, once per group
        self._stacks: dict = {}
        self._frame_dicts: dict = {}

    def coords(self, rank: int) -> tuple:
        """(dp_idx, pp_idx, tp_idx) of a global rank."""
        dp_idx, rest = divmod(rank, self.pp * self.tp)
        pp_idx, tp_idx = divmod(rest, self.tp)
        return dp_idx, pp_idx, tp_idx

    def _add_group(self, desc: str, ranks: list) -> _Group:
        idx = len(self.groups)
        name = str(idx)
        if self.hashed_names and idx:  # torch names a group by a hash of its ranks when asked to
            name = hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()
        group = _Group(idx, name, desc, tuple(ranks), "[" + ", ".join(map(str, ranks)) + "]", (name, desc))
        self.groups.append(group)
        return group

    def _make_groups(self) -> None:
        tp, pp, dp = self.tp, self.pp, self.dp
        self._add_group("default_pg", list(range(self.world)))
        for d in range(dp):
            for p in range(pp):
                g = self._add_group("tp", [d * pp * tp + p * tp + t for t in range(tp)])
                for r in g.ranks:
                    self.tp_of[r] = g.idx
        for d in range(dp):
            for t in range(tp):
                g = self._add_group("cp" if self.ring else "pp", [d * pp * tp + p * tp + t for p in range(pp)])
                for r in g.ranks:
                    self.pp_of[r] = g.idx
        for p in range(pp):
            for t in range(tp):
                g = self._add_group("dp", [d * pp * tp + p * tp + t for d in range(dp)])
                for r in g.ranks:
                    self.dp_of[r] = g.idx

    def groups_of(self, rank: int, rotated: bool = False) -> list:
        """The rank's groups in the order it created them: its pg_id is the position. The
        default group comes first; `rotated`: each rank created the others in an order of its
        own (tp, pp, dp rotated by the rank), so its pg_id for a group differs from its peers'."""
        mine = [self.groups[self.tp_of[rank]], self.groups[self.pp_of[rank]], self.groups[self.dp_of[rank]]]
        if rotated:
            turn = rank % len(mine)
            mine = mine[turn:] + mine[:turn]
        return [self.groups[0], *mine]

    def group_of(self, rank: int, kind: str) -> _Group:
        if kind == "default":
            return self.groups[0]
        table = {"tp": self.tp_of, "pp": self.pp_of, "cp": self.pp_of, "dp": self.dp_of}.get(kind)
        if table is None:
            raise ValueError(f"unknown group kind {kind!r}; expected one of {GROUP_KINDS}")
        return self.groups[table[rank]]

    # ---- operation objects (memoised: ranks of one group share them, so do steps)

    def _frames(self, tag: str, api: Optional[str] = None):
        if not self.with_frames:
            return None
        frames = self._stacks.get((tag, api))
        if frames is None:
            # One dict per distinct frame, as torch keeps them: dumps refer back to it.
            frames = [self._frame_dicts.setdefault(tuple(f.values()), f) for f in _stack(tag, api)]
            self._stacks[(tag, api)] = frames
        return frames

    def _part(self, name: str, tag: str, ins: list, dtype: str, outs: list, api: Optional[str] = None) -> _Part:
        return _Part(f"{BACKEND}:{name}", ins, [dtype] * len(ins), outs, [dtype] * len(outs),
                     self._frames(tag, api))

    def coll(self, group: _Group, name: str, tag: str, shape: list, dtype: str,
             gap_ms: float, dur_ms: float, *, uneven_out: Optional[list] = None, api: Optional[str] = None) -> _Op:
        """A single collective. `uneven_out` makes an all_to_all with rank-dependent sizes; `api`
        overrides the torch function at the top of the stack."""
        key = (group.idx, name, tag, tuple(shape), dtype, tuple(uneven_out or ()), api)
        op = self._ops.get(key)
        if op is None:
            sig: tuple
            if uneven_out is not None:
                ins, outs = [shape], [uneven_out]
                sig = (None, name, dtype)  # shapes legitimately differ per rank
            else:
                ins, outs = _shapes(name, shape, len(group.ranks))
                sig = (name, dtype, tuple(map(tuple, ins)), tuple(map(tuple, outs)))
            part = self._part(name, tag, ins, dtype, outs, api)
            op = _Op(_COLL, group, name, tag, (part,), sig, -1, int(gap_ms * _MS), int(dur_ms * _MS))
            self._ops[key] = op
        return op

    def batch(self, group: _Group, name: str, tag: str, shapes: list, dtype: str,
              gap_ms: float, dur_ms: float) -> _Op:
        """A coalesced batch: one entry per tensor, then the `nccl:coalesced` marker."""
        key = (group.idx, "batch", name, tag, tuple(map(tuple, shapes)), dtype)
        op = self._ops.get(key)
        if op is None:
            parts = []
            for shape in shapes:
                ins, outs = _shapes(name, shape, len(group.ranks))
                parts.append(self._part(name, tag, ins, dtype, outs))
            parts.append(_Part(f"{BACKEND}:coalesced", [], [], [], [], self._frames("dp_grads_end"), True))
            sig = (name, dtype, tuple(tuple(map(tuple, p.input_sizes)) for p in parts))
            op = _Op(_COLL, group, name, tag, tuple(parts), sig, -1, int(gap_ms * _MS), int(dur_ms * _MS))
            self._ops[key] = op
        return op

    def p2p(self, kind: int, group: _Group, me: int, peer: int, tag: str, shape: list, dtype: str,
            gap_ms: float, dur_ms: float) -> _Op:
        """One send or recv; profiling_name carries group-local ranks (`send 0->1`, `recv 1<-0`)."""
        key = (group.idx, kind, me, peer, tag, tuple(shape), dtype)
        op = self._ops.get(key)
        if op is None:
            lme, lpeer = group.local(me), group.local(peer)
            name = "send" if kind == _SEND else "recv"
            label = f"send {lme}->{lpeer}" if kind == _SEND else f"recv {lme}<-{lpeer}"
            part = self._part(label, tag, [shape], dtype, [shape])
            sig = ("p2p", dtype, tuple(shape))  # a send and its recv must move the same tensor
            op = _Op(kind, group, name, tag, (part,), sig, peer, int(gap_ms * _MS), int(dur_ms * _MS))
            self._ops[key] = op
        return op

    def p2p_batch(self, group: _Group, me: int, subs: tuple, gap_ms: float, dur_ms: float) -> _Op:
        """A `batch_isend_irecv` of `subs` ((kind, peer, tag, shape, dtype) each): one entry per
        send/recv, then the `nccl:coalesced` end marker (the only entry whose state advances)."""
        key = (group.idx, "p2p_batch", me, subs)
        op = self._ops.get(key)
        if op is None:
            parts = []
            for kind, peer, tag, shape, dtype in subs:
                lme, lpeer = group.local(me), group.local(peer)
                label = f"send {lme}->{lpeer}" if kind == _SEND else f"recv {lme}<-{lpeer}"
                parts.append(self._part(label, tag, [list(shape)], dtype, [list(shape)], "batch_isend_irecv"))
            parts.append(_Part(f"{BACKEND}:coalesced", [], [], [], [], parts[-1].frames, True))
            sig = tuple(("p2p", dtype, shape) for _, _, _, shape, dtype in subs)
            op = _Op(_BATCH, group, "batch_isend_irecv", subs[0][2], tuple(parts), sig, -1,
                     int(gap_ms * _MS), int(dur_ms * _MS), subs)
            self._ops[key] = op
        return op

    def _pipeline(self, kind: int, group: _Group, me: int, peer: int, tag: str, shape: list, dtype: str,
                  gap_ms: float, dur_ms: float, batched: bool) -> _Op:
        """One pipeline op: a plain send/recv, or a batch of one (Megatron batches every op)."""
        if kind == _SEND:
            gap_ms += self.bubble_ms  # the stage computes its layers before it sends
        if not batched:
            return self.p2p(kind, group, me, peer, tag, shape, dtype, gap_ms, dur_ms)
        return self.p2p_batch(group, me, ((kind, peer, tag, tuple(shape), dtype),), gap_ms, dur_ms)

    # ---- programs

    def prologue(self, rank: int) -> list:
        ops = [self.coll(self.groups[0], "broadcast", "bcast_config", [8], "Long", 900.0, 0.05),
               self.coll(self.groups[0], "all_reduce_barrier", "barrier", [1], "Float", 0.2, 0.05)]
        if self.dp > 1:
            ops.append(self.coll(self.groups[self.dp_of[rank]], "broadcast", "param_sync", [4194304],
                                 "BFloat16", 5.0, 2.0))
        return ops

    def step_ops(self, rank: int, parity: int, batched: bool = False) -> list:
        """One training step of `rank`; even and odd steps differ (MoE layer, DP batch type).
        `batched`: every pipeline op is a batch_isend_irecv, and a stage's forward send and
        backward recv share one (Megatron's send_forward_recv_backward)."""
        if self.ring:
            return self._ring_step_ops(rank, batched)
        if self.vchunks > 1:
            return self._interleaved_step_ops(rank, parity, batched)
        _, stage, _ = self.coords(rank)
        tp_g, pp_g, dp_g = (self.groups[t[rank]] for t in (self.tp_of, self.pp_of, self.dp_of))
        act, bf16 = [4096, 1024], "BFloat16"
        last = self.pp - 1
        ops = []
        # Forward.
        prev = pp_g.ranks[stage - 1] if stage > 0 else -1
        nxt = pp_g.ranks[stage + 1] if stage < last else -1
        if stage > 0:
            ops.append(self._pipeline(_RECV, pp_g, rank, prev, "recv_fwd", act, bf16, 0.3, 0.4, batched))
        if self.tp > 1:
            ops.append(self.coll(tp_g, "all_reduce", "fwd_attn", act, bf16, 1.5, 0.3))
            ops.append(self.coll(tp_g, "_all_gather_base", "fwd_sp_gather", [1024, 1024], bf16, 1.0, 0.2))
            ops.append(self.coll(tp_g, "_reduce_scatter_base", "fwd_sp_scatter", [1024, 1024], bf16, 1.2, 0.2))
        if self.dp > 1 and parity == 0:
            # MoE token dispatch: every rank sends and receives a different number of tokens.
            if dp_g.ranks not in self._moe_sums:
                self._moe_sums[dp_g.ranks] = _moe_sums(dp_g.ranks)
            n_in, n_out = _moe_tokens(dp_g.ranks, rank, self._moe_sums[dp_g.ranks])
            ops.append(self.coll(dp_g, "all_to_all_single", "moe_a2a", [n_in, 1024], bf16, 0.8, 0.6,
                                 uneven_out=[n_out, 1024]))
        if stage < last:
            send = self._pipeline(_SEND, pp_g, rank, nxt, "send_fwd", act, bf16, 0.5, 0.4, batched)
            # Backward.
            recv = self._pipeline(_RECV, pp_g, rank, nxt, "recv_bwd", act, bf16, 0.3, 0.4, batched)
            if batched:
                ops.append(self.p2p_batch(pp_g, rank, send.subs + recv.subs, send.gap_ns / _MS, 0.4))
            else:
                ops += [send, recv]
        if self.tp > 1:
            ops.append(self.coll(tp_g, "all_gather", "bwd_gather", [1024, 1024], bf16, 2.0, 0.2))
            ops.append(self.coll(tp_g, "all_reduce", "bwd_attn", act, bf16, 3.0, 0.3))
        if stage > 0:
            ops.append(self._pipeline(_SEND, pp_g, rank, prev, "send_bwd", act, bf16, 0.5, 0.4, batched))
        # Optimizer.
        if self.pp > 1:
            ops.append(self.coll(pp_g, "all_reduce", "pp_norm", [1], "Float", 0.4, 0.05))
        if self.dp > 1:
            if parity == 0:  # ZeRO: reduce-scatter gradient buckets in one coalesced batch
                ops.append(self.batch(dp_g, "reduce_scatter_tensor_coalesced", "dp_grads_rs",
                                      [[6291456], [6291456], [2097152]], "Float", 0.6, 4.0))
            else:  # DDP-style bucketed all_reduce under the coalescing manager
                ops.append(self.batch(dp_g, "all_reduce", "dp_grads_ar",
                                      [[6291456], [6291456], [2097152]], "Float", 0.6, 5.0))
            ops.append(self.coll(dp_g, "_all_gather_base", "dp_params", [4194304], bf16, 1.0, 2.0))
        ops.append(self.coll(self.groups[0], "all_reduce", "loss", [1], "Float", 0.3, 0.1))
        return ops

    def _optimizer_ops(self, rank: int, parity: int) -> list:
        """The end of a step: data-parallel gradients and parameters, the loss."""
        dp_g = self.groups[self.dp_of[rank]]
        ops = []
        if self.dp > 1:
            if parity == 0:
                ops.append(self.batch(dp_g, "reduce_scatter_tensor_coalesced", "dp_grads_rs",
                                      [[6291456], [6291456], [2097152]], "Float", 0.6, 4.0))
            else:
                ops.append(self.batch(dp_g, "all_reduce", "dp_grads_ar", [[6291456], [6291456], [2097152]],
                                      "Float", 0.6, 5.0))
            ops.append(self.coll(dp_g, "_all_gather_base", "dp_params", [4194304], "BFloat16", 1.0, 2.0))
        ops.append(self.coll(self.groups[0], "all_reduce", "loss", [1], "Float", 0.3, 0.1))
        return ops

    def _ring_step_ops(self, rank: int, batched: bool) -> list:
        """A step of context-parallel ring attention (the `pp` dimension is the ring): per
        layer, forward, cp - 1 ring steps passing key/value blocks on (each rank sends to the
        next rank of the ring and receives from the previous one), then backward the same
        with their gradients, which doubles the tensor. Plain: even ring positions send
        first, odd ones receive first; `batched`: one batch_isend_irecv per ring step."""
        tp_g, cp_g = self.groups[self.tp_of[rank]], self.groups[self.pp_of[rank]]
        bf16, layers = "BFloat16", 2
        ops: list = []
        for _ in range(layers):
            if self.tp > 1:
                ops.append(self.coll(tp_g, "all_reduce", "fwd_attn", [4096, 1024], bf16, 1.5, 0.3))
            ops += self._ring_exchange(cp_g, rank, "fwd", [2, 4096, 8, 128], batched)
        for _ in range(layers):
            ops += self._ring_exchange(cp_g, rank, "bwd", [2, 2, 4096, 8, 128], batched)
            if self.tp > 1:
                ops.append(self.coll(tp_g, "all_reduce", "bwd_attn", [4096, 1024], bf16, 3.0, 0.3))
        return ops + self._optimizer_ops(rank, 0)

    def _ring_exchange(self, cp_g: _Group, rank: int, phase: str, shape: list, batched: bool) -> list:
        """The cp - 1 ring steps of one layer's attention, in `phase` (fwd or bwd)."""
        size = len(cp_g.ranks)
        if size < 2:
            return []
        me = cp_g.local(rank)
        nxt, prv = cp_g.ranks[(me + 1) % size], cp_g.ranks[(me - 1) % size]
        tag_send, tag_recv = f"ring_send_{phase}", f"ring_recv_{phase}"
        ops: list = []
        for _ in range(size - 1):
            if batched:
                subs = ((_SEND, nxt, tag_send, tuple(shape), "BFloat16"), (_RECV, prv, tag_recv, tuple(shape), "BFloat16"))
                ops.append(self.p2p_batch(cp_g, rank, subs, 0.2, 0.4))
                continue
            send = self.p2p(_SEND, cp_g, rank, nxt, tag_send, shape, "BFloat16", 0.2, 0.4)
            recv = self.p2p(_RECV, cp_g, rank, prv, tag_recv, shape, "BFloat16", 0.05, 0.4)
            ops += [send, recv] if me % 2 == 0 else [recv, send]
        return ops

    def _interleaved_step_ops(self, rank: int, parity: int, batched: bool) -> list:
        """A step of an interleaved pipeline (virtual pipeline parallelism): each stage holds
        `vchunks` model chunks; chunk c of stage s is virtual stage c * pp + s. Each micro
        batch goes forward through the virtual stages in order (the last stage hands chunk
        c on to the first stage's chunk c + 1), then backward in reverse; each virtual stage
        receives, runs its TP collectives and sends, one micro batch at a time. `batched`:
        as Megatron's interleaved schedule does, a send and the recv that follows it go out
        as one batch_isend_irecv (send_forward_recv_forward, send_backward_recv_backward)."""
        _, stage, _ = self.coords(rank)
        tp_g, pp_g = self.groups[self.tp_of[rank]], self.groups[self.pp_of[rank]]
        act, bf16, last = [4096, 1024], "BFloat16", self.vchunks * self.pp - 1
        def owner(virtual: int) -> int:
            return pp_g.ranks[virtual % self.pp]
        ops: list = []
        for _ in range(max(2, self.pp // 2)):  # micro batches
            for chunk in range(self.vchunks):
                virtual = chunk * self.pp + stage
                if virtual > 0:
                    ops.append(self._pipeline(_RECV, pp_g, rank, owner(virtual - 1), "recv_fwd", act, bf16, 0.3, 0.4, False))
                if self.tp > 1:
                    ops.append(self.coll(tp_g, "all_reduce", "fwd_attn", act, bf16, 1.5, 0.3))
                    ops.append(self.coll(tp_g, "_reduce_scatter_base", "fwd_sp_scatter", [1024, 1024], bf16, 1.2, 0.2))
                if virtual < last:
                    ops.append(self._pipeline(_SEND, pp_g, rank, owner(virtual + 1), "send_fwd", act, bf16, 0.5, 0.4, False))
            for chunk in reversed(range(self.vchunks)):
                virtual = chunk * self.pp + stage
                if virtual < last:
                    ops.append(self._pipeline(_RECV, pp_g, rank, owner(virtual + 1), "recv_bwd", act, bf16, 0.3, 0.4, False))
                if self.tp > 1:
                    ops.append(self.coll(tp_g, "_all_gather_base", "fwd_sp_gather", [1024, 1024], bf16, 1.0, 0.2))
                    ops.append(self.coll(tp_g, "all_reduce", "bwd_attn", act, bf16, 3.0, 0.3))
                if virtual > 0:
                    ops.append(self._pipeline(_SEND, pp_g, rank, owner(virtual - 1), "send_bwd", act, bf16, 0.5, 0.4, False))
        if batched:
            ops = self._interleaved_1f1b(rank)
        if self.pp > 1:
            ops.append(self.coll(pp_g, "all_reduce", "pp_norm", [1], "Float", 0.4, 0.05))
        return ops + self._optimizer_ops(rank, parity)

    def _interleaved_1f1b(self, rank: int) -> list:
        """Megatron's interleaved 1F1B schedule, as `batch_p2p_comm` runs it (every exchange
        one batch_isend_irecv; sends and receives to the previous stage first, then to the
        next, the first and last stages neighbours in a ring). With P stages, v chunks and M
        = P micro batches, there are N = M v virtual micro batches; the k-th forward runs
        chunk (k mod Pv) // P, the k-th backward chunk v - 1 - that. Stage s runs
        min(N, 2 (P - s - 1) + (v - 1) P) forwards first (warmup), then one forward and one
        backward at a time (steady state), then the remaining backwards (cooldown); each
        exchange sends what it just computed and receives what it computes next."""
        _, stage, _ = self.coords(rank)
        tp_g, pp_g = self.groups[self.tp_of[rank]], self.groups[self.pp_of[rank]]
        P, v = self.pp, self.vchunks
        total = P * v  # one micro batch per stage
        act, bf16 = (4096, 1024), "BFloat16"
        prev, nxt = pp_g.ranks[(stage - 1) % P], pp_g.ranks[(stage + 1) % P]

        def chunk(k: int, forward: bool) -> int:
            c = (k % (P * v)) // P
            return c if forward else v - 1 - c

        def first_virtual(k: int, forward: bool) -> bool:  # the model's first layers: input from data
            return stage == 0 and chunk(k, forward) == 0

        def last_virtual(k: int, forward: bool) -> bool:  # the model's last layers: the loss
            return stage == P - 1 and chunk(k, forward) == v - 1

        def exchange(send_fwd: bool, send_bwd: bool, recv_fwd: bool, recv_bwd: bool) -> list:
            subs = []
            if send_bwd:
                subs.append((_SEND, prev, "send_bwd", act, bf16))
            if recv_fwd:
                subs.append((_RECV, prev, "recv_fwd", act, bf16))
            if send_fwd:
                subs.append((_SEND, nxt, "send_fwd", act, bf16))
            if recv_bwd:
                subs.append((_RECV, nxt, "recv_bwd", act, bf16))
            return [self.p2p_batch(pp_g, rank, tuple(subs), 0.5, 0.4)] if subs else []

        def forward() -> list:
            if self.tp < 2:
                return []
            return [self.coll(tp_g, "all_reduce", "fwd_attn", list(act), bf16, 1.5, 0.3),
                    self.coll(tp_g, "_reduce_scatter_base", "fwd_sp_scatter", [1024, 1024], bf16, 1.2, 0.2)]

        def backward() -> list:
            if self.tp < 2:
                return []
            return [self.coll(tp_g, "_all_gather_base", "fwd_sp_gather", [1024, 1024], bf16, 1.0, 0.2),
                    self.coll(tp_g, "all_reduce", "bwd_attn", list(act), bf16, 3.0, 0.3)]

        warmup = total if v * P == total and P == 1 else min(total, 2 * (P - stage - 1) + (v - 1) * P)
        steady = total - warmup
        ops = exchange(False, False, not first_virtual(0, True), False)
        for k in range(warmup):
            ops += forward()
            recv_fwd = k + 1 < total and not first_virtual(k + 1, True)
            recv_bwd = k == warmup - 1 and steady > 0 and not last_virtual(0, False)
            ops += exchange(not last_virtual(k, True), False, recv_fwd, recv_bwd)
        if steady == 0:  # every forward ran in the warmup: the first backward's grad
            ops += exchange(False, False, False, not last_virtual(0, False))
        for k in range(steady):
            forward_k = k + warmup
            ops += forward() + backward()
            recv_fwd = k + 1 < steady and not first_virtual(forward_k + 1, True)
            recv_bwd = not last_virtual(k + 1, False)
            ops += exchange(not last_virtual(forward_k, True), not first_virtual(k, False), recv_fwd, recv_bwd)
        for k in range(steady, total):
            ops += backward()
            recv_bwd = k + 1 < total and not last_virtual(k + 1, False)
            ops += exchange(False, not first_virtual(k, False), False, recv_bwd)
        return ops

    def program(self, rank: int, steps: int) -> tuple:
        """(ops, step_starts): the rank's whole program; step s is ops[starts[s]:starts[s+1]]."""
        ops = self.prologue(rank)
        # "mixed": odd steps batch their pipeline ops, even steps send and receive plainly.
        batched = {"plain": (False, False), "batched": (True, True), "mixed": (False, True)}[self.p2p_mode]
        variants = tuple(self.step_ops(rank, parity, batched[parity]) for parity in (0, 1))
        starts = []
        for s in range(steps):
            starts.append(len(ops))
            ops += variants[s & 1]
        starts.append(len(ops))
        return ops, starts


# --------------------------------------------------------------------------- fault injection


@dataclass(**_SLOTS)
class _Injected:
    """Where the fault landed, for the truth file."""

    group: Optional[_Group] = None
    op: Optional[str] = None
    seq: Optional[int] = None  # collective_seq_id in `group`
    poisoned: frozenset = frozenset()  # (group idx, seq) of collectives that never complete
    delete_dump: bool = False
    straggler: int = -1
    p2p_peer: int = -1
    tie: bool = False
    stalled: dict = field(default_factory=dict)  # gpu_error: rank -> index of its first op that never completes


def _coll_seq_before(ops: list, index: int, group: _Group) -> int:
    """How many collectives of `group` come before ops[index]."""
    return sum(1 for op in ops[:index] if op.kind == _COLL and op.group is group)


def _target(ops: list, step: range, group: _Group, last: bool = False) -> int:
    """Index of the culprit's first (or last) plain collective of `group` in `step`."""
    found = [i for i in step if ops[i].group is group and ops[i].plain]
    if not found:
        raise ValueError(f"no collective in the {group.desc} group in that step: check the layout "
                         f"(a group of one rank issues nothing)")
    return found[-1] if last else found[0]


def _changed(world: _World, op: _Op, *, name: Optional[str] = None, dtype: Optional[str] = None,
             grow: int = 0) -> _Op:
    """A copy of a plain collective with another op name, dtype or first dimension."""
    part = op.parts[0]
    new_name = name or op.name
    new_dtype = dtype or part.input_dtypes[0]
    # Recover the per-rank tensor shape the op was made from.
    shape = list(part.output_sizes[0] if op.name in ("_reduce_scatter_base",) else part.input_sizes[0])
    shape[0] += grow
    api = _API_OF_OP.get(new_name) if name else None  # the culprit called another torch function
    return world.coll(op.group, new_name, op.tag, shape, new_dtype, op.gap_ns / _MS, op.dur_ns / _MS, api=api)


def _inject(world: _World, progs: list, starts: dict, fault: Fault, steps: int,
            healthy: Optional["_Run"] = None) -> _Injected:
    """Edit the culprit's program (or mark a collective) as `fault` says; see the module doc.
    `starts`: culprit -> its step boundaries; `healthy`: the job simulated without the fault
    (for `Fault.at_once`)."""
    kind, culprit = fault.kind, fault.rank
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
    for rank in fault.culprits():
        if not 0 <= rank < world.world:
            raise ValueError(f"fault rank {rank} is outside the world (size {world.world})")
    if fault.at_once and kind not in SEVERAL_CULPRITS:
        raise ValueError(f"at_once is only for several culprits ({' and '.join(SEVERAL_CULPRITS)})")
    if fault.at_once and fault.rank not in fault.culprits():
        raise ValueError(f"at_once: the first culprit (rank {fault.rank}) must be one of the ranks {fault.culprits()}")
    if fault.dumped_late and kind != "in_flight":
        raise ValueError("dumped_late ranks are only for in_flight (a healthy job dumped mid-op)")
    if len(fault.culprits()) > 1 and kind not in SEVERAL_CULPRITS:
        raise ValueError(f"several culprit ranks are only supported for {' and '.join(SEVERAL_CULPRITS)}")
    if kind in ("missing_dump", "straggler"):  # healthy programs
        return _Injected(delete_dump=kind == "missing_dump",
                         straggler=culprit if kind == "straggler" else -1)
    if not 0 <= fault.step < steps:
        raise ValueError(f"fault step {fault.step} is outside 0..{steps - 1}")
    if kind == "gpu_error":
        return _stall_gpus(world, progs, starts, fault, healthy)
    if kind == "in_flight":
        return _in_flight(world, progs, fault, steps)
    if kind == "hang" and len(fault.culprits()) > 1:
        return _hang_several(world, progs, starts, fault, healthy)
    group = world.group_of(culprit, fault.group)
    ops = progs[culprit] = list(progs[culprit])  # the culprit's program becomes its own
    step = range(starts[culprit][fault.step], starts[culprit][fault.step + 1])
    if kind == "p2p_unmatched":
        return _omit_send(world, ops, step, group, fault)
    if kind == "skip_ring_step":
        return _skip_ring_step(world, ops, step, group, fault)
    if kind == "extra_op":
        return _add_extra(world, ops, step, group, fault)
    return _edit_collective(world, ops, step, group, kind, fault.last_op)


def _stall_gpus(world: _World, progs: list, starts: dict, fault: Fault, healthy: Optional["_Run"]) -> _Injected:
    """gpu_error: from the step on, no op of a culprit completes on its side (its events never
    fire: its entries stay scheduled, or started), though the kernels ran, so its peers
    complete them. Its host goes on enqueueing a few more ops (the j-th culprit 4 + 3j), then
    blocks (a host sync): its peers wait in the next op that needs it. With `at_once` every
    culprit's GPU stops at one moment, mid-step (when the first, `Fault.rank`, issues the
    middle op of its step), from its first op that had not finished by then. (Late in the
    job's last step, a host may run out of ops before it blocks: nothing then waits.)"""
    info = _Injected()
    culprits = fault.culprits()
    moment = None
    if fault.at_once:
        start, end = starts[fault.rank][fault.step], starts[fault.rank][fault.step + 1]
        moment = _moment(healthy, fault.rank, (start + end) // 2)
    for j, rank in enumerate(culprits):
        first = starts[rank][fault.step]
        if moment is not None:
            assert healthy is not None  # _moment refused without it
            first = _first_at(healthy.t_end[rank], moment)
        progs[rank] = list(progs[rank][: first + 4 + 3 * j])
        info.stalled[rank] = first
        # The truth's op: the first culprit's (`Fault.rank` where the others stop at its moment).
        if first < len(progs[rank]) and (info.group is None if moment is None else rank == fault.rank):
            op = progs[rank][first]
            info.group, info.op = op.group, op.name
            info.seq = _coll_seq_before(progs[rank], first, op.group) + 1 if op.kind == _COLL else None
    return info


def _moment(healthy: Optional["_Run"], rank: int, index: int) -> int:
    """When `rank` issued ops[index] in the job without the fault (`Fault.at_once`)."""
    if healthy is None:
        raise ValueError("at_once needs the job simulated without its fault")
    return healthy.t_issue[rank][index]


def _first_at(times: array, moment: int) -> int:
    """Index of the first op whose time (issue or end, in the job without the fault) is at or
    after `moment`: the first the fault reaches."""
    return next((i for i, t in enumerate(times) if t >= moment), len(times))


def _hang_several(world: _World, progs: list, starts: dict, fault: Fault, healthy: Optional["_Run"]) -> _Injected:
    """hang with several culprits (NVRx's LOCK_GIL: hosts that stop issuing at once): each
    culprit issues nothing from the step's target collective of its own group of the
    family on; with `at_once`, the first culprit so and every other from its first op it
    would have issued at that moment or later. Returns the first culprit's op."""
    first = fault.rank if fault.at_once else fault.culprits()[0]
    ops = progs[first] = list(progs[first])
    step = range(starts[first][fault.step], starts[first][fault.step + 1])
    group = world.group_of(first, fault.group)
    target = _target(ops, step, group, last=fault.last_op)
    info = _edit_collective(world, ops, step, group, "hang", fault.last_op)
    moment = _moment(healthy, first, target) if fault.at_once else None
    for rank in fault.culprits():
        if rank == first:
            continue
        ops = progs[rank] = list(progs[rank])
        if moment is not None:
            assert healthy is not None  # _moment refused without it
            del ops[_first_at(healthy.t_issue[rank], moment):]
            continue
        step = range(starts[rank][fault.step], starts[rank][fault.step + 1])
        _edit_collective(world, ops, step, world.group_of(rank, fault.group), "hang", fault.last_op)
    return info


def _in_flight(world: _World, progs: list, fault: Fault, steps: int) -> _Injected:
    """in_flight (no fault): the job is dumped while every group of the culprit's family
    (all the dp groups, say) is in the step's first plain collective of the group: every
    member has issued it, none has completed it yet."""
    family = [g for g in world.groups if g.desc == world.group_of(fault.rank, fault.group).desc and len(g.ranks) > 1]
    if not family:
        raise ValueError(f"the {fault.group} groups have a single member: nothing is in flight there")
    info = _Injected(group=world.group_of(fault.rank, fault.group))
    poisoned = set()
    for group in family:
        member = group.ranks[0]
        starts = world.program(member, steps)[1]
        ops = progs[member]
        i = _target(ops, range(starts[fault.step], starts[fault.step + 1]), group)
        seq = _coll_seq_before(ops, i, group) + 1
        poisoned.add((group.idx, seq))
        if group is info.group:
            info.op, info.seq = ops[i].name, seq
    info.poisoned = frozenset(poisoned)
    return info


def _blocked_in(run: "_Run", rank: int, group: _Group, seq: int) -> bool:
    """Whether the rank's simulation stopped in collective `seq` of `group`."""
    ops, i = run.progs[rank], run.done[rank]
    return i < len(ops) and ops[i].kind == _COLL and ops[i].group is group and _coll_seq_before(ops, i, group) + 1 == seq


def _sends_of(op: _Op) -> list:
    """The peers `op` sends to: one for a send, those of its sends for a batch."""
    if op.kind == _SEND:
        return [op.peer]
    return [sub[1] for sub in op.subs if sub[0] == _SEND]


def _omit_send(world: _World, ops: list, step: range, group: _Group, fault: Fault) -> _Injected:
    if fault.group != "pp":
        raise ValueError("p2p_unmatched happens in the pipeline group: use group='pp'")
    sends = [i for i in step if ops[i].group is group and ops[i].kind != _COLL and _sends_of(ops[i])]
    if not sends:
        raise ValueError("p2p_unmatched needs pp > 1 (the culprit has no send to omit)")
    i = sends[0]
    op = ops[i]
    peer = _sends_of(op)[0]
    rest = tuple(sub for sub in op.subs if not (sub[0] == _SEND and sub[1] == peer))
    if rest:  # the batch goes out without that send
        ops[i] = world.p2p_batch(group, fault.rank, rest, op.gap_ns / _MS, op.dur_ns / _MS)
    else:
        del ops[i]  # never posted; the culprit carries on with its step
    return _Injected(group=group, op="send", p2p_peer=peer)


def _skip_ring_step(world: _World, ops: list, step: range, group: _Group, fault: Fault) -> _Injected:
    """skip_ring_step: the culprit leaves out one ring step of its step's first forward
    attention layer (its send and its recv, or their batch) and goes on. NCCL pairs a
    channel's ops in order, so its later ring ops pair with its neighbours' earlier ones
    until two of them move different tensors (the backward ring's are twice as large):
    there the ring hangs, the culprit one ring step short of its neighbours."""
    if not world.ring or fault.group != "cp":
        raise ValueError("skip_ring_step needs a context-parallel ring: generate(ring=True), group='cp'")
    if len(group.ranks) < 2:
        raise ValueError("skip_ring_step needs a ring of two ranks or more (pp > 1)")
    ring = [i for i in step if ops[i].group is group and ops[i].tag.endswith("_fwd")]
    per_step = 1 if ops[ring[0]].kind == _BATCH else 2
    layer_steps = len(group.ranks) - 1
    which = fault.ring_step % layer_steps
    for i in reversed(ring[which * per_step:(which + 1) * per_step]):
        del ops[i]
    return _Injected(group=group, op="send")


def _add_extra(world: _World, ops: list, step: range, group: _Group, fault: Fault) -> _Injected:
    if len(group.ranks) < 2:
        raise ValueError(f"the {fault.group} group of rank {fault.rank} has a single member")
    if fault.group == "default":
        i = len(ops)  # after the last step, when everybody else is done (the classic desync)
    else:
        # Just before the step's loss all_reduce, which the peers then wait in: they never
        # issue their own collective #k of the group.
        i = next(j for j in reversed(step) if ops[j].tag == "loss")
    ops.insert(i, world.coll(group, "all_reduce", "extra", [1], "Float", 0.2, 0.05))
    return _Injected(group=group, op="all_reduce", seq=_coll_seq_before(ops, i, group) + 1)


def _edit_collective(world: _World, ops: list, step: range, group: _Group, kind: str, last_op: bool) -> _Injected:
    i = _target(ops, step, group, last=kind == "skip_op" or last_op)
    op = ops[i]
    info = _Injected(group=group, op=op.name, seq=_coll_seq_before(ops, i, group) + 1,
                     tie=len(group.ranks) == 2 and kind.endswith("_mismatch"))
    if kind in ("hang", "missing_dump_hang"):
        del ops[i:]  # stuck outside collectives (data loader, host code): issues nothing more
        info.delete_dump = kind == "missing_dump_hang"
    elif kind == "skip_op":
        del ops[i]
    elif kind == "stuck":
        info.poisoned = frozenset({(group.idx, info.seq)})
    elif kind == "size_mismatch":
        ops[i] = _changed(world, op, grow=1)
    elif kind == "dtype_mismatch":
        ops[i] = _changed(world, op, dtype="Float" if op.parts[0].input_dtypes[0] != "Float" else "BFloat16")
    elif kind == "op_mismatch":
        ops[i] = _changed(world, op, name="broadcast" if op.name != "broadcast" else "all_reduce")
    return info


# --------------------------------------------------------------------------- simulation


@dataclass(**_SLOTS)
class _Run:
    """Result of the simulation: everything `_DumpBuilder` needs."""

    progs: list  # rank -> list[_Op]
    done: list  # rank -> number of ops completed (the next one is where it blocks)
    issued: list  # rank -> number of ops enqueued (done + blocked op + lookahead)
    t_issue: list  # rank -> array of wall-clock enqueue times (true time, ns)
    t_end: list  # rank -> array of completion times (valid below `done`)


def _late_at(op_index: int, share: float) -> bool:
    """Whether a straggler late at `share` of its ops is late at its op `op_index`: spread
    evenly but not in a fixed period (a hash of the index), the same on every run."""
    return share >= 1.0 or (op_index * 2654435761) % 4294967296 < share * 4294967296


def _simulate(world: _World, progs: list, poisoned: frozenset, straggler: int,
              straggler_ns: int, lookahead: int, rng: random.Random, straggler_share: float = 1.0) -> _Run:
    n = world.world
    groups = world.groups
    jitter = [rng.randrange(0, 200_000) for _ in range(4096)]  # ns; indexed, not drawn per op
    done = [0] * n
    t_issue = [array("q", bytes(8 * len(p))) for p in progs]
    t_end = [array("q", bytes(8 * len(p))) for p in progs]
    coll_count: list[dict] = [{} for _ in range(n)]  # rank -> {group idx: collectives reached}
    p2p_count: list[dict] = [{} for _ in range(n)]  # rank -> {(group idx, src, dst): sends or recvs reached}
    waiting: dict = {}  # instance key -> participants that reached it
    ready: list = []  # instance keys every participant has reached
    # A batch_isend_irecv completes on its rank once each of its sends and recvs has met its
    # peer (each on its own: the peer's end of it may complete long before the whole batch).
    unmet = [0] * n  # rank -> sends/recvs of its current batch still waiting for their peer
    batch_end = [0] * n  # rank -> when the last of them finished so far

    def reach(r: int, op: _Op) -> None:
        """`op` is now rank r's next op, the one it waits in: count it towards its instance."""
        key: tuple
        if op.kind == _COLL:
            counts = coll_count[r]
            k = counts[op.gidx] = counts.get(op.gidx, 0) + 1
            key = (op.gidx, k)
        elif op.kind == _BATCH:
            counts = p2p_count[r]
            unmet[r], batch_end[r] = len(op.subs), 0
            for sub in op.subs:
                pair = (op.gidx, r, sub[1]) if sub[0] == _SEND else (op.gidx, sub[1], r)
                k = counts[pair] = counts.get(pair, 0) + 1
                key = pair + (k,)
                got = waiting.pop(key, 0) + 1
                if got == 2:
                    ready.append(key)
                else:
                    waiting[key] = got
            return
        else:
            pair = (op.gidx, r, op.peer) if op.kind == _SEND else (op.gidx, op.peer, r)
            counts = p2p_count[r]
            k = counts[pair] = counts.get(pair, 0) + 1
            key = pair + (k,)
        got = waiting.pop(key, 0) + 1
        if got == op.need:
            ready.append(key)
        else:
            waiting[key] = got

    for r in range(n):
        if progs[r]:
            late = straggler_ns if r == straggler else 0
            t_issue[r][0] = EPOCH_NS + progs[r][0].gap_ns + jitter[r & 4095] * 20 + late
            reach(r, progs[r][0])

    def advance(p: int, finish: int) -> None:
        """Rank p's current op finished at `finish`: it issues its next op."""
        i = done[p]
        t_end[p][i] = finish
        i += 1
        done[p] = i
        if i < len(progs[p]):
            late = straggler_ns if p == straggler and _late_at(i, straggler_share) else 0
            t_issue[p][i] = finish + progs[p][i].gap_ns + jitter[(i * 31 + p * 7) & 4095] + late
            reach(p, progs[p][i])

    while ready:
        key = ready.pop()
        if key in poisoned:
            continue  # "stuck", "in_flight": everyone is in it and it never finishes (yet)
        if len(key) == 4 and progs[key[1]][done[key[1]]].kind == _BATCH == progs[key[2]][done[key[2]]].kind:
            _meet_in_batches(key, progs, done, t_issue, jitter, unmet, batch_end, advance)
            continue
        # A plain send/recv never meets a batched one: unbatched P2P runs on a communicator of
        # its own (lazy init); their signatures differ, so the pair below never completes.
        members = groups[key[0]].ranks if len(key) == 2 else key[1:3]
        head = progs[members[0]][done[members[0]]]
        sig, start = head.sig, 0
        for p in members:
            op = progs[p][done[p]]
            if op.sig is not sig and op.sig != sig:
                break  # participants disagree (op, shape or dtype): NCCL hangs
            t = t_issue[p][done[p]]
            if t > start:
                start = t
        else:
            finish = start + head.dur_ns + jitter[key[-1] & 4095]
            for p in members:
                advance(p, finish)

    issued = [0] * n
    for r in range(n):
        ops, i = progs[r], done[r]
        if i >= len(ops):
            issued[r] = len(ops)
            continue
        # Blocked in ops[i]; the host may still have enqueued `lookahead` more behind it.
        issued[r] = min(len(ops), i + 1 + lookahead)
        for j in range(i + 1, issued[r]):
            t_issue[r][j] = t_issue[r][j - 1] + ops[j].gap_ns // 4 + jitter[(j + r) & 4095]
    return _Run(progs, done, issued, t_issue, t_end)


def _meet_in_batches(key: tuple, progs: list, done: list, t_issue: list, jitter: list, unmet: list,
                     batch_end: list, advance: Callable) -> None:
    """The send and recv of channel instance `key` (group, src, dst, k), each inside a batch,
    meet; a batch whose sends and recvs have all met completes."""
    src, dst = key[1], key[2]
    ends = ((src, progs[src][done[src]], _SEND, dst), (dst, progs[dst][done[dst]], _RECV, src))
    sigs = {("p2p", sub[4], sub[3]) for _, op, kind, peer in ends for sub in op.subs
            if sub[0] == kind and sub[1] == peer}
    if len(sigs) != 1:
        return  # they move different tensors: NCCL hangs
    start = max(t_issue[p][done[p]] for p, *_ in ends)
    finish = start + max(op.dur_ns for _, op, *_ in ends) + jitter[key[-1] & 4095]
    for p, *_ in ends:
        if finish > batch_end[p]:
            batch_end[p] = finish
        unmet[p] -= 1
        if unmet[p] == 0:
            advance(p, batch_end[p])


# --------------------------------------------------------------------------- dumps


class RankDumps(MutableMapping):
    """rank -> dump dict, like `dict[int, dict]`, but each dump is built on first access.

    A 16k-rank job does not fit in memory as dicts; `write_job` streams it instead. Accessed
    dumps are cached, so editing `job.dumps[3]` sticks; assigning or deleting ranks works too.
    In memory, entries share their list objects (sizes, dtypes, frames; files written by
    `write_job` do not, as with torch): replace values rather than mutating them in place.
    """

    __slots__ = ("_build", "_ranks", "_cache")

    def __init__(self, build: Callable[..., dict], ranks):
        self._build = build
        self._ranks = set(ranks)
        self._cache: dict = {}

    def __getitem__(self, rank: int) -> dict:
        dump = self._cache.get(rank)
        if dump is None:
            if rank not in self._ranks:
                raise KeyError(rank)
            dump = self._cache[rank] = self._build(rank)
        return dump

    def for_file(self, rank: int) -> dict:
        """The dump, not cached and with nothing shared between entries: ready to pickle."""
        dump = self._cache.get(rank)
        if dump is not None:
            return _unshared(dump)
        if rank not in self._ranks:
            raise KeyError(rank)
        return self._build(rank, fresh=True)

    def __setitem__(self, rank: int, dump: dict) -> None:
        self._ranks.add(rank)
        self._cache[rank] = dump

    def __delitem__(self, rank: int) -> None:
        self._ranks.remove(rank)
        self._cache.pop(rank, None)

    def __contains__(self, rank) -> bool:
        return rank in self._ranks

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._ranks))

    def __len__(self) -> int:
        return len(self._ranks)

    def __repr__(self) -> str:
        return f"<RankDumps {len(self._ranks)} ranks, {len(self._cache)} built>"


class _DumpBuilder:
    """Turns one rank's simulated history into the dict torch would pickle."""

    def __init__(self, world: _World, run: _Run, *, timing: bool, buffer_size: int, version: str,
                 rng: random.Random, coalesced_events: str = "batch", watchdog_ms: Optional[float] = None,
                 pg_status: str = "collectives", only_active: bool = False, stalled: Optional[dict] = None,
                 seed: int = 0, timeout_ms: int = TIMEOUT_MS, pg_order: str = "same", dumped_late: tuple = ()):
        self.world, self.run = world, run
        self.timeout_ms = timeout_ms
        self.rotated = pg_order == "rotated"
        self.unnamed = pg_order == "unnamed"
        self.timing, self.buffer_size, self.version = timing, buffer_size, version
        self.coalesced_events, self.pg_status_mode, self.only_active = coalesced_events, pg_status, only_active
        self.stalled = stalled or {}
        self.dumped_late = frozenset(dumped_late)
        # Per-rank wall-clock skew (up to +-1.5 ms) and the id of the thread that enqueues.
        self.offset = [rng.randrange(-1_500_000, 1_500_000) for _ in range(world.world)]
        self.thread_id = [str(139_600_000_000_000 + rng.randrange(0, 10**12)) for _ in range(world.world)]
        # The watchdog's poll period and each rank's phase (its own clock): a tick is phase + k*period.
        self.period = int(watchdog_ms * _MS) if watchdog_ms else 0
        ticks = random.Random(f"watchdog-{seed}")
        self.phase = [ticks.randrange(0, self.period) for _ in range(world.world)] if self.period else []
        # pg_config: the groups each rank belongs to, keyed (and ordered, like std::map) by name.
        self._cfg = [{"name": g.name, "desc": g.desc, "ranks": g.ranks_str} for g in world.groups]

    def _tick(self, rank: int, t: int) -> int:
        """The first watchdog poll on `rank` after wall-clock time t (the rank's own clock)."""
        return t + self.period - (t - self.phase[rank]) % self.period

    def _times(self, rank: int, i: int, state: str, t0: int, offset: int) -> tuple:
        """(time_discovered_started_ns, time_discovered_completed_ns, duration_ms) of op i."""
        timing, completed = self.timing, state == "completed"
        started_ns = completed_ns = duration = None
        # An op the simulation never finished, on a rank dumped after it ended: a moment later.
        finish = (self.run.t_end[rank][i] or t0 - offset + 1_000_000) + offset
        if self.period:  # watchdog ticks; the end event always exists, the start one needs timing
            if timing and state != "scheduled":
                started_ns = self._tick(rank, t0 + 20_000)
            if completed:
                completed_ns = self._tick(rank, finish)
        elif timing and state != "scheduled":
            started_ns = t0 + 20_000 + (i * 7919 % 500_000)  # the watchdog notices a bit later
            if completed:
                completed_ns = max(finish + (i * 104_729 % 900_000), started_ns)
        if timing and completed:
            duration = round((finish - t0 - 15_000) / _MS, 3)  # includes waiting for peers
        return started_ns, completed_ns, duration

    def _pg_ids(self, rank: int, count: int) -> list[int]:
        """The pg_ids of the rank's `count` groups, in the order it made them. With unnamed
        groups (`pg_order="unnamed"`) it made two more after the default group, and on an
        odd pipeline stage one more after its TP group: they take ids but no dump names
        them, and as they run no op they have no pg_status row (the real NVRx dumps show
        such ids, more on one pipeline stage than on the other)."""
        if not self.unnamed:
            return list(range(count))
        ids, next_id = [0], 3
        for position in range(1, count):
            ids.append(next_id)
            next_id += 2 if position == 1 and self.world.coords(rank)[1] % 2 else 1
        return ids

    def __call__(self, rank: int, fresh: bool = False) -> dict:
        """The rank's dump; `fresh` gives every entry its own containers (see `_unshared`)."""
        world, run = self.world, self.run
        ops, issued = run.progs[rank], run.issued[rank]
        # The op the rank is blocked in: the simulation's, or where its GPU stopped (gpu_error).
        front = issued if rank in self.dumped_late else min(run.done[rank], self.stalled.get(rank, len(ops)))
        t_issue = run.t_issue[rank]
        my_groups = world.groups_of(rank, self.rotated)
        pg_of = {g.idx: pg for pg, g in zip(self._pg_ids(rank, len(my_groups)), my_groups)}
        npg = max(pg_of.values()) + 1
        coll, p2p, op_id = [0] * npg, [0] * npg, [0] * npg
        # pg_status: last enqueued / started / completed sequence number per group.
        last_enq, last_started, last_done, used = [-1] * npg, [-1] * npg, [-1] * npg, [False] * npg
        by_work = self.pg_status_mode == "work"
        marker_batches = self.coalesced_events == "marker"
        timing, offset, tid = self.timing, self.offset[rank], self.thread_id[rank]

        total = sum(len(ops[i].parts) for i in range(issued))
        first_kept = max(0, total - self.buffer_size)  # the ring buffer keeps the newest entries
        entries: list = []
        record_id = 0
        for i in range(issued):
            op = ops[i]
            pg = pg_of[op.group.idx]
            used[pg] = True
            is_p2p = op.kind != _COLL
            if is_p2p:
                p2p[pg] += 1
            else:
                coll[pg] += 1
            # Completed ops, then the one the rank is blocked in (started only if timed), then
            # those enqueued behind it.
            completed = i < front
            state = "completed" if completed else "started" if i == front and timing else "scheduled"
            # torch keeps the seq of the last Work: the p2p seq for P2P work ("work"), or
            # (the historical synth) collectives only.
            if by_work or not is_p2p:
                seq = p2p[pg] if is_p2p else coll[pg]
                last_enq[pg] = seq
                if state != "scheduled":
                    last_started[pg] = seq
                    if completed:
                        last_done[pg] = seq
            if record_id + len(op.parts) <= first_kept:  # entirely before the buffer's horizon
                op_id[pg] += sum(1 for part in op.parts if not part.marker)
                record_id += len(op.parts)
                continue
            t0 = t_issue[i] + offset
            started_ns, completed_ns, duration = self._times(rank, i, state, t0, offset)
            # A batch's own ops are recorded without events (they stay scheduled, unretired, and
            # are dumped even when only active ones are); its end marker holds the state.
            frozen = op.kind == _BATCH or (marker_batches and op.kind == _COLL and len(op.parts) > 1)
            for j, part in enumerate(op.parts):
                if not part.marker:
                    op_id[pg] += 1
                if record_id >= first_kept and not (self.only_active and completed and (part.marker or not frozen)):
                    progress: tuple[Any, Any, Any, Any, Any] = ((None, "scheduled", None, None, False) if frozen and not part.marker
                                else (duration, state, started_ns, completed_ns, completed))
                    entries.append(self._entry(part, fresh, record_id, pg, op.group.pg_tuple, tid, coll[pg],
                                               p2p[pg], op_id[pg], t0 + j * 6_000, *progress,
                                               is_p2p and not part.marker, self.timeout_ms))
                record_id += 1

        # Keyed by pg_id; only groups that did something; -1 for none; started needs timing.
        pg_status = {str(pg): {"last_enqueued_collective": last_enq[pg],
                               "last_started_collective": last_started[pg] if timing else -1,
                               "last_completed_collective": last_done[pg]}
                     for pg in range(npg) if used[pg]}
        pg_config = {g.name: dict(self._cfg[g.idx]) for g in sorted(my_groups, key=lambda g: g.name)}
        return {"version": self.version, "pg_config": pg_config, "comm_lib_version": COMM_LIB_VERSION,
                "pg_status": pg_status, "entries": entries}

    @staticmethod
    def _entry(part: _Part, fresh: bool, record_id, pg, pg_tuple, tid, seq, p2p_seq, op_id, created,
               duration, state, started_ns, completed_ns, retired, is_p2p, timeout_ms=TIMEOUT_MS) -> dict:
        frames, ins, in_dtypes, outs, out_dtypes = (part.frames, part.input_sizes, part.input_dtypes,
                                                    part.output_sizes, part.output_dtypes)
        if fresh:  # containers of its own, as torch writes them (see `_unshared`)
            frames = None if frames is None else frames[:]
            ins, outs = [shape[:] for shape in ins], [shape[:] for shape in outs]
            in_dtypes, out_dtypes, pg_tuple = in_dtypes[:], out_dtypes[:], (pg_tuple[0], pg_tuple[1])
        # Key order follows what torch writes; duration_ms only exists once timed and completed.
        if duration is None:
            entry = {"frames": frames, "record_id": record_id, "pg_id": pg, "process_group": pg_tuple,
                     "thread_name": THREAD_NAME, "thread_id": tid, "collective_seq_id": seq,
                     "p2p_seq_id": p2p_seq, "op_id": op_id, "profiling_name": part.profiling_name,
                     "time_created_ns": created, "input_sizes": ins, "input_dtypes": in_dtypes,
                     "output_sizes": outs, "output_dtypes": out_dtypes, "state": state,
                     "time_discovered_started_ns": started_ns, "time_discovered_completed_ns": completed_ns,
                     "retired": retired, "timeout_ms": timeout_ms, "is_p2p": is_p2p}
        else:
            entry = {"frames": frames, "record_id": record_id, "pg_id": pg, "process_group": pg_tuple,
                     "thread_name": THREAD_NAME, "thread_id": tid, "collective_seq_id": seq,
                     "p2p_seq_id": p2p_seq, "op_id": op_id, "profiling_name": part.profiling_name,
                     "time_created_ns": created, "duration_ms": duration, "input_sizes": ins,
                     "input_dtypes": in_dtypes, "output_sizes": outs, "output_dtypes": out_dtypes,
                     "state": state, "time_discovered_started_ns": started_ns,
                     "time_discovered_completed_ns": completed_ns, "retired": retired,
                     "timeout_ms": timeout_ms, "is_p2p": is_p2p}
        if frames is None:
            del entry["frames"]  # stacks turned off: the key is absent, as in torch
        return entry


# --------------------------------------------------------------------------- truth


def _group_truth(group: Optional[_Group]) -> Optional[dict]:
    if group is None:
        return None
    return {"name": group.name, "desc": group.desc, "ranks": list(group.ranks)}


def _truth(world: _World, run: _Run, fault: Optional[Fault], info: _Injected, params: dict) -> dict:
    blocked = sorted({r for r in range(world.world) if run.done[r] < len(run.progs[r])} | set(info.stalled))
    truth: dict[str, Any] = {
        "status": "healthy", "fault_kind": None, "suspect_ranks": [], "missing_dumps": [],
        "group": None, "collective_seq_id": None, "p2p_seq_id": None, "op": None,
        "description": "healthy job: every rank completed every operation",
        "tie": False, "blocked_ranks": blocked, "fault": asdict(fault) if fault else None,
        "layout": {"world_size": world.world, "tp": world.tp, "pp": world.pp, "dp": world.dp},
        "params": params,
    }
    if fault is None:
        return truth
    kind, rank = fault.kind, fault.rank
    group = info.group
    gtext = f"group {group.name} ({group.desc}, ranks {_fold(group.ranks)})" if group else ""
    if group and len(gtext) > 80:
        gtext = f"group {group.name} ({group.desc}, {len(group.ranks)} ranks)"
    truth.update(status="faults", fault_kind=_DIAGNOSIS[kind], suspect_ranks=[rank],
                 group=_group_truth(group), collective_seq_id=info.seq, op=info.op, tie=info.tie)
    if info.delete_dump:
        truth["missing_dumps"] = [rank]
    if kind == "missing_dump":
        truth.update(status="inconclusive", suspect_ranks=[],
                     description=f"rank {rank}'s dump is missing; the job was otherwise healthy")
    elif kind == "straggler":
        # A slow rank is a warning on a healthy job, never a FAULT on its own.
        truth.update(status="healthy", suspect_ranks=[], warned_ranks=[rank], lateness_ms=fault.straggler_ms,
                     description=f"healthy job, but rank {rank} issues every operation "
                                 f"{fault.straggler_ms:g} ms late")
    elif kind == "hang" and len(fault.culprits()) > 1:
        culprits = list(fault.culprits())
        where = (f"wherever each was in its program at the moment rank {fault.rank} reached {info.op} "
                 f"#{info.seq} in {gtext}; their peers wait in what they did not issue" if fault.at_once else
                 f"each at the step's {fault.group} collective of its own group (the first: {info.op} "
                 f"#{info.seq} in {gtext}); their peers wait in those")
        truth.update(suspect_ranks=culprits, description=f"ranks {_fold(culprits)} stopped issuing at once, {where}")
    elif kind in ("hang", "missing_dump_hang"):
        gone = " and its dump is missing" if info.delete_dump else ""
        truth["description"] = (f"rank {rank} never issued {info.op} #{info.seq} (collective_seq_id "
                                f"{info.seq}) in {gtext}; its peers wait in it{gone}")
    elif kind == "skip_op":
        truth["description"] = (f"rank {rank} skipped {info.op} #{info.seq} in {gtext} and went on; "
                                f"its peers wait in it")
    elif kind == "stuck":
        assert group is not None  # a stuck op is in a group
        truth.update(suspect_ranks=list(group.ranks),
                     description=f"every member of {gtext} issued {info.op} #{info.seq} and none "
                                 f"completed it (network/GPU/NCCL)")
    elif kind == "in_flight":
        assert group is not None
        truth.update(status="inconclusive", suspect_ranks=[], collective_seq_id=info.seq,
                     description=f"a healthy job dumped while every {group.desc} group was in {info.op} "
                                 f"#{info.seq}: every member issued it, none had completed it yet")
    elif kind == "extra_op":
        truth["description"] = (f"rank {rank} issued an extra {info.op} (collective_seq_id {info.seq}) "
                                f"in {gtext} that its peers never issued")
    elif kind.endswith("_mismatch"):
        what = kind[: -len("_mismatch")]
        truth["description"] = (f"at collective_seq_id {info.seq} in {gtext} the peers issued {info.op} and "
                                f"rank {rank} the same collective with another {what}"
                                + ("; with two members consensus cannot tell who is odd" if info.tie else ""))
    elif kind == "gpu_error":
        culprits = sorted(info.stalled)
        where = f"{info.op} #{info.seq} in {gtext}" if info.seq else f"{info.op} in {gtext}"
        truth.update(suspect_ranks=culprits,
                     description=f"the GPU of rank(s) {_fold(culprits)} stopped completing work "
                                 + (f"at one moment in step {fault.step} (rank {fault.rank}'s from {where})"
                                    if fault.at_once else f"from step {fault.step} on (from {where})")
                                 + ": their ops stay pending, their hosts enqueued a few more, and their peers "
                                   "wait in the next op that needs them")
    elif kind == "skip_ring_step":
        truth["description"] = (f"rank {rank} skipped ring step {fault.ring_step} of its first forward attention "
                                f"layer (its send and its recv) in {gtext} and went on: it is one ring step short "
                                "of its neighbours")
    elif kind == "p2p_unmatched":
        peer = info.p2p_peer
        # The peer is blocked in the recv that waits for the missing send: its p2p_seq_id is the
        # one visible in the dumps.
        ops = run.progs[peer]
        at = run.done[peer]
        waits_for = (lambda op: op.kind == _RECV and op.peer == rank
                     or op.kind == _BATCH and (_RECV, rank) in {sub[:2] for sub in op.subs})
        if at >= len(ops) or not waits_for(ops[at]):
            raise RuntimeError("p2p_unmatched: the peer is not waiting in the recv (internal error)")
        seq = sum(1 for op in ops[: at + 1] if op.kind != _COLL and op.group is group)
        truth.update(p2p_seq_id=seq, p2p_peer=peer, collective_seq_id=None,
                     description=f"rank {rank} never posted its send to rank {peer} in {gtext}; rank {peer} "
                                 f"waits in recv (its p2p_seq_id {seq})")
    return truth


def _fold(ranks) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, ranks = [], sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


# --------------------------------------------------------------------------- API


def generate(world_size: int = 8, tp: int = 2, pp: int = 2, steps: int = 3, *, fault: Optional[Fault] = None,
             timing: bool = False, with_frames: bool = True, buffer_size: int = 2000, lookahead: int = 0,
             seed: int = 0, version: str = "2.10", p2p: str = "plain", coalesced_events: str = "batch",
             watchdog_ms: Optional[float] = None, bubble_ms: float = 0.0, pg_status: str = "collectives",
             only_active: bool = False, timeout_ms: int = TIMEOUT_MS, pg_order: str = "same",
             hashed_names: bool = False, ring: bool = False, vchunks: int = 1) -> SynthJob:
    """Simulate a TP x PP x DP training job (with an optional fault) and return its FR dumps.

    The keyword options after `version` make the dumps follow what PyTorch really records (see
    "Faithful options" in the module doc); each defaults to the historical synth behaviour.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    if buffer_size < 0 or lookahead < 0:
        raise ValueError("buffer_size and lookahead must not be negative")
    if coalesced_events not in COALESCED_EVENTS:
        raise ValueError(f"unknown coalesced_events {coalesced_events!r}; expected one of {COALESCED_EVENTS}")
    if pg_status not in PG_STATUS_MODES:
        raise ValueError(f"unknown pg_status {pg_status!r}; expected one of {PG_STATUS_MODES}")
    if watchdog_ms is not None and watchdog_ms <= 0:
        raise ValueError("watchdog_ms must be positive (or None)")
    if timeout_ms < 1:
        raise ValueError("timeout_ms must be positive")
    if pg_order not in PG_ORDERS:
        raise ValueError(f"unknown pg_order {pg_order!r}; expected one of {PG_ORDERS}")
    world = _World(world_size, tp, pp, with_frames, p2p=p2p, bubble_ms=bubble_ms, hashed_names=hashed_names,
                   ring=ring, vchunks=vchunks)
    rng = random.Random(seed)
    culprits = fault.culprits() if fault is not None else ()
    progs, starts = [], {}
    for r in range(world_size):
        ops, step_starts = world.program(r, steps)
        progs.append(ops)
        if r in culprits:
            starts[r] = step_starts  # only the culprits' step boundaries are needed
    healthy = None
    if fault is not None and fault.at_once:
        probe = random.Random()
        probe.setstate(rng.getstate())  # the same draws as the run below: the same times up to the fault
        with cyclic_gc_paused():
            healthy = _simulate(world, [list(p) for p in progs], frozenset(), -1, 0, lookahead, probe)
    info = _inject(world, progs, starts, fault, steps, healthy) if fault is not None else _Injected()
    straggler_ns = int(fault.straggler_ms * _MS) if fault is not None and fault.kind == "straggler" else 0
    with cyclic_gc_paused():
        run = _simulate(world, progs, info.poisoned, info.straggler, straggler_ns, lookahead, rng,
                        fault.straggler_share if fault is not None else 1.0)
    builder = _DumpBuilder(world, run, timing=timing, buffer_size=buffer_size, version=version, rng=rng,
                           coalesced_events=coalesced_events, watchdog_ms=watchdog_ms, pg_status=pg_status,
                           only_active=only_active, stalled=info.stalled, seed=seed, timeout_ms=timeout_ms,
                           pg_order=pg_order, dumped_late=fault.dumped_late if fault is not None else ())
    present = [r for r in range(world_size) if not (info.delete_dump and fault is not None and r == fault.rank)]
    params = {"steps": steps, "timing": timing, "with_frames": with_frames, "buffer_size": buffer_size,
              "lookahead": lookahead, "seed": seed, "version": version, "p2p": p2p,
              "coalesced_events": coalesced_events, "watchdog_ms": watchdog_ms, "bubble_ms": bubble_ms,
              "pg_status": pg_status, "only_active": only_active, "timeout_ms": timeout_ms,
              "pg_order": pg_order, "hashed_names": hashed_names, "ring": ring, "vchunks": vchunks}
    truth = _truth(world, run, fault, info, params)
    if info.poisoned:
        _judge_by_age(truth, world, run, builder, info.poisoned, timeout_ms)
    return SynthJob(RankDumps(builder, present), truth)


def _judge_by_age(truth: dict, world: _World, run: _Run, builder: "_DumpBuilder", poisoned: frozenset,
                  timeout_ms: int) -> None:
    """Collectives every member is in and none completed (stuck, in_flight) are a hang only
    when the dumps show they outlived their timeout: some member's dump holds a time (an op
    created, or seen started or completed) at least `timeout_ms` after it created the op, on
    its own clock. Else a job dumped mid-op looks the same: the truth is inconclusive. (A
    poisoned collective that members only queued behind another op is in flight nowhere.)"""
    hung, oldest = [], 0
    for group_idx, seq in sorted(poisoned):
        group = world.groups[group_idx]
        if not all(_blocked_in(run, rank, group, seq) for rank in group.ranks):
            continue
        age = 0
        for rank in group.ranks:
            entries = builder(rank)["entries"]
            created = [e["time_created_ns"] for e in entries
                       if e["process_group"][0] == group.name and e["collective_seq_id"] == seq and not e["is_p2p"]]
            newest = max((t or 0 for e in entries for t in (e["time_created_ns"], e["time_discovered_started_ns"],
                                                             e["time_discovered_completed_ns"])), default=0)
            if created:
                age = max(age, newest - min(created))
        oldest = max(oldest, age)
        if age >= timeout_ms * _MS:
            hung += group.ranks
    truth["age_ms_at_least"] = round(oldest / _MS, 3)
    if hung:
        truth.update(status="faults", fault_kind="stuck", suspect_ranks=sorted(hung))
    else:
        truth.update(status="inconclusive", fault_kind="in_flight", suspect_ranks=[],
                     description=truth["description"] + f"; the dumps show it ran {oldest / _MS:.3f} ms at least, "
                                 f"short of its {timeout_ms} ms timeout, so they cannot tell a hang from a job "
                                 "dumped mid-op")


def _json_dump(dump: dict) -> dict:
    """What `_dump_nccl_trace_json` writes for the same state (see corpus README)."""
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["pg_status"] = {pg: {k: str(v) for k, v in status.items()}
                        for pg, status in dump.get("pg_status", {}).items()}
    out.setdefault("nccl_comm_state", {})
    entries = []
    for e in dump.get("entries") or ():
        e = dict(e)
        e.pop("frames", None)
        if e.get("time_discovered_started_ns") is None:
            e["time_discovered_started_ns"] = 0
        if e.get("time_discovered_completed_ns") is None:
            e["time_discovered_completed_ns"] = 0
        entries.append(e)  # process_group, a tuple, is written as a JSON list
    if entries:
        out["entries"] = entries
    return out


def _fresh(value):
    """A copy of plain data in which no container is shared (strings and numbers are kept)."""
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fresh(v) for v in value]
    if isinstance(value, tuple):
        return tuple([_fresh(v) for v in value])
    return value


def _unshared(dump: dict) -> dict:
    """The dump laid out as torch pickles it.

    In memory, entries share their sizes, dtypes and frames; Python's pickler would then write
    each shared list once and refer back to it. torch's C++ pickler memoizes strings by value
    and keeps one dict per distinct stack frame, which every entry's `frames` list refers to,
    but writes every other list and dict out in full. Benchmarks must see the real thing.
    (`_DumpBuilder(..., fresh=True)` does the same faster.)
    """
    out = {key: _fresh(value) for key, value in dump.items() if key != "entries"}
    if "entries" in dump:
        out["entries"] = [_fresh_entry(entry) for entry in dump["entries"]]
    return out


def _fresh_entry(entry):
    if not isinstance(entry, dict):
        return _fresh(entry)
    fresh = {key: _fresh(value) for key, value in entry.items()}
    frames = entry.get("frames")
    if isinstance(frames, list):
        fresh["frames"] = frames[:]  # a new list of the same frame dicts, as torch writes them
    return fresh


def _encode(dump: dict, fmt: str) -> bytes:
    if fmt == "pickle":
        return pickle.dumps(dump, protocol=2)
    if fmt == "json":
        return json.dumps(_json_dump(dump), sort_keys=True, separators=(",", ":")).encode()
    raise ValueError(f"unknown format {fmt!r}; expected 'pickle' or 'json'")


def encode_dump(dump: dict, fmt: str = "pickle") -> bytes:
    """The bytes of one dump file: pickle protocol 2 laid out as torch writes it, or compact
    JSON with sorted keys."""
    return _encode(_unshared(dump) if fmt == "pickle" else dump, fmt)


def _write_files(get_dump: Callable[[int], dict], todo: list, fmt: str, compress: bool = False) -> None:
    for rank, path in todo:
        data = _encode(get_dump(rank), fmt)
        # Level 1: the default group of a 100,000-rank job lists every rank in each file
        # (690 KB of digits), which this takes to about 220 KB in a few milliseconds.
        path.write_bytes(gzip.compress(data, 1, mtime=0) if compress else data)


def _write_forked(get_dump: Callable[[int], dict], todo: list, fmt: str, workers: int, compress: bool = False) -> None:
    """Split the files over `workers` processes; forked children see the simulation for free."""
    children = []
    for w in range(1, workers):
        pid = os.fork()
        if pid == 0:  # child: write its share, then leave without running the parent's cleanup
            code = 0
            try:
                _write_files(get_dump, todo[w::workers], fmt, compress)
            except BaseException:  # noqa: BLE001 - report anything, the parent raises
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    failed = False
    try:
        _write_files(get_dump, todo[0::workers], fmt, compress)
    finally:
        for pid in children:
            _, status = os.waitpid(pid, 0)
            failed |= status != 0
    if failed:
        raise RuntimeError("a worker process failed to write its dump files (see its traceback above)")


def write_job(job: SynthJob, directory, *, fmt: str = "pickle", prefix: str = "nccl_trace_rank_",
              suffix: str = "", workers: int = 1, compress: bool = False) -> list:
    """Write one file per rank with a dump, `<prefix><rank><suffix>`; returns the paths by rank.
    `compress` gzips each file (frtrace inflates them, within its limits).

    The truth is not written: the caller decides where it goes. `workers` > 1 forks that many
    processes (POSIX only) for large jobs.
    """
    if fmt not in ("pickle", "json"):
        raise ValueError(f"unknown format {fmt!r}; expected 'pickle' or 'json'")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dumps = job.dumps
    if isinstance(dumps, RankDumps):
        get_dump = dumps.for_file  # stream: build, write, forget
    else:
        def get_dump(rank: int) -> dict:
            return _unshared(dumps[rank])
    todo = [(rank, directory / f"{prefix}{rank}{suffix}") for rank in sorted(dumps)]
    with cyclic_gc_paused():
        if workers > 1 and hasattr(os, "fork") and len(todo) >= 2 * workers:
            _write_forked(get_dump, todo, fmt, workers, compress)
        else:
            _write_files(get_dump, todo, fmt, compress)
    return [path for _, path in todo]


def steps_for_entries(world_size: int, tp: int, pp: int, entries_per_rank: int) -> int:
    """Number of steps that gives the busiest rank about `entries_per_rank` entries."""
    world = _World(world_size, tp, pp, with_frames=False)
    per_rank = []
    for stage in range(pp):
        rank = stage * tp  # dp 0, tp 0 of each stage: stages differ, tp/dp ranks do not
        pro = sum(len(op.parts) for op in world.prologue(rank))
        two = sum(len(op.parts) for v in (0, 1) for op in world.step_ops(rank, v))
        per_rank.append((pro, two / 2))
    pro, per_step = max(per_rank, key=lambda x: x[1])
    return max(1, round((entries_per_rank - pro) / per_step))


# --------------------------------------------------------------------------- CUPTI comms monitor

WRITERS = ("c10d", "cupti")
CUPTI_CLOCKS = ("native", "unix")
CUPTI_PREFIX = "comm_lib_trace_rank_"  # FlightRecorderPlugin.write_dump's default file name
# c10d's op names -> what the monitor's FlightRecorderPlugin names the NCCL function behind them
# (its _FR_OP_NAMES): NCCL counts each function separately, and so does the monitor's seq.
_CUPTI_OPS = {
    "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce_barrier": "all_reduce",
    "barrier": "all_reduce", "broadcast": "broadcast", "_broadcast_oop": "broadcast", "reduce": "reduce",
    "_reduce_oop": "reduce", "all_gather": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all", "gather": "gather", "scatter": "scatter",
}
# The comms hook writes str(tensor.dtype).
_TORCH_DTYPES = {"Float": "torch.float32", "BFloat16": "torch.bfloat16", "Half": "torch.float16",
                 "Double": "torch.float64", "Long": "torch.int64", "Int": "torch.int32", "Byte": "torch.uint8",
                 "Bool": "torch.bool"}


def cupti_monitor_job(job: SynthJob, *, clock: str = "native", max_entries: int = 2000, seed: int = 0) -> SynthJob:
    """The same job as the CUPTI comms monitor would have dumped it
    (`torch.profiler._cupti.comms.FlightRecorderPlugin` fed by `CommMonitorHook`): the truth
    is unchanged. Build `job` with a buffer that holds every rank's whole history (no wrap)
    and preferably `timing=True`: the monitor numbers each (group, NCCL function) from 0 over
    everything the rank issued, then keeps its newest `max_entries`.

    What it writes, from the plugin's source: one entry per collective (no coalesced markers;
    a batch's ops each count for their function); `process_group` a list and
    `process_group_ranks` the group's global ranks; `pg_id` 0, `p2p_seq_id` 0, `timeout_ms`
    0, no thread fields, `frames` []; `record_id` and `op_id` the collective's
    external-correlation id (increasing, with gaps); dtypes as `torch.float32`. Finished
    collectives are `completed` with their kernel's start and end; the rest `scheduled`, with
    `time_created_ns` 0 and no times (no start events wired). Sends and receives: `is_p2p`,
    `nccl:unknown` (NCCL's profiler plugin does not describe them), no sequence number.
    `clock`: "native" puts times on CUPTI's own clock, which each host (8 ranks) counts from
    its own origin; "unix" as with the plugin's clock converter. `pg_status` holds "0" only:
    the largest number enqueued, and completed, over every group."""
    if clock not in CUPTI_CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; expected one of {CUPTI_CLOCKS}")
    rng = random.Random(f"cupti-{seed}")
    hosts = 1 + max(job.dumps, default=0) // 8
    # Each host's CUPTI origin: its boot, some days before the job, an hour or so apart.
    origin = [EPOCH_NS - (3 * 86_400 + host * 3_600 + rng.randrange(0, 600)) * 10**9 for host in range(hosts)]
    dumps = {}
    for rank in sorted(job.dumps):
        shift = origin[rank // 8] if clock == "native" else 0
        dumps[rank] = _cupti_dump(job.dumps[rank], rank, shift, max_entries, rng)
    return SynthJob(dumps, job.truth)


def _cupti_dump(dump: dict, rank: int, shift: int, max_entries: int, rng: random.Random) -> dict:
    ranks_of = {name: json.loads(cfg["ranks"]) for name, cfg in dump["pg_config"].items()}
    counters: dict = {}
    entries = []
    last_enqueued = last_completed = -1
    coll_id = 1_000 + rng.randrange(0, 1_000)
    history = dump.get("entries") or []
    if history and history[0]["record_id"] != 0:
        raise ValueError("cupti_monitor_job needs every rank's whole history: generate with a larger buffer_size")
    for e in history:
        backend_op = e["profiling_name"].partition(":")[2].split(" ", 1)[0]
        if backend_op == "coalesced" or (backend_op.endswith("_coalesced") and backend_op[:-10].isupper()):
            continue  # the monitor records the batch's ops, never a marker
        coll_id += 1 + rng.randrange(0, 4)  # other pushed correlation ids fall in between
        name, desc = e["process_group"]
        is_p2p = bool(e["is_p2p"])
        seq = 0
        if not is_p2p:
            func = _CUPTI_OPS.get(backend_op, backend_op)
            seq = counters.get((name, func), 0)
            counters[(name, func)] = seq + 1
            last_enqueued = max(last_enqueued, seq)
        done = e["state"] == "completed"
        start = end = None
        if done:
            last_completed = max(last_completed, seq) if not is_p2p else last_completed
            kernel_start = e.get("time_discovered_started_ns") or e["time_created_ns"] + 15_000
            kernel_end = max(kernel_start + 20_000, e.get("time_discovered_completed_ns") or kernel_start + 200_000)
            start, end = kernel_start - shift, kernel_end - shift
        entries.append({
            "record_id": coll_id, "pg_id": 0, "process_group": [name, desc], "process_group_ranks": list(ranks_of[name]),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": coll_id,
            "profiling_name": "nccl:unknown" if is_p2p else f"nccl:{_CUPTI_OPS.get(backend_op, backend_op)}",
            "time_created_ns": start if done else 0,
            "input_sizes": [list(x) for x in e["input_sizes"]], "output_sizes": [list(x) for x in e["output_sizes"]],
            "input_dtypes": [_TORCH_DTYPES.get(d, d) for d in e["input_dtypes"]],
            "output_dtypes": [_TORCH_DTYPES.get(d, d) for d in e["output_dtypes"]],
            "state": "completed" if done else "scheduled",
            "time_discovered_started_ns": start, "time_discovered_completed_ns": end,
            "duration_ms": (end - start) / 1e6 if end is not None and start is not None else None,
            "retired": done, "timeout_ms": 0,
            "is_p2p": is_p2p, "frames": [],
        })
    kept = entries[-max_entries:] if max_entries else entries
    config: dict = {}
    for e in kept:
        name, desc = e["process_group"]
        config.setdefault(name, {"name": name, "desc": desc, "ranks": repr(e["process_group_ranks"])})
    return {"version": "2.10", "comm_lib_version": "", "pg_config": config or {"0": {"name": "0", "desc": "", "ranks": "[]"}},
            "pg_status": {"0": {"last_enqueued_collective": last_enqueued, "last_started_collective": last_completed,
                                "last_completed_collective": last_completed}},
            "entries": kept}


def write_cupti_job(job: SynthJob, directory, *, fmt: str = "pickle", prefix: str = CUPTI_PREFIX) -> list:
    """Write a `cupti_monitor_job` the way the plugin does: `write_dump` pickles with Python's
    default protocol, `dump_json` is `json.dumps` of the same dict. Returns the paths."""
    if fmt not in ("pickle", "json"):
        raise ValueError(f"unknown format {fmt!r}; expected 'pickle' or 'json'")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in sorted(job.dumps):
        path = directory / f"{prefix}{rank}"
        dump = job.dumps[rank]
        path.write_bytes(pickle.dumps(dump) if fmt == "pickle" else json.dumps(dump).encode())
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- CLI


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frtrace.testing.synth",
        description="Write synthetic NCCL Flight Recorder dumps (one file per rank) plus a truth file.",
        epilog="example: python -m frtrace.testing.synth /tmp/fr/hang --world-size 64 --tp 4 --pp 2 "
               "--fault hang --fault-rank 5 --fault-group tp --timing")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--entries-per-rank", type=int, help="pick --steps so ranks have about N entries")
    parser.add_argument("--fault", choices=FAULT_KINDS)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-group", choices=GROUP_KINDS, help="default: pp for p2p_unmatched, else tp")
    parser.add_argument("--fault-step", type=int, default=1)
    parser.add_argument("--straggler-ms", type=float, default=50.0)
    parser.add_argument("--straggler-share", type=float, default=1.0,
                        help="straggler: the share of its ops it is late at (default: every op)")
    parser.add_argument("--timing", action="store_true", help="as with TORCH_NCCL_ENABLE_TIMING=1")
    parser.add_argument("--no-frames", action="store_true", help="dumps without stack traces")
    parser.add_argument("--buffer-size", type=int, default=2000)
    parser.add_argument("--lookahead", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", default="2.10")
    parser.add_argument("--fault-ranks", type=int, nargs="+", help="several culprits (gpu_error, hang)")
    parser.add_argument("--at-once", action="store_true",
                        help="with --fault-ranks: all stop at the moment --fault-rank does, wherever each is")
    parser.add_argument("--p2p", choices=P2P_MODES, default="plain", help="batch_isend_irecv pipeline ops")
    parser.add_argument("--coalesced-events", choices=COALESCED_EVENTS, default="batch")
    parser.add_argument("--watchdog-ms", type=float, help="discovered times as watchdog polls of this period")
    parser.add_argument("--bubble-ms", type=float, default=0.0, help="receivers post recvs this much early")
    parser.add_argument("--pg-status", choices=PG_STATUS_MODES, default="collectives")
    parser.add_argument("--only-active", action="store_true", help="drop completed entries from the dumps")
    parser.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS, help="the process groups' timeout")
    parser.add_argument("--ring", action="store_true", help="context-parallel ring attention instead of a pipeline")
    parser.add_argument("--vchunks", type=int, default=1, help="model chunks per stage (interleaved pipeline)")
    parser.add_argument("--pg-order", choices=PG_ORDERS, default="same", help="rotated: each rank its own pg_ids; unnamed: ids taken by groups no dump names")
    parser.add_argument("--hashed-names", action="store_true", help="name groups by a hash of their ranks")
    parser.add_argument("--ring-step", type=int, default=-1, help="skip_ring_step: which ring step")
    parser.add_argument("--last-op", action="store_true", help="hang/mismatch at the step's last collective")
    parser.add_argument("--json", action="store_true", help="write JSON dumps instead of pickles")
    parser.add_argument("--writer", choices=WRITERS, default="c10d",
                        help="cupti: as PyTorch's CUPTI comms monitor writes them (--buffer-size is its max_entries)")
    parser.add_argument("--cupti-clock", choices=CUPTI_CLOCKS, default="native",
                        help="with --writer cupti: CUPTI's native clock, or Unix times (a clock converter given)")
    parser.add_argument("--prefix", help=f"default: nccl_trace_rank_ (c10d), {CUPTI_PREFIX} (cupti)")
    parser.add_argument("--suffix", default="")
    parser.add_argument("--gzip", action="store_true", help="gzip each file (a 100,000-rank job's default group "
                        "lists every rank in every file)")
    parser.add_argument("--truth", type=Path, help="default: OUTDIR/../<OUTDIR name>.truth.json")
    parser.add_argument("--workers", type=int, default=1, help="processes writing files (POSIX)")
    args = parser.parse_args(argv)

    steps = args.steps
    if args.entries_per_rank:
        steps = steps_for_entries(args.world_size, args.tp, args.pp, args.entries_per_rank)
    fault = None
    if args.fault:
        group = args.fault_group or ("pp" if args.fault == "p2p_unmatched" else "tp")
        if args.fault == "skip_ring_step":
            group = args.fault_group or "cp"
        fault = Fault(args.fault, rank=args.fault_rank, group=group, step=args.fault_step,
                      straggler_ms=args.straggler_ms, straggler_share=args.straggler_share,
                      ranks=tuple(args.fault_ranks or ()), ring_step=args.ring_step,
                      last_op=args.last_op, at_once=args.at_once)
    started = time.perf_counter()
    try:
        cupti = args.writer == "cupti"  # the monitor numbers over the whole history, then keeps its newest
        job = generate(args.world_size, args.tp, args.pp, steps, fault=fault, timing=args.timing,
                       with_frames=not args.no_frames, buffer_size=10**9 if cupti else args.buffer_size,
                       lookahead=args.lookahead, seed=args.seed, version=args.version, p2p=args.p2p,
                       coalesced_events=args.coalesced_events, watchdog_ms=args.watchdog_ms,
                       bubble_ms=args.bubble_ms, pg_status=args.pg_status, only_active=args.only_active,
                       timeout_ms=args.timeout_ms, pg_order=args.pg_order, hashed_names=args.hashed_names,
                       ring=args.ring, vchunks=args.vchunks)
        if cupti:
            job = cupti_monitor_job(job, clock=args.cupti_clock, max_entries=args.buffer_size, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    simulated = time.perf_counter()
    fmt = "json" if args.json else "pickle"
    if cupti:
        paths = write_cupti_job(job, args.outdir, fmt=fmt, prefix=args.prefix or CUPTI_PREFIX)
    else:
        paths = write_job(job, args.outdir, fmt=fmt, prefix=args.prefix or "nccl_trace_rank_", suffix=args.suffix,
                          workers=args.workers, compress=args.gzip)
    written = time.perf_counter()
    outdir = args.outdir.resolve()
    truth_path = args.truth or outdir.parent / f"{outdir.name}.truth.json"
    truth_path.parent.mkdir(parents=True, exist_ok=True)
    truth_path.write_text(json.dumps(job.truth, indent=1, sort_keys=True) + "\n")
    size = sum(os.path.getsize(p) for p in paths)
    print(f"{len(paths)} dumps ({size / 1e6:.1f} MB, {steps} steps) in {args.outdir}, truth in {truth_path}; "
          f"simulated in {simulated - started:.1f} s, written in {written - simulated:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
