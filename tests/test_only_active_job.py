"""A job dumped with only active entries (`onlyActive`) is one setting for every rank.

A batch's ops (batch_isend_irecv) are recorded without events, so they never look
finished, and only-active dumps leave out their finished marker: the loader settles them
where a dump shows gaps in its record ids. A rank whose only unfinished entries are one
batch's ops shows no gap, yet its dump was taken the same way: read alone it looks as if
that batch never finished, and its partner, whose batch was settled, as if it never
posted the other end."""

from __future__ import annotations

import json

import pytest
from helpers import analyse_dicts, entry, job, run_cli, write_job

from frtrace.report.render import render_json
from frtrace.testing.inject import inject_at, only_active
from frtrace.testing.synth import Fault, generate


def _only_active(job) -> dict:
    """The dumps as onlyActive writes them: every entry with a discovered completion left out."""
    return {rank: dict(dump, entries=[e for e in dump["entries"] if e.get("time_discovered_completed_ns") is None])
            for rank, dump in job.dumps.items()}


def _gapless(entries: list) -> bool:
    return bool(entries) and entries[-1]["record_id"] - entries[0]["record_id"] + 1 == len(entries)


def _only_its_newest_batch(dump: dict) -> dict:
    """The dump of a rank whose only unfinished entries are its newest P2P batch's ops."""
    entries = dump["entries"]
    newest = [e for e in entries if e["is_p2p"]][-1]
    batch = [e for e in entries if e["is_p2p"] and e["process_group"] == newest["process_group"]
             and e["p2p_seq_id"] == newest["p2p_seq_id"]]
    return dict(dump, entries=batch)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_whose_only_active_entries_are_one_batch_is_read_as_the_rest_of_the_job(seed):
    job = generate(16, 2, 2, steps=3, p2p="batched", coalesced_events="marker", pg_status="work", watchdog_ms=100.0,
                   seed=seed)
    assert job.truth["status"] == "healthy"
    dumps = _only_active(job)
    rank = next(r for r, d in sorted(dumps.items()) if any(e["is_p2p"] for e in d["entries"]))
    dumps[rank] = _only_its_newest_batch(dumps[rank])
    assert _gapless(dumps[rank]["entries"]) and len(dumps[rank]["entries"]) >= 1
    assert not all(_gapless(d["entries"]) for d in dumps.values())  # the others show the setting
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("healthy", ())


