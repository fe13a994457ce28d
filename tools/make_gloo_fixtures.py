#!/usr/bin/env python3
"""Generate real gloo Flight Recorder dumps as test fixtures for frtrace.

DEV TOOL ONLY. frtrace itself never needs torch; this script does, so run it from a
throw-away virtualenv outside the repository (the pin picks the local CPU wheel):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0
    /tmp/torchvenv/bin/python tools/make_gloo_fixtures.py               # all scenarios
    /tmp/torchvenv/bin/python tools/make_gloo_fixtures.py --only size_mismatch
    /tmp/torchvenv/bin/python tools/make_gloo_fixtures.py --examples examples
    python3 tools/make_gloo_fixtures.py --check                        # no torch needed

Each scenario is a small function run by `world_size` real processes (this same file,
re-executed with --worker) on the gloo backend over a file:// rendezvous. Every rank writes
`_dump_fr_trace()` (pickle) and, right after, `_dump_fr_trace_json()`. The launcher then
publishes them as

    <out>/<scenario>/rank_<r>        pickle, stack-frame file names made neutral
    <out>/<scenario>_json/rank_<r>   JSON, byte-for-byte as torch wrote it
    <out>/truth/<scenario>.json      what really happened (group names taken from the job)
    <out>/README.md                  table of scenarios

and checks every truth file against the published dumps (also available alone: --check).
Scenarios run one after another; the whole run takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Callable

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy
try:
    import torch
    import torch.distributed as dist
except ImportError:  # --check only reads fixtures and works without torch
    torch = dist = None

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "gloo"

PG_TIMEOUT_S = 3  # short, so that a hang turns into a gloo timeout within seconds
GLOO_THREADS = 2  # worker threads of one ProcessGroupGloo (torch's default)
SCENARIO_DEADLINE_S = 120  # the launcher kills a scenario's processes after this long
WAIT_DEADLINE_S = 60  # how long a rank waits for its peers' files before giving up

# Neutral paths written into stack frames instead of this machine's paths.
NEUTRAL_SCRIPT = "/workspace/job/train.py"
NEUTRAL_STDLIB = "/opt/conda/lib/python3.11"
NEUTRAL_SITE = NEUTRAL_STDLIB + "/site-packages"


# --------------------------------------------------------------------------------------
# Scenario registry
# --------------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    world: int
    body: Callable
    description: str
    fault_kind: str | None = None  # None means healthy
    suspects: list = field(default_factory=list)
    group: str | None = None  # label of the root-cause group, resolved from the job
    seq: int | None = None
    buffer: int = 2000  # TORCH_FR_BUFFER_SIZE
    pickle_kwargs: dict = field(default_factory=dict)  # for _dump_fr_trace
    json_kwargs: dict = field(default_factory=dict)  # for _dump_fr_trace_json
    delete_dumps: list = field(default_factory=list)  # ranks whose files are removed
    consequences: list = field(default_factory=list)  # [(group label, seq, waiting ranks)]


SCENARIOS: dict[str, Scenario] = {}


def scenario(world, description, **kw):
    """Register the decorated function as the body of a scenario of the same name."""

    def register(fn):
        SCENARIOS[fn.__name__] = Scenario(fn.__name__, world, fn, description, **kw)
        return fn

    return register


# --------------------------------------------------------------------------------------
# Per-rank helpers (run inside the worker processes)
# --------------------------------------------------------------------------------------


class Ctx:
    """What a scenario body gets: its rank, its groups, and the dump/wait helpers.

    Ranks coordinate outside torch.distributed through marker files in the scenario's
    work directory, so that waiting for a peer never adds an entry to the Flight Recorder.
    """

    def __init__(self, sc: Scenario, rank: int, workdir: Path):
        self.sc = sc
        self.rank = rank
        self.world = sc.world
        self.workdir = workdir
        self.groups: dict[str, dict] = {}  # label -> {name, desc, ranks}, member groups only
        self.exception: str | None = None
        self.trigger: str | None = None  # why this rank dumped
        self.trigger_hint = "after_body"  # default trigger when the body did not fail

    # -- file-based signalling ---------------------------------------------------------

    def signal(self, what: str) -> None:
        (self.workdir / f"{what}_{self.rank}").touch()

    def wait_for(self, what: str, ranks=None) -> None:
        """Wait until every rank in `ranks` signalled `what`, or its process has exited."""
        ranks = range(self.world) if ranks is None else ranks
        deadline = time.time() + WAIT_DEADLINE_S
        while time.time() < deadline:
            if all((self.workdir / f"{what}_{r}").exists()
                   or (self.workdir / f"exited_{r}").exists() for r in ranks):
                return
            time.sleep(0.05)
        print(f"rank {self.rank}: gave up waiting for {what} of {list(ranks)}", file=sys.stderr)

    def others(self) -> list:
        return [r for r in range(self.world) if r != self.rank]

    def stall_until_peers_dumped(self) -> None:
        """Be the rank that 'never arrives': stay outside collectives until peers dumped."""
        self.wait_for("dumped", self.others())
        self.trigger_hint = "after_stall"

    # -- groups ------------------------------------------------------------------------

    def record_group(self, label: str, pg) -> None:
        self.groups[label] = {
            "name": pg.group_name,
            "desc": pg.group_desc,
            "ranks": dist.get_process_group_ranks(pg),
        }

    def new_group(self, label: str, ranks: list, local_sync: bool = False, **kw):
        """new_group with the short timeout; returns None on non-members.

        With use_local_synchronization only the members may call new_group, so the
        caller must skip it on the others (we do that here)."""
        if local_sync and self.rank not in ranks:
            return None
        kw.setdefault("timeout", timedelta(seconds=PG_TIMEOUT_S))
        pg = dist.new_group(ranks, use_local_synchronization=local_sync, **kw)
        if self.rank in ranks:
            self.record_group(label, pg)
            return pg
        return None

    # -- failures and dumps ------------------------------------------------------------

    @contextlib.contextmanager
    def expect_failure(self, must_fail: bool = True):
        """Swallow the gloo timeout/reset of a hung collective, like a watchdog would."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - any gloo error is the expected outcome
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.exception = f"{type(exc).__name__}: {first_line}"[:300]
        else:
            if must_fail:  # the scenario did not do what it claims: say so in the rank's log
                print(f"rank {self.rank}: expected a failure, the op succeeded", file=sys.stderr)

    def dump(self, trigger: str | None = None) -> None:
        """Write the pickle dump and, right after, the JSON twin; then tell the peers."""
        pickled = torch._C._distributed_c10d._dump_fr_trace(**self.sc.pickle_kwargs)
        as_json = torch._C._distributed_c10d._dump_fr_trace_json(**self.sc.json_kwargs)
        (self.workdir / "pickle").mkdir(exist_ok=True)
        (self.workdir / "json").mkdir(exist_ok=True)
        (self.workdir / "pickle" / f"rank_{self.rank}").write_bytes(pickled)
        (self.workdir / "json" / f"rank_{self.rank}").write_bytes(as_json)
        self.trigger = trigger or ("after_exception" if self.exception else self.trigger_hint)
        self.write_meta()
        self.signal("dumped")

    def write_meta(self) -> None:
        meta = {
            "rank": self.rank,
            "torch_version": torch.__version__,
            "groups": self.groups,
            "exception": self.exception,
            "dump_trigger": self.trigger,
        }
        (self.workdir / f"meta_{self.rank}.json").write_text(json.dumps(meta))

    def gated(self, late_rank: int, issue_faulty: Callable[[], list]) -> None:
        """Dump with a faulty collective in flight on every rank (see corpus README).

        A size mismatch makes the receiving gloo rank abort (SIGABRT) before it can dump.
        So every rank except `late_rank` first parks both gloo worker threads in two async
        1-element all_reduces ("gates") that cannot finish without `late_rank`, queues the
        faulty op(s) behind them and dumps. `late_rank` (the one that never receives too
        much) joins only after all others have dumped, queues its own op(s) and dumps.
        Whatever happens afterwards (aborts, resets) happens after every dump exists.
        """
        # A process's first dump spends 1-3 s of CPU setting up stack symbolisation; with
        # several ranks on 2 cores that outlasts the gates' timeout. Pay it up front and
        # line the ranks up again, so the gates only have to outlive the dumps themselves.
        torch._C._distributed_c10d._dump_fr_trace()
        self.signal("warm")
        self.wait_for("warm")
        if self.rank == late_rank:
            self.wait_for("dumped", self.others())
        gates = [dist.all_reduce(ones(1), async_op=True) for _ in range(GLOO_THREADS)]
        works = issue_faulty()
        self.dump("inflight_gated")
        for work in gates + works:
            with self.expect_failure(must_fail=False):  # late_rank's gates do succeed
                work.wait()
        self.write_meta()