def test_the_command_reads_such_a_job_from_files_as_healthy(tmp_path):
    job = generate(16, 2, 2, steps=3, p2p="batched", coalesced_events="marker", pg_status="work", watchdog_ms=100.0,
                   seed=1)
    dumps = _only_active(job)
    rank = next(r for r, d in sorted(dumps.items()) if any(e["is_p2p"] for e in d["entries"]))
    dumps[rank] = _only_its_newest_batch(dumps[rank])
    write_job(tmp_path, dumps, prefix="nccl_trace_rank_")
    result = run_cli([tmp_path, "--format", "json", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "healthy"


def _every_rank_keeps_only_its_newest_batch(seed: int) -> dict:
    """A healthy job's only-active dumps where every rank that ran P2P work holds nothing
    but its newest batch's ops, stale (their marker finished and was left out): no dump
    shows a gap in its record ids, so none shows the setting that way."""
    job = generate(16, 2, 2, steps=3, p2p="batched", coalesced_events="marker", pg_status="work", watchdog_ms=100.0,
                   seed=seed)
    assert job.truth["status"] == "healthy"
    dumps = {rank: _only_its_newest_batch(dump) if any(e["is_p2p"] for e in dump["entries"]) else dump
             for rank, dump in _only_active(job).items()}
    assert all(_gapless(dump["entries"]) for dump in dumps.values() if dump["entries"])
    return dumps


@pytest.mark.parametrize("seed", [0, 2])
def test_a_healthy_gapless_only_active_job_with_a_dump_missing_is_no_fault(seed):
    # Each rank's pg_status says its pipeline group finished a collective numbered past
    # the batch it holds, which a ring buffer would hold too: the finished work was left
    # out. Read as full dumps, every held batch looked unfinished, and the missing rank's
    # partners as waiting on it: FAULT on ranks that did nothing wrong.
    dumps = _every_rank_keeps_only_its_newest_batch(seed)
    for missing in [rank for rank, dump in sorted(dumps.items()) if dump["entries"]][:4]:
        _, diagnosis = analyse_dicts({r: d for r, d in dumps.items() if r != missing}, render=False)
        assert diagnosis.status != "faults", (missing, diagnosis.suspect_ranks)
        assert diagnosis.suspect_ranks == ()


def test_pg_status_shows_left_out_work_only_when_it_finished_past_what_the_dump_holds():
    from frtrace.load.loader import normalise_dump
    from frtrace.table.standing import keeps_only_active, status_past_held_work

    dumps = _every_rank_keeps_only_its_newest_batch(0)
    rank, raw = next((r, d) for r, d in sorted(dumps.items()) if len(d["entries"]) == 1)
    (held,) = raw["entries"]
    key = str(held["pg_id"])
    status = raw["pg_status"][key]
    finished = status["last_completed_collective"]
    assert finished == status["last_enqueued_collective"] > held["collective_seq_id"]
    assert finished != held["p2p_seq_id"]

    def with_status(enqueued: int, completed: int) -> bool:
        changed = dict(raw, pg_status=dict(raw["pg_status"], **{key: dict(
            status, last_enqueued_collective=enqueued, last_completed_collective=completed)}))
        dump = normalise_dump(changed, rank, f"rank_{rank}", "pickle")
        return status_past_held_work(dump) and keeps_only_active(dump)

    assert with_status(finished, finished)
    # Enqueued while the dump was taken, not finished: a full dump may lag that far.
    assert not with_status(finished + 1, finished)
    # The held batch's own P2P number: its numbering cannot be told.
    assert not with_status(held["p2p_seq_id"], held["p2p_seq_id"])
    # Nothing past the held batch.
    assert not with_status(held["collective_seq_id"], held["collective_seq_id"])


def _tp_mismatch_in_a_batched_pipeline() -> dict:
    """A healthy job of batched P2P (TP 4 x PP 2 x DP 2, timing off), in which rank 13 then
    issues a broadcast where its TP group's #8 is another op: every rank cut at the op it
    blocks in, dumped with only active entries, with a pg_status that counts collectives
    only (so it cannot say which P2P work finished). Its stage 1 ranks post batches of one
    op, whose finished markers are left out."""
    healthy = generate(16, 4, 2, steps=3, seed=9, p2p="batched", coalesced_events="marker", watchdog_ms=100.0,
                       pg_status="work")
    job = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    tp = next(config["name"] for config in job[13][1]["pg_config"].values() if config["desc"] == "tp")
    dumps, _ = inject_at(job, "op", tp, 8, culprit=13, p2p_status=False)
    return {rank: dump for rank, (_, dump) in only_active(dumps).items()}


def test_batches_of_one_op_that_finished_are_read_so_where_the_group_posts_batches():
    # Stage 0 posts two-op batches (recognised as batches); stage 1, batches of one op,
    # which looked like plain ops never finished: the channels then paired one off, and
    # stage 0's four ranks were blamed for sends they had posted.
    analysis, diagnosis = analyse_dicts(_tp_mismatch_in_a_batched_pipeline(), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (13,))
    assert not [f for f in diagnosis.findings if f.kind == "p2p_unmatched" and f.is_root]


def test_the_injected_pg_status_counts_p2p_work_as_torch_does():
    # A group whose newest work is a P2P batch reports that batch's P2P number (its
    # marker's); a dump cut before it, the number of the last work that finished.
    healthy = generate(16, 4, 2, steps=3, seed=9, p2p="batched", coalesced_events="marker", watchdog_ms=100.0,
                       pg_status="work")
    job = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    tp = next(config["name"] for config in job[13][1]["pg_config"].values() if config["desc"] == "tp")
    for p2p_status in (True, False):
        dumps, _ = inject_at(job, "hang", tp, 8, culprit=13, p2p_status=p2p_status)
        for rank, (_, dump) in dumps.items():
            entries = dump["entries"]
            for pg_id, status in dump["pg_status"].items():
                works = [k for k, e in enumerate(entries) if str(e["pg_id"]) == pg_id
                         and (e["profiling_name"].endswith(":coalesced") or not e["is_p2p"])]
                if not works:
                    continue
                newest = entries[works[-1]]
                p2p = newest["profiling_name"].endswith(":coalesced") and entries[works[-1] - 1]["is_p2p"]
                if p2p and p2p_status:
                    assert status["last_enqueued_collective"] == newest["p2p_seq_id"], (rank, pg_id)
                elif not p2p:
                    assert status["last_enqueued_collective"] == newest["collective_seq_id"], (rank, pg_id)
                assert status["last_started_collective"] == -1  # timing off


def _send_left_out_only_active(culprit: int, ring: bool = True, seed: int = 5, timing: bool = True) -> dict:
    """A context-parallel ring (or a pipeline) of plain sends and recvs (16 ranks: TP 2,
    rings or pipelines of 4, DP 2), healthy, in which `culprit` leaves out its last P2P op
    of the group and goes on to the next collective; every rank cut where it blocks,
    dumped with only active entries (its finished sends and recvs left out: no rank's
    P2P order is held)."""
    from frtrace.testing.inject import Layout, group_ranks, skip_p2p_at

    healthy = generate(16, 2, 4, steps=3, seed=seed, p2p="plain", ring=ring, coalesced_events="marker",
                       pg_status="work", watchdog_ms=100.0, timing=timing)
    job = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    units = Layout(job, group_ranks(job)).units[culprit]
    newest = max(u for u, (_, _, keys) in enumerate(units) if keys and keys[0][0] == "P")
    dumps, _ = skip_p2p_at(job, culprit, newest)
    return {rank: dump for rank, (_, dump) in only_active(dumps).items()}


def test_a_send_left_out_is_told_by_a_like_rank_that_finished_more_of_its_ring():
    # The culprit's ring neighbour waits in the recv; the culprit waits in the next
    # collective, as does the rank in its place in the other rings, whose pg_status says
    # it finished one P2P op more. The neighbour's other ring peer, waiting for the
    # neighbour's send behind that recv, was blamed.
    _, diagnosis = analyse_dicts(_send_left_out_only_active(13), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (13,))


def test_a_send_left_out_before_the_pipeline_group_s_own_collective_is_told_the_same_way():
    # The culprit waits in its pipeline group's all_reduce, its pg_status there holding that
    # collective enqueued and its last P2P op finished; its like rank's, one P2P op more.
    # The stage before it, waiting for a send behind the recv that never came, was blamed.
    _, diagnosis = analyse_dicts(_send_left_out_only_active(12, ring=False, seed=9, timing=False), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (12,))


def test_a_member_holding_only_sends_and_recvs_of_a_group_is_placed_by_their_collective_count():
    # Rank 6 never posts a send and waits in its pipeline group's all_reduce #3; the
    # group's other members hold none of its collectives (their finished ones are left
    # out), only P2P ops, each carrying the group's collective count when posted (2):
    # they never issued #3. Read as "no longer reaching back that far", the job was
    # inconclusive.
    job = generate(8, 2, 4, steps=3, fault=Fault("p2p_unmatched", rank=6, group="pp", step=2), timing=True,
                   p2p="plain", only_active=True, seed=1, coalesced_events="marker", watchdog_ms=100.0,
                   bubble_ms=100.0, pg_status="work")
    assert job.truth["suspect_ranks"] == [6]
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (6,))


def test_a_wrapped_ring_of_batches_with_no_number_missing_holds_its_p2p_order():
    # Dumped with only active entries after each ring wrapped at its own point: the
    # batches' ops stay (they never look finished), numbered with no gap from the oldest
    # held, so the P2P order since then is whole and the like ranks can be compared.
    # Read as holding no order, the pair rank 0 waits in was in flight (inconclusive).
    from frtrace.testing.inject import skip_p2p_at, wrapped

    healthy = generate(8, 2, 2, steps=3, seed=1, p2p="batched", coalesced_events="marker", pg_status="work",
                       watchdog_ms=100.0, vchunks=2)
    dumps, _ = skip_p2p_at({rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}, 0, 43)
    _, diagnosis = analyse_dicts({rank: dump for rank, (_, dump) in only_active(wrapped(dumps)).items()},
                                 render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (0,))


# Groups named as torch names them (its count of groups made so far): two TP pairs, two
# DP pairs, one more pair on ranks 2 and 3, and an expert group of all four. Each rank numbers the groups it joins in
# that order (0 is the default group), as ProcessGroupNCCL counts the groups a process makes.
_PAIRS = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("tp", (0, 1)), "2": ("tp", (2, 3)), "3": ("dp", (0, 2)),
          "4": ("dp", (1, 3)), "5": ("mp", (2, 3)), "6": ("ep", (0, 1, 2, 3))}


def _numbered_as_torch_does(dump: dict) -> dict:
    local = {name: pg_id for pg_id, name in enumerate(sorted(dump["pg_config"], key=int))}
    job_wide = {str(pg_id): name for pg_id, name in enumerate(_PAIRS)}
    for record in dump["entries"]:
        record["pg_id"] = local[record["process_group"][0]]
    dump["pg_status"] = {str(local[job_wide[key]]): status for key, status in dump["pg_status"].items()}
    return dump


def _gpu_of_rank_3_stalls(queued: bool = True, late_ms: float = 0.0) -> dict:
    """Rank 3's GPU stops in its TP all_reduce #4, which its partner rank 2 finished; its
    host queued two more ops behind it (the DP and the third pair's), which rank 1 and
    rank 2 wait in (or, `queued` False, issued nothing more). Rank 3 issues each op
    `late_ms` after the others. Whole dumps, written as NCCL writes them."""
    def program(tp: str, dp: str, last: list) -> list:
        return [f"all_reduce@{tp}", f"all_reduce@{dp}", "all_to_all@6"] * 3 + last

    behind = [("all_reduce@4", {"state": "scheduled"}), ("all_reduce@5", {"state": "scheduled"})] if queued else []
    steps = {
        0: program("1", "3", ["all_reduce@1", "all_reduce@3", "all_reduce@1"]),
        1: program("1", "4", ["all_reduce@1", ("all_reduce@4", {"state": "started"})]),
        2: program("2", "3", ["all_reduce@2", "all_reduce@3", ("all_reduce@5", {"state": "started"})]),
        3: program("2", "4", [("all_reduce@2", {"state": "started"})] + behind),
    }
    return {rank: _numbered_as_torch_does(dump) for rank, dump in job(steps, groups=_PAIRS, late_ms={3: late_ms}).items()}