def ones(n, dtype=None):
    return torch.ones(n, dtype=dtype or torch.float32)


def worker_main(name: str, rank: int, workdir: Path) -> None:
    """Entry point of one rank: rendezvous, run the scenario body, dump, wait, exit."""
    sc = SCENARIOS[name]
    ctx = Ctx(sc, rank, workdir)
    # Importing torch on 2 cores takes seconds; line the ranks up first so that the short
    # PG timeout only has to cover the rendezvous itself.
    ctx.signal("ready")
    ctx.wait_for("ready")
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=sc.world,
        init_method=f"file://{workdir / 'rendezvous'}",
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    ctx.record_group("default", dist.group.WORLD)
    sc.body(ctx)
    if ctx.trigger is None:
        ctx.dump()
    # Stay alive until everybody has finished, so that no rank's exit turns a peer's
    # timeout into a "connection closed" error; then leave without gloo teardown,
    # which can block on a group that timed out.
    ctx.signal("done")
    ctx.wait_for("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------

HANG_DESC = "ranks {peers} time out in all_reduce #{seq} that rank {culprit} never issues"


def three_then_hang(ctx: Ctx, culprit: int) -> None:
    """3 all_reduce on everyone; the 4th is never issued by `culprit`, the peers hang in it."""
    for _ in range(3):
        dist.all_reduce(ones(16))
    if ctx.rank == culprit:
        ctx.stall_until_peers_dumped()
    else:
        with ctx.expect_failure():
            dist.all_reduce(ones(16))


@scenario(2, "healthy: all_reduce x3, broadcast, all_gather, reduce, barrier")
def healthy_2rank(ctx):
    for _ in range(3):
        dist.all_reduce(ones(16))
    dist.broadcast(ones(8), src=0)
    dist.all_gather([ones(4) for _ in range(ctx.world)], ones(4))
    dist.reduce(ones(8), dst=1)
    dist.barrier()


def build_mesh(ctx: Ctx, **kw):
    """2x4 mesh: tp [0-3],[4-7] (desc tp), dp [i,i+4] (desc dp); every rank creates all."""
    tp = [ctx.new_group(f"tp{i}", list(range(4 * i, 4 * i + 4)), group_desc="tp", **kw)
          for i in range(2)]
    dp = [ctx.new_group(f"dp{i}", [i, i + 4], group_desc="dp", **kw) for i in range(4)]
    return tp[ctx.rank // 4], dp[ctx.rank % 4]


@scenario(8, "healthy 2x4 mesh: 3 steps of tp all_reduce + dp all_reduce, final barrier")
def healthy_8rank_mesh(ctx):
    # Like most real jobs, keep new_group's default timeout (30 min, timeout_ms 1800000).
    tp, dp = build_mesh(ctx, timeout=timedelta(minutes=30))
    for _ in range(3):
        dist.all_reduce(ones(16), group=tp)
        dist.all_reduce(ones(8), group=dp)
    dist.barrier()


@scenario(4, HANG_DESC.format(peers="0,1,3", seq=4, culprit=2),
          fault_kind="not_issued", suspects=[2], group="default", seq=4)
def hang_never_arrives(ctx):
    three_then_hang(ctx, culprit=2)


@scenario(4, "rank 1 issues a 4th all_reduce that nobody joins and times out in it",
          fault_kind="extra_op", suspects=[1], group="default", seq=4)
def extra_collective(ctx):
    for _ in range(3):
        dist.all_reduce(ones(16))
    if ctx.rank == 1:
        with ctx.expect_failure():
            dist.all_reduce(ones(16))


@scenario(4, "rank 2 skips all_reduce #3 and goes straight to the broadcast, so its seq 3 "
             "is the broadcast that is seq 4 on ranks 0,1,3; everyone times out",
          fault_kind="not_issued", suspects=[2], group="default", seq=3)
def skipped_collective(ctx):
    for _ in range(2):
        dist.all_reduce(ones(16))
    # Issued async, as a training loop overlapping communication would: ranks 0,1,3 get
    # both ops into the recorder before the first one times out.
    works = []
    if ctx.rank != 2:
        works.append(dist.all_reduce(ones(16), async_op=True))
    works.append(dist.broadcast(ones(16), src=0, async_op=True))
    for work in works:
        with ctx.expect_failure():
            work.wait()


@scenario(4, "rank 3 all_reduces 17 floats where ranks 0-2 use 16; dumped in flight behind "
             "two 1-element gate all_reduces (seq 3,4), gloo then aborts a receiver",
          fault_kind="size_mismatch", suspects=[3], group="default", seq=5)
def size_mismatch(ctx):
    for _ in range(2):
        dist.all_reduce(ones(16))
    n = 17 if ctx.rank == 3 else 16
    ctx.gated(late_rank=3, issue_faulty=lambda: [dist.all_reduce(ones(n), async_op=True)])


@scenario(4, "rank 0 calls broadcast where ranks 1-3 call all_reduce (same size)",
          fault_kind="op_mismatch", suspects=[0], group="default", seq=3)
def op_mismatch(ctx):
    for _ in range(2):
        dist.all_reduce(ones(16))
    with ctx.expect_failure():
        if ctx.rank == 0:
            dist.broadcast(ones(16), src=0)
        else:
            dist.all_reduce(ones(16))


@scenario(4, "rank 2 all_reduces int32 where the others use float32 (same element count; "
             "gloo does not notice)",
          fault_kind="dtype_mismatch", suspects=[2], group="default", seq=3)
def dtype_mismatch(ctx):
    for _ in range(2):
        dist.all_reduce(ones(16))
    # Same byte count, so gloo moves the bytes and completes: the job carries on with garbage.
    dist.all_reduce(ones(16, torch.int32 if ctx.rank == 2 else torch.float32))
    dist.all_reduce(ones(16))


@scenario(4, "rank 1 never arrives at all_reduce #4; its dump files are deleted",
          fault_kind="missing_dump", suspects=[1], group="default", seq=4, delete_dumps=[1])
def missing_dump_hang(ctx):
    three_then_hang(ctx, culprit=1)


@scenario(4, "rank 2 never arrives at all_reduce #4; victim rank 3's dump is deleted",
          fault_kind="not_issued", suspects=[2], group="default", seq=4, delete_dumps=[3])
def victim_missing_dump(ctx):
    three_then_hang(ctx, culprit=2)


@scenario(8, "2x4 mesh; at step 3 rank 5 never issues its tp all_reduce: ranks 4,6,7 hang "
             "in tp [4-7], ranks 0-3 finish tp and hang in dp waiting on 4-7",
          fault_kind="not_issued", suspects=[5], group="tp1", seq=3,
          consequences=[("dp0", 3, [0]), ("dp1", 3, [1]), ("dp2", 3, [2]), ("dp3", 3, [3])])
def cascade_tp_dp(ctx):
    tp, dp = build_mesh(ctx)
    for step in range(1, 4):
        if step == 3 and ctx.rank == 5:
            ctx.stall_until_peers_dumped()  # e.g. stuck in the data loader
            return
        with ctx.expect_failure():
            dist.all_reduce(ones(16), group=tp)
        if ctx.exception:
            return  # hung in tp: never gets to dp
        with ctx.expect_failure():
            dist.all_reduce(ones(8), group=dp)
        if ctx.exception:
            return


@scenario(4, "buffer 50: 40 default all_reduce, 60 all_reduce in side group [0,1], 25 default "
             "all_reduce; ranks 0,1 and 2,3 keep different windows",
          buffer=50)
def ring_wrap_uneven(ctx):
    side = ctx.new_group("side", [0, 1], group_desc="side")
    for _ in range(40):
        dist.all_reduce(ones(4))
    if side is not None:
        for _ in range(60):
            dist.all_reduce(ones(2), group=side)
    for _ in range(25):
        dist.all_reduce(ones(4))


@scenario(4, "healthy: all_reduce_coalesced, _coalescing_manager(2 all_reduce), "
             "all_gather_into_tensor, reduce_scatter_tensor")
def coalesced_healthy(ctx):
    dist.all_reduce(ones(16))
    dist.all_reduce_coalesced([ones(3), ones(5)])
    with dist.distributed_c10d._coalescing_manager():
        dist.all_reduce(ones(3))
        dist.all_reduce(ones(5))
    dist.all_gather_into_tensor(ones(4 * ctx.world), ones(4))
    dist.reduce_scatter_tensor(ones(4), ones(4 * ctx.world))
    dist.all_reduce(ones(16))


@scenario(4, HANG_DESC.format(peers="0-2", seq=4, culprit=3) + "; pickle dumped without stacks",
          fault_kind="not_issued", suspects=[3], group="default", seq=4,
          pickle_kwargs={"includeStackTraces": False})
def hang_no_frames(ctx):
    three_then_hang(ctx, culprit=3)


@scenario(2, "healthy 2-rank job dumped with includeCollectives=False (no entries key)",
          pickle_kwargs={"includeCollectives": False}, json_kwargs={"includeCollectives": False})
def healthy_no_entries(ctx):
    for _ in range(3):
        dist.all_reduce(ones(16))
    dist.barrier()


@scenario(4, "groups [0,1] and [2,3] made with use_local_synchronization (hash names); "
             "rank 0 never issues all_reduce #4 in [0,1], rank 1 times out in it",
          fault_kind="not_issued", suspects=[0], group="pair01", seq=4)
def hash_named_groups(ctx):
    # No group_desc: these groups carry the 'undefined' description.
    pair01 = ctx.new_group("pair01", [0, 1], local_sync=True)
    pair23 = ctx.new_group("pair23", [2, 3], local_sync=True)
    dist.all_reduce(ones(8))
    pair = pair01 if ctx.rank < 2 else pair23
    for _ in range(3):
        dist.all_reduce(ones(16), group=pair)
    if ctx.rank == 0:
        ctx.stall_until_peers_dumped()
    elif ctx.rank == 1:
        with ctx.expect_failure():
            dist.all_reduce(ones(16), group=pair)
    else:
        dist.all_reduce(ones(16), group=pair)


@scenario(4, "healthy: overlapping groups [0,1,2] 'abc' and [1,2,3] 'bcd' take turns")
def overlapping_groups_healthy(ctx):
    abc = ctx.new_group("abc", [0, 1, 2], group_desc="abc")
    bcd = ctx.new_group("bcd", [1, 2, 3], group_desc="bcd")
    for _ in range(2):
        if abc is not None:
            dist.all_reduce(ones(16), group=abc)
        if bcd is not None:
            dist.all_reduce(ones(16), group=bcd)
    if abc is not None:
        dist.broadcast(ones(8), src=0, group=abc)
    if bcd is not None:
        dist.all_gather([ones(4) for _ in range(3)], ones(4), group=bcd)
    dist.barrier()


@scenario(2, "2 all_reduce; rank 1 waits in recv for a send rank 0 never does, rank 0 goes on "
             "to all_reduce #3; both time out (gloo records no send/recv)",
          fault_kind="p2p_unmatched", suspects=[1], group="default", seq=3)
def p2p_unmatched_recv(ctx):
    for _ in range(2):
        dist.all_reduce(ones(8))
    with ctx.expect_failure():
        if ctx.rank == 1:
            dist.recv(ones(8), src=0)
        else:
            dist.all_reduce(ones(8))


@scenario(4, "healthy: all_to_all_single with uneven splits, scatter, gather")
def uneven_alltoall_healthy(ctx):
    r, w = ctx.rank, ctx.world
    # rank r sends r+j+1 elements to rank j, so every rank's input size differs.
    send_splits = [r + j + 1 for j in range(w)]
    recv_splits = [j + r + 1 for j in range(w)]
    dist.all_to_all_single(ones(sum(recv_splits)), ones(sum(send_splits)),
                           output_split_sizes=recv_splits, input_split_sizes=send_splits)
    dist.scatter(ones(4), [ones(4) for _ in range(w)] if r == 0 else None, src=0)
    dist.gather(ones(4), [ones(4) for _ in range(w)] if r == 0 else None, dst=0)
    dist.all_reduce(ones(16))


# --------------------------------------------------------------------------------------
# Launcher (parent process)
# --------------------------------------------------------------------------------------


def run_scenario(sc: Scenario, out: Path) -> dict:
    """Run one scenario's ranks, publish their dumps under `out`, return its truth."""
    workdir = Path(tempfile.mkdtemp(prefix=f"frfix_{sc.name}_"))
    env = dict(os.environ)
    for var in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env.pop(var, None)
    env.update(TORCH_FR_BUFFER_SIZE=str(sc.buffer), GLOO_SOCKET_IFNAME="lo",
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    procs = []
    for rank in range(sc.world):
        log = open(workdir / f"log_{rank}.txt", "w")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", sc.name, str(rank),
               str(workdir)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    wait_for_ranks(procs, workdir)
    returncodes = [p.returncode for p in procs]
    metas = {}
    for rank in range(sc.world):
        meta_file = workdir / f"meta_{rank}.json"
        metas[rank] = json.loads(meta_file.read_text()) if meta_file.exists() else None
    if any(m is None for m in metas.values()):
        for rank in range(sc.world):
            print(f"--- {sc.name} rank {rank} log ---\n"
                  + (workdir / f"log_{rank}.txt").read_text()[-2000:], file=sys.stderr)
        raise SystemExit(f"{sc.name}: some ranks never dumped ({returncodes=}); see {workdir}")
    publish_dumps(sc, workdir, out)
    truth = build_truth(sc, metas, returncodes)
    shutil.rmtree(workdir)
    return truth


def wait_for_ranks(procs: list, workdir: Path) -> None:
    """Wait for the ranks; mark each exited one so that live peers stop waiting for it.

    A rank that gloo aborted (gated scenarios) never signals "done" itself."""
    deadline = time.time() + SCENARIO_DEADLINE_S
    running = dict(enumerate(procs))
    while running and time.time() < deadline:
        for rank, proc in list(running.items()):
            if proc.poll() is not None:
                (workdir / f"exited_{rank}").touch()
                del running[rank]
        time.sleep(0.05)
    for proc in running.values():
        proc.kill()  # only our own children, by handle
        proc.wait()


def publish_dumps(sc: Scenario, workdir: Path, out: Path) -> None:
    """Copy the dumps into the fixture tree, neutralising paths, dropping deleted ranks."""
    for suffix, src in (("", "pickle"), ("_json", "json")):
        dest = out / f"{sc.name}{suffix}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for rank in range(sc.world):
            if rank in sc.delete_dumps:
                continue  # simulates a rank that died without writing a dump
            data = (workdir / src / f"rank_{rank}").read_bytes()
            if src == "pickle":
                data = neutralise_frames(data)
            (dest / f"rank_{rank}").write_bytes(data)


def neutralise_frames(data: bytes) -> bytes:
    """Rewrite frame file names to neutral paths; keep everything else as torch wrote it.

    The bytes are our own job's output, so unpickling them is safe. A dump without frames
    is returned untouched, which keeps some genuine C++-pickler bytes in the fixtures."""
    dump = pickle.loads(data)
    # torch's pickler memoises identical frames, so one frame dict can be shared by many
    # entries: rewrite each distinct object once.
    frames = {id(f): f for e in dump.get("entries", []) for f in e.get("frames", [])}
    if not frames:
        return data
    for frame in frames.values():
        frame["filename"] = neutral_path(frame["filename"])
    return pickle.dumps(dump, protocol=2)


def neutral_path(path: str) -> str:
    real = os.path.realpath(path)
    if real == os.path.realpath(__file__):
        return NEUTRAL_SCRIPT
    # torch and what it imports (typing_extensions shows up via @deprecated) live in the
    # venv's site-packages; check it before the stdlib, which may contain it.
    site_dir = os.path.realpath(sysconfig.get_paths()["purelib"])
    stdlib_dir = os.path.realpath(sysconfig.get_paths()["stdlib"])
    if real.startswith(site_dir + os.sep):
        return NEUTRAL_SITE + real[len(site_dir):]
    if real.startswith(stdlib_dir + os.sep):
        return NEUTRAL_STDLIB + real[len(stdlib_dir):]
    raise SystemExit(f"unexpected file in a stack frame, refusing to publish it: {path}")


def build_truth(sc: Scenario, metas: dict, returncodes: list) -> dict:
    groups = {}  # label -> {name, desc, ranks}, checked to agree on every member
    for meta in metas.values():
        for label, info in meta["groups"].items():
            if groups.setdefault(label, info) != info:
                raise SystemExit(f"{sc.name}: ranks disagree about group {label}")
    versions = {m["torch_version"] for m in metas.values()}
    truth = {
        "scenario": sc.name,
        "world_size": sc.world,
        "backend": "gloo",
        "torch_version": versions.pop(),
        "status": "faults" if sc.fault_kind else "healthy",
        "fault_kind": sc.fault_kind,
        "suspect_ranks": sc.suspects,
        "missing_dumps": sc.delete_dumps,
        "group": groups[sc.group] if sc.group else None,
        "collective_seq_id": sc.seq,
        "description": sc.description,
        # Extra context beyond the core fields above.
        "consequences": [
            {"group": groups[label], "collective_seq_id": seq, "waiting_ranks": waiting}
            for label, seq, waiting in sc.consequences
        ],
        "fr_buffer_size": sc.buffer,
        "pg_timeout_s": PG_TIMEOUT_S,
        "pickle_dump_kwargs": sc.pickle_kwargs,
        "json_dump_kwargs": sc.json_kwargs,
        "groups": sorted(groups.values(), key=lambda g: (len(g["name"]), g["name"])),
        "per_rank": {
            str(r): {
                "dump_present": r not in sc.delete_dumps,
                "dump_trigger": metas[r]["dump_trigger"],
                "exception": metas[r]["exception"],
                "process_returncode": returncodes[r],
            }
            for r in range(sc.world)
        },
    }
    return truth


# --------------------------------------------------------------------------------------
# Verification of truth files against the published dumps (no torch needed)
# --------------------------------------------------------------------------------------


def load_dumps(out: Path, name: str) -> dict:
    dumps = {}
    for path in sorted((out / name).iterdir()):
        dumps[int(path.name.split("_")[-1])] = pickle.loads(path.read_bytes())
    return dumps


def signature(entry) -> tuple:
    """What must agree across ranks at one seq: op, input shapes, input dtypes (hashable)."""
    return (entry["profiling_name"], json.dumps(entry["input_sizes"]),
            json.dumps(entry["input_dtypes"]))


def seq_table(dumps: dict, group_name: str) -> dict:
    """rank -> {collective_seq_id: entry} for one group."""
    return {
        rank: {e["collective_seq_id"]: e for e in d.get("entries", [])
               if e["process_group"][0] == group_name}
        for rank, d in dumps.items()
    }


def check_truth(out: Path, truth: dict) -> tuple[list, str]:
    """Return (problems, one table row) for one scenario."""
    name, world = truth["scenario"], truth["world_size"]
    problems = []
    dumps = load_dumps(out, name)
    json_ranks = sorted(int(p.name.split("_")[-1]) for p in (out / f"{name}_json").iterdir())
    expected = sorted(set(range(world)) - set(truth["missing_dumps"]))
    if sorted(dumps) != expected or json_ranks != expected:
        problems.append(f"dump files {sorted(dumps)} / json {json_ranks}, expected {expected}")
    for rank, d in dumps.items():
        twin = json.loads((out / f"{name}_json" / f"rank_{rank}").read_text())
        if [e["record_id"] for e in d.get("entries", [])] != \
                [e["record_id"] for e in twin.get("entries", [])]:
            problems.append(f"rank {rank}: pickle and JSON twin hold different entries")
    if truth["status"] == "healthy":
        problems += check_healthy(dumps)
        return problems, f"{name:28} {world}  healthy"
    group, k, suspects = truth["group"], truth["collective_seq_id"], truth["suspect_ranks"]
    table = seq_table(dumps, group["name"])
    members = group["ranks"]
    peers = [r for r in members if r not in suspects and r in dumps]
    cells = []
    for r in members:
        e = table.get(r, {}).get(k) if r in dumps else None
        cells.append(f"{r}:" + ("no dump" if r not in dumps else "-" if e is None else
                                f"{e['profiling_name'][5:]}{e['input_sizes']}{e['input_dtypes'][0][:3]}"))
    kind = truth["fault_kind"]
    peer_sigs = {signature(table[r][k]) for r in peers if k in table[r]}
    if kind in ("not_issued", "missing_dump", "p2p_unmatched"):
        if any(k not in table[r] for r in peers):
            problems.append(f"a peer lacks seq {k}")
        for s in suspects:
            if s not in dumps:
                if kind != "missing_dump":
                    problems.append(f"suspect {s} has no dump")
            elif k in table[s]:
                # Only a skipped op may sit at seq k: it must look like the peers' seq k+1.
                later = {signature(table[r][k + 1]) for r in peers if k + 1 in table[r]}
                if signature(table[s][k]) not in later:
                    problems.append(f"suspect {s} issued seq {k} and it is no skipped op")
    elif kind == "extra_op":
        if any(k in table[r] for r in peers) or any(k not in table[s] for s in suspects):
            problems.append(f"seq {k} is not issued by the suspects alone")
    elif kind in ("size_mismatch", "op_mismatch", "dtype_mismatch"):
        field_index = {"op_mismatch": 0, "size_mismatch": 1, "dtype_mismatch": 2}[kind]
        if len(peer_sigs) != 1:
            problems.append(f"peers disagree at seq {k}: {peer_sigs}")
        for s in suspects:
            own = signature(table[s][k]) if k in table[s] else None
            if own is None or own[field_index] == next(iter(peer_sigs))[field_index]:
                problems.append(f"suspect {s} does not differ in the {kind} field")
    for cons in truth.get("consequences", []):
        ctable = seq_table(dumps, cons["group"]["name"])
        for r in cons["group"]["ranks"]:
            has = cons["collective_seq_id"] in ctable.get(r, {})
            if has != (r in cons["waiting_ranks"]):
                problems.append(f"consequence {cons['group']['name']}: rank {r} has={has}")
    row = (f"{name:28} {world}  {kind:15} {group['name'][:8]}:{group['desc']:10} seq {k:<3} "
           f"suspects {suspects} missing {truth['missing_dumps']}  | " + "  ".join(cells))
    return problems, row


def check_healthy(dumps: dict) -> list:
    """Every member of every group has the same ops at the seqs all members still hold."""
    problems = []
    names = {e["process_group"][0] for d in dumps.values() for e in d.get("entries", [])}
    for gname in sorted(names):
        table = {r: t for r, t in seq_table(dumps, gname).items() if t}
        if len(table) < 2:
            continue
        lo = max(min(t) for t in table.values())
        hi = max(max(t) for t in table.values())
        for k in range(lo, hi + 1):
            ops = {r: t[k]["profiling_name"] if k in t else None for r, t in table.items()}
            if len(set(ops.values())) != 1:
                problems.append(f"group {gname} seq {k}: {ops}")
    return problems


def check_all(out: Path, names: list) -> bool:
    ok = True
    for name in names:
        truth = json.loads((out / "truth" / f"{name}.json").read_text())
        problems, row = check_truth(out, truth)
        print(("ok   " if not problems else "FAIL ") + row)
        for p in problems:
            print(f"       {p}")
        ok = ok and not problems
    return ok


# --------------------------------------------------------------------------------------
# README of the fixture tree
# --------------------------------------------------------------------------------------

README_HEAD = """\
# Real gloo Flight Recorder fixtures (generated)

Generated by `tools/make_gloo_fixtures.py` with PyTorch {torch_version} (CPU, gloo backend).
Every scenario is a real multi-process `torch.distributed` job ({pg_timeout} s PG timeout,
file:// rendezvous). Each rank dumped `torch._C._distributed_c10d._dump_fr_trace()` into
`<scenario>/rank_<r>` and right after `_dump_fr_trace_json()` into `<scenario>_json/rank_<r>`.
Hung ranks dump after catching gloo's timeout, like a watchdog-triggered dump. Stack-frame file
names in the pickles were rewritten to `{script}` (the job) and `{site}/...`;
nothing else was changed (JSON twins are byte-for-byte torch's output; pickles without frames
too). `truth/<scenario>.json` says what really happened; the group name in it is the real
`pg.group_name` taken from the running job.

Regenerate (needs the throw-away torch venv, never a repo dependency):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0
    /tmp/torchvenv/bin/python tools/make_gloo_fixtures.py [--only NAME ...]
    python3 tools/make_gloo_fixtures.py --check     # re-verify truth vs dumps, no torch

`size_mismatch` uses the *gated* trick (see `Ctx.gated`): gloo aborts a rank that receives
more bytes than it expects, before it could dump. So the ranks park both gloo worker threads in
two 1-element all_reduces, queue the faulty op and dump; the culprit joins last. The two gate
all_reduces (seq 3, 4) therefore sit just before the faulty entry, and one rank's process
ended with SIGABRT afterwards (its `process_returncode` -6 is in the truth file). The other
mismatches did not need it: broadcast-vs-all_reduce just times out, and int32-vs-float32
of the same byte count completes unnoticed. Missing dumps were deleted after the run.

The truth files carry, beyond the core fields: `consequences` (groups held up by the root
cause, cascade only), `groups` (every group with its real name, desc and ranks),
`fr_buffer_size`, `pg_timeout_s`, the dump kwargs, and `per_rank` (`dump_trigger`:
after_body / after_exception / after_stall / inflight_gated, the caught gloo `exception`, and
`process_returncode`).

| scenario | world | status / fault | suspects | missing dumps | root group (name:desc) | seq | dump settings | what happened |
|---|---|---|---|---|---|---|---|---|"""


def write_readme(out: Path) -> None:
    truths = [json.loads((out / "truth" / f"{n}.json").read_text()) for n in SCENARIOS
              if (out / "truth" / f"{n}.json").exists()]
    lines = [README_HEAD.format(torch_version=truths[0]["torch_version"], pg_timeout=PG_TIMEOUT_S,
                                script=NEUTRAL_SCRIPT, site=NEUTRAL_SITE)]
    for t in truths:
        g = t["group"]
        settings = []
        if t["fr_buffer_size"] != 2000:
            settings.append(f"buffer {t['fr_buffer_size']}")
        settings += [f"{k}={v}" for k, v in t["pickle_dump_kwargs"].items()]
        lines.append(
            f"| {t['scenario']} | {t['world_size']} | {t['fault_kind'] or 'healthy'} | "
            f"{t['suspect_ranks'] or '-'} | {t['missing_dumps'] or '-'} | "
            f"{(g['name'] + ':' + g['desc']) if g else '-'} | {t['collective_seq_id'] or '-'} | "
            f"{', '.join(settings) or '-'} | {t['description']} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------

EXAMPLES = ["hang_never_arrives", "healthy_8rank_mesh", "cascade_tp_dp"]


def copy_examples(out: Path, examples: Path) -> None:
    """Copy a few pickle fixtures to examples/ (the README there is written by hand)."""
    for name in EXAMPLES:
        shutil.rmtree(examples / name, ignore_errors=True)
        shutil.copytree(out / name, examples / name)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, name, rank, workdir = sys.argv
        worker_main(name, int(rank), Path(workdir))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="scenarios to run")
    parser.add_argument("--check", action="store_true", help="only verify existing fixtures")
    parser.add_argument("--examples", type=Path, help=f"also copy {EXAMPLES} into this directory")
    args = parser.parse_args()
    names = args.only or list(SCENARIOS)
    if not args.check:
        if torch is None:
            raise SystemExit("torch is not importable: run this with /tmp/torchvenv/bin/python")
        (args.out / "truth").mkdir(parents=True, exist_ok=True)
        for name in names:
            started = time.time()
            truth = run_scenario(SCENARIOS[name], args.out)
            (args.out / "truth" / f"{name}.json").write_text(json.dumps(truth, indent=2) + "\n")
            print(f"{name}: {time.time() - started:.1f} s, return codes "
                  f"{[p['process_returncode'] for p in truth['per_rank'].values()]}",
                  file=sys.stderr)
        write_readme(args.out)
    ok = check_all(args.out, names)
    if args.examples:
        copy_examples(args.out, args.examples)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