def _only_active_entries(dumps: dict) -> dict:
    return {rank: dict(dump, entries=[e for e in dump["entries"] if e["state"] != "completed"])
            for rank, dump in dumps.items()}


def test_only_active_dumps_that_show_no_gap_are_known_by_their_unlike_sizes():
    # Each rank keeps a run of records with no gap (its op, and those queued behind it),
    # so no single dump shows the setting; but dumps that start past record 0 hold as many
    # entries as the ring buffer does, one size for the job, and these hold 1 and 3. Read
    # as ring buffers, rank 3's queued ops were left out as if its dump did not reach back
    # to them although it holds them, and nobody was named.
    dumps = _only_active_entries(_gpu_of_rank_3_stalls())
    assert all(_gapless(dump["entries"]) and dump["entries"][0]["record_id"] > 0 for dump in dumps.values())
    _, diagnosis = analyse_dicts(dumps)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,))
    assert not [f for f in diagnosis.findings if f.rule == "frontier.unknown_members"]
    root = next(f for f in diagnosis.findings if f.is_root)
    assert (root.kind, root.suspect_ranks) == ("not_issued", (3,)) and "queued behind" in root.message


def test_ring_buffers_of_unlike_sizes_holding_finished_ops_are_read_as_ring_buffers():
    # Ring buffers of one job hold one size; were one rank's set smaller, its dump still
    # holds finished ops, which no dump of only active entries does: its older ops fell
    # off, and the verdict is the whole dumps'.
    dumps = _gpu_of_rank_3_stalls()
    kept = {0: 5, 1: 4, 2: 6, 3: 7}
    cut = {rank: dict(dump, entries=dump["entries"][-kept[rank]:]) for rank, dump in dumps.items()}
    assert len({len(d["entries"]) for d in cut.values()}) == 4
    analysis, diagnosis = analyse_dicts(cut)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,))
    report = json.loads(render_json(analysis, diagnosis))
    assert report["inputs"]["ranks_only_active"] == []
    assert report["inputs"]["ranks_wrapped"] == [0, 1, 2, 3]


def test_only_active_dumps_of_one_op_each_are_read_as_such_and_place_each_ranks_groups():
    # Every rank holds the one op it waits in: one size for all, but a ring buffer that
    # small (one entry, where torch keeps 2,000) holding nothing finished is no ring.
    # Each rank's entry tells one pg_id, at its group's place in the order of the names,
    # as torch numbers them: together they show the order, which places the groups a rank
    # holds no op of in its pg_status (rank 2 finished TP #4; rank 3 issued no DP #4).
    dumps = _only_active_entries(_gpu_of_rank_3_stalls(queued=False))
    assert all(len(dump["entries"]) == 1 and dump["entries"][0]["record_id"] > 0 for dump in dumps.values())
    _, diagnosis = analyse_dicts(dumps)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,))
    assert not [f for f in diagnosis.findings if f.rule == "frontier.unknown_members" or 2 in f.suspect_ranks]


_DP_PAIR = {"0": ("default_pg", (0, 1)), "2": ("dp", (0, 1))}


def _dp_dump(records: list) -> dict:
    """A dump of only active entries of a two-rank DP job, without pg_status to settle them."""
    config = {name: {"name": name, "desc": desc, "ranks": str(list(ranks))} for name, (desc, ranks) in _DP_PAIR.items()}
    return {"version": "2.10", "pg_config": config, "pg_status": {}, "comm_lib_version": "2.27.5", "entries": records}


def _dp_op(record: int, op: str, seq: int, **fields) -> dict:
    return entry(seq, op, record_id=record, pg=("2", "dp"), pg_id=1, frames=(), **{"state": "scheduled", **fields})


def test_the_last_op_a_ring_kept_of_a_finished_batch_is_read_as_finished():
    # A coalesced batch's ops never finish on their own (recorded without events); rank
    # 0's ring kept only the last op of batch #3 (records 9 and 10 fell off, its marker,
    # 12, finished and was left out), and then batch #5, whose marker (25) is gone too.
    # #5 finished after #3 in the group's order, so #3 did. Read as unfinished, it made
    # a healthy job inconclusive, as if rank 1 (whose ring no longer holds #3) hung.
    dumps = {0: _dp_dump([_dp_op(11, "allreduce_coalesced", 3),
                          _dp_op(23, "all_reduce", 5), _dp_op(24, "all_reduce", 5)]),
             1: _dp_dump([_dp_op(23, "all_reduce", 5), _dp_op(24, "all_reduce", 5)])}
    _, diagnosis = analyse_dicts(dumps)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("healthy", ()), diagnosis.verdict


def test_an_op_behind_one_that_only_timed_out_is_not_read_as_finished():
    # torch's watchdog retires an op that timed out as well as one that finished: a later
    # op retired but never completed says nothing of the one before it.
    from frtrace.load.loader import normalise_dump

    for later, settled in (({"state": "completed"}, True), ({"retired": True}, False)):
        dump = normalise_dump(_dp_dump([_dp_op(11, "all_reduce", 3), _dp_op(13, "all_reduce", 4, **later)]),
                              0, "rank_0", "pickle")
        assert dump.entries[0].completed is settled, later


def test_members_whose_active_entries_leave_an_op_out_are_not_said_to_have_wrapped():
    # Two GPUs stop at one moment (TP 4 x PP 2, groups made in each rank's own order with
    # hashed names): rank 9 holds a TP all_gather its TP peers hold nothing of, and their
    # pg_status rows for the group cannot be placed. Their dumps reach back as far as any
    # (only active entries): the report says that, not that they no longer reach back.
    synth_job = generate(16, 4, 2, steps=4, timing=True, p2p="plain", only_active=True, seed=779,
                         pg_order="rotated", hashed_names=True, coalesced_events="marker", watchdog_ms=100.0,
                         bubble_ms=100.0, pg_status="work",
                         fault=Fault("gpu_error", rank=9, group="tp", step=2, ranks=(9, 14), at_once=True))
    _, diagnosis = analyse_dicts(dict(synth_job.dumps), render=False)
    (unknown,) = [f for f in diagnosis.findings if f.rule == "frontier.unknown_members"]
    assert unknown.facts["unknown_ranks"] == [8, 10, 11]
    assert "hold only active entries, none of it" in unknown.message
    assert "no longer reach back" not in unknown.message


def _pipeline_both_ends_sending() -> dict:
    """Three pipeline stages, dumped with only active entries, after rank 1 left out a recv
    from rank 2: ranks 1 and 2 wait in sends to each other. Rank 1 posted its send before
    its recv from rank 0, which finished: its pg_status says it finished a P2P number past
    the send's (a group's sends and recvs to different peers run on streams of their own,
    and the watchdog retires each finished op as it comes to it)."""
    groups = {"0": ("default_pg", (0, 1, 2)), "pp": ("PIPELINE_MODEL_PARALLEL_GROUP", (0, 1, 2))}
    step = {0: ["send 0->1@pp", "recv 0<-1@pp"], 1: ["recv 1<-0@pp", "send 1->2@pp", "recv 1<-2@pp", "send 1->0@pp"],
            2: ["recv 2<-1@pp", "send 2->1@pp"]}
    steps = {rank: ops * 3 for rank, ops in step.items()}
    steps[0] += ["send 0->1@pp", ("recv 0<-1@pp", {"state": "started"})]
    steps[1] += [("send 1->2@pp", {"state": "started"}), "recv 1<-0@pp"]
    steps[2] += [("recv 2<-1@pp", {"state": "completed"}), ("send 2->1@pp", {"state": "started"})]
    dumps = job(steps, groups=groups)
    for dump in dumps.values():
        p2p = [e for e in dump["entries"] if e["is_p2p"]]
        dump["pg_status"]["1"] = {"last_enqueued_collective": p2p[-1]["p2p_seq_id"], "last_started_collective": -1,
                                  "last_completed_collective": max(e["p2p_seq_id"] for e in p2p if e["state"] == "completed")}
        dump["entries"] = [e for e in dump["entries"] if e["state"] != "completed"]
    return dumps


def test_a_started_send_is_not_read_as_finished_by_a_higher_finished_p2p_number():
    from frtrace.load.loader import normalise_dump

    dumps = _pipeline_both_ends_sending()
    (send,) = normalise_dump(dumps[1], 1, "rank_1", "pickle").entries
    assert (send.op, send.state, send.completed) == ("send", "started", False)
    # Read as finished, rank 1 looked as if it waited in nothing and never posted its send
    # to rank 0; it waits in its send to rank 2, which waits in its own send to rank 1.
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert diagnosis.suspect_ranks == (1,)
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert root.kind == "p2p_unmatched" and set(root.ranks) == {1, 2}


def test_a_lone_batch_op_is_read_as_its_sibling_groups_are_when_the_dump_showing_its_batches_is_lost():
    # 16 x TP 4 x PP 2, batches of sends and recvs, only active entries, dumped while every
    # pipeline group is in its all_reduce #2. Rank 9's dump is lost: its group's other
    # member, rank 13, posts batches of one recv, so its own dump shows no batch; the
    # other pipeline groups (described alike) do, and its finished recv is read as theirs.
    job = generate(16, 4, 2, steps=2, timing=True, p2p="batched", only_active=True, seed=442, pg_order="unnamed",
                   coalesced_events="batch", watchdog_ms=100.0, pg_status="collectives",
                   fault=Fault("in_flight", rank=1, group="pp", step=1))
    assert job.truth["status"] == "inconclusive"
    _, diagnosis = analyse_dicts({rank: dump for rank, dump in job.dumps.items() if rank != 9}, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    assert not any(f.kind == "p2p_unmatched" for f in diagnosis.findings)


def _status(enqueued: int, completed: int) -> dict:
    return {"last_enqueued_collective": enqueued, "last_started_collective": -1, "last_completed_collective": completed}


def _stopped_after_its_newest_batch_job() -> dict:
    """4 ranks, TP groups [0,1] and [2,3], pipeline groups [0,2] and [1,3], only active
    entries, every pipeline op posted in a batch of one whose marker takes a collective
    number of its own (torch versions that bump it when a batch starts), pg_status in
    those numbers. Rank 1 stopped issuing right after its newest batch (a send to rank 3,
    which finished: its marker is gone, pg_status is at its number): it never issued
    all_reduce #6 of its TP group, where rank 0 waits. Ranks 2 and 3 wait in their next
    recv, from ranks 0 and 1."""
    tp = {0: ("10", "TP"), 1: ("10", "TP"), 2: ("11", "TP"), 3: ("11", "TP")}
    pp = {0: ("20", "PP"), 2: ("20", "PP"), 1: ("21", "PP"), 3: ("21", "PP")}
    config = {"10": [0, 1], "11": [2, 3], "20": [0, 2], "21": [1, 3]}
    dumps = {}
    for rank in range(4):
        sender = rank in (0, 1)
        record = 100
        entries = []
        for c, p in ((10, 20), (11, 21), (12, 22)):  # finished batches of one: their markers are gone
            op = "send 0->1" if sender else "recv 1<-0"
            entries.append(entry(c, op, record_id=record, pg=pp[rank], pg_id=2, p2p_seq=p, state="scheduled"))
            record += 3  # the marker, then a finished TP collective, left out
        status = {"1": _status(5, 5), "2": _status(12, 12)}
        if rank == 0:
            entries.append(entry(6, "all_reduce", record_id=record, pg=tp[rank], pg_id=1, state="started",
                                 time_discovered_started_ns=1_700_000_000_100_000_000))
            status["1"] = _status(6, 5)
        if not sender:  # the next recv, posted and waiting, its marker held
            entries.append(entry(13, "recv 1<-0", record_id=record, pg=pp[rank], pg_id=2, p2p_seq=23, state="scheduled"))
            entries.append(entry(13, "coalesced", record_id=record + 1, pg=pp[rank], pg_id=2, p2p_seq=23,
                                 state="started", sizes=(), time_discovered_started_ns=1_700_000_000_100_000_000))
            status["2"] = _status(13, 12)
        groups = {"1": tp[rank], "2": pp[rank]}
        dumps[rank] = {"version": "2.10", "comm_lib_version": "2.27.5", "pg_status": status, "entries": entries,
                       "pg_config": {name: {"name": name, "desc": desc, "ranks": str(config[name])}
                                     for name, desc in groups.values()}}
    return dumps


def test_a_batch_of_one_that_is_a_rank_s_newest_record_is_read_as_finished_where_pg_status_is_at_its_number():
    from frtrace.load.loader import normalise_dump

    dumps = _stopped_after_its_newest_batch_job()
    # Read as unfinished, rank 1 looked as if it waited in its send to rank 3, and rank 3,
    # whose recv of it finished, as if it never posted that recv.
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1,))
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert root.kind == "not_issued"
    # Read alone, nothing says the job batches its sends: the op stays as the dump shows it.
    assert not normalise_dump(dumps[1], 1, "rank_1", "pickle").entries[-1].completed
