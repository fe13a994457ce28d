"""Dumps of only active entries hold nothing of what sibling groups finished, yet a
member's pg_status saying it finished collective #n shows its group ran #n (no member
finishes a collective the others did not join). On an even split, an op the sibling
groups ran belongs to the program: the rank without it never issued it, as the full
dumps of the same job say, rather than its peer issuing an extra op."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from helpers import analyse_dicts, job

from frtrace.match.matcher import _may_have_rows, _take_like_ranks_ids
from frtrace.model import Group, family_of
from frtrace.testing.synth import Fault, generate

FAITHFUL = dict(coalesced_events="marker", watchdog_ms=100.0, bubble_ms=100.0, pg_status="work")


def _tp_group_findings(only_active: bool, seed: int, step: int):
    job = generate(16, 2, 2, steps=3, fault=Fault("skip_op", rank=0, group="tp", step=step), timing=True,
                   p2p="plain", only_active=only_active, seed=seed, **FAITHFUL)
    analysis, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    tp = next(v.group.id for v in analysis.device.views if v.group.desc == "tp" and 0 in v.group.ranks)
    return [(f.kind, f.rule, f.own_suspects, f.absent_ranks, f.siblings_issued_it)
            for f in diagnosis.findings if f.group_id == tp]


@pytest.mark.parametrize("seed,step", [(0, 1), (1, 2), (5, 1)])
def test_a_skipped_tp_op_reads_alike_in_full_and_only_active_dumps(seed, step):
    full = _tp_group_findings(False, seed, step)
    assert full == [("not_issued", "divergence.never_issued", (0,), (0,), True)]
    assert _tp_group_findings(True, seed, step) == full


def _verdict(only_active: bool, seed: int, step: int):
    job = generate(16, 2, 2, steps=3, fault=Fault("skip_op", rank=0, group="tp", step=step), timing=True,
                   p2p="plain", only_active=only_active, seed=seed, **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    return job.truth, diagnosis


@pytest.mark.parametrize("seed,step", [(0, 1), (1, 2), (5, 1), (7, 2), (25, 1)])
def test_the_rank_that_skipped_is_blamed_in_only_active_dumps_as_in_full_ones(seed, step):
    """The pipeline and default groups then split evenly too, their members waiting in
    each other's ops round a circle. The rank in the skipper's place in a sibling TP group
    ran the op (its partner's pg_status says it finished it) and waits in the same default
    group collective as the skipper: the skipper went past the op, and is the root."""
    truth, full = _verdict(False, seed, step)
    _, active = _verdict(True, seed, step)
    assert (full.status, full.suspect_ranks) == ("faults", (0,)) == (truth["status"], tuple(truth["suspect_ranks"]))
    assert (active.status, active.suspect_ranks) == ("faults", (0,))
    root = [f for f in active.findings if f.is_root and f.suspect_ranks]
    assert [(f.rule, f.suspect_ranks) for f in root] == [("divergence.never_issued", (0,))]
    assert list(root[0].went_past) == [0] and root[0].went_past[0].confirmed


# --------------------------------------------------------------------------- ids by creation order


def _deep_pipeline(pg_order: str = "same", step: int = 1, fault: bool = True, only_active: bool = True):
    """TP 2 x PP 8 (and a one-rank DP group per rank): rank 4 skips a TP all_reduce. In
    only-active dumps a rank past its TP ops holds none of them, and with its one-rank
    group, two of its groups hold no entry: elimination cannot tell which pg_status row
    is its TP group's."""
    return generate(16, 2, 8, steps=3, fault=Fault("skip_op", rank=4, group="tp", step=step) if fault else None,
                    seed=97, timing=True, lookahead=0, p2p="batched", only_active=only_active, pg_order=pg_order,
                    **FAITHFUL)


def _ids_read(analysis) -> dict[tuple[int, str], int]:
    """(rank, group name) -> the pg_id the matcher took as the rank's own for the group."""
    return {(rank, view.group.name): stream.pg_id for view in analysis.device.views
            for rank, stream in view.streams.items() if stream.pg_id is not None}


def _true_ids(pg_order: str) -> dict[tuple[int, str], int]:
    """The same job's full dumps: every group that ran an op shows each member's own id."""
    return {(rank, entry["process_group"][0]): entry["pg_id"]
            for rank, dump in _deep_pipeline(pg_order, only_active=False).dumps.items() for entry in dump["entries"]}


@pytest.mark.parametrize("step", [0, 1, 2])
def test_groups_named_by_their_count_give_each_rank_its_ids_in_that_order(step):
    # Torch names a group by the count of groups made before it and each rank numbers the
    # groups it joins as it makes them: rank 6's TP group, made between the default group
    # (id 0) and its pipeline group (whose id its entries give), holds the row between.
    job = _deep_pipeline(step=step)
    analysis, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (job.truth["status"], job.truth["suspect_ranks"]) == (
        "faults", [4])
    ids, truth = _ids_read(analysis), _true_ids("same")
    tp_of_6 = next(v.group.name for v in analysis.device.views if v.group.desc == "tp" and 6 in v.group.ranks)
    assert ids[(6, tp_of_6)] == truth[(6, tp_of_6)]
    assert {key: truth.get(key) for key in ids} == ids


def test_no_id_is_read_from_names_when_ranks_made_their_groups_in_orders_of_their_own():
    # Rotated orders: some rank's entries show ids that do not grow with the names, so no
    # rank's ids are read from them (that would give a group another group's row).
    analysis, _ = analyse_dicts(dict(_deep_pipeline(pg_order="rotated").dumps), render=False)
    ids, truth = _ids_read(analysis), _true_ids("rotated")
    assert {key: truth.get(key) for key in ids} == ids


def test_a_healthy_deep_pipeline_of_only_active_dumps_stays_healthy():
    job = _deep_pipeline(fault=False)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert diagnosis.status == job.truth["status"] == "healthy"



@pytest.mark.parametrize("pg_order", ["same", "unnamed"])
@pytest.mark.parametrize("rank, seed, lookahead", [(8, 297, 0), (0, 753, 2)])
def test_ranks_take_the_ids_their_like_ranks_tell_in_a_ring_with_one_rank_groups(rank, seed, lookahead, pg_order):
    # TP 2 x CP 8 with a one-rank DP group that never runs an op (no row, yet an id): the
    # rows of ranks that hold nothing of their TP group cannot be placed by the order of
    # making, but their like ranks' entries tell the TP group's id. Their rows say the
    # sibling TP groups ran all_reduce #12 before the default group's op: the rank that
    # holds none went past it, rather than its partner issuing an extra one. So too where
    # ranks made groups no dump names, one more on odd ring positions ("unnamed").
    job = generate(16, 2, 8, steps=3, fault=Fault("skip_op", rank=rank, group="tp", step=1 + seed % 2), timing=True,
                   p2p="plain", only_active=True, seed=seed, lookahead=lookahead, ring=True, pg_order=pg_order,
                   **FAITHFUL)
    analysis, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (job.truth["status"], job.truth["suspect_ranks"]) == (
        "faults", [rank])
    truth = {(r, entry["process_group"][0]): entry["pg_id"]
             for r, dump in generate(16, 2, 8, steps=3, timing=True, p2p="plain", seed=seed, ring=True,
                                     pg_order=pg_order, **FAITHFUL).dumps.items() for entry in dump["entries"]}
    ids = _ids_read(analysis)
    assert {key: truth.get(key) for key in ids} == ids


def _stalled_in_the_last_group(b_ran_an_op: bool = True) -> dict:
    """Two ranks in groups named 3, 5, 7 (made in that order: ids 1, 2, 3 on both). Rank
    1's GPU stops reporting in all_reduce #2 of group 7; rank 0 finished it and #3 after
    it, and waits in group 3's next op. Dumped with only active entries, rank 0 holds one
    entry, of group 3: two of its pg_status rows (2 and 3) belong to groups it holds
    nothing of, and elimination cannot tell which is which."""
    groups = {"0": ("default_pg", (0, 1)), "3": ("a", (0, 1)), "5": ("b", (0, 1)), "7": ("c", (0, 1))}
    first = ["all_reduce@3", "all_reduce@5", "all_reduce@7"] if b_ran_an_op else ["all_reduce@3", "all_reduce@7"]
    dumps = job({0: first + ["all_reduce@7", "all_reduce@7", ("all_reduce@3", {"state": "started"})],
                 1: first + [("all_reduce@7", {"state": "started"}), ("all_reduce@7", {"state": "scheduled"}),
                             ("all_reduce@3", {"state": "scheduled"})]},
                groups=groups)
    if not b_ran_an_op:  # a group that never ran an op has no pg_status row, yet took its id
        for dump in dumps.values():
            dump["pg_status"]["3"] = dump["pg_status"].pop("2")
    for dump in dumps.values():
        dump["entries"] = [e for e in dump["entries"] if e["state"] != "completed"]
    return dumps


def test_the_ids_after_the_highest_a_rank_tells_go_to_the_groups_it_made_after_it_in_turn():
    # Rank 0's rows 2 and 3, after its group 3's id 1, are those of the two groups it made
    # after it (5, then 7): its row for group 7 says it finished #2 and #3, so rank 1's GPU
    # is what stopped. Read as "rank 0 never issued #2", the peer that finished was blamed.
    analysis, diagnosis = analyse_dicts(_stalled_in_the_last_group(), render=False)
    assert _ids_read(analysis)[(0, "7")] == 3
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == ("faults", [1])
    root = next(f for f in diagnosis.findings if f.is_root)
    assert (root.kind, root.suspect_ranks) == ("stuck", (1,))


def test_no_id_is_read_past_the_highest_a_rank_tells_where_a_row_is_missing():
    # Group 5 never ran an op and has no row: by the order of making alone, rows {3}
    # cannot be told apart from {2} for two groups made after id 1, so without a like
    # rank's word (rank 1's dump lost) rank 0's row for group 7 stays unread.
    dumps = _stalled_in_the_last_group(b_ran_an_op=False)
    del dumps[1]
    analysis, _ = analyse_dicts(dumps, render=False)
    assert (0, "7") not in _ids_read(analysis)


def test_a_like_rank_tells_the_id_of_a_group_made_after_one_without_a_row():
    # Rank 1 made the same groups in the same order (its entries of group 7 carry id 3):
    # rank 0 took the same ids, so its row 3 is group 7's, the gap left by group 5
    # notwithstanding; the row says rank 0 finished #2 and #3, so rank 1's GPU stopped.
    analysis, diagnosis = analyse_dicts(_stalled_in_the_last_group(b_ran_an_op=False), render=False)
    assert _ids_read(analysis)[(0, "7")] == _ids_read(analysis)[(1, "7")] == 3
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == ("faults", [1])


def test_no_id_is_taken_from_like_ranks_that_tell_two_ids_for_one_place():
    # Rank 2 made the same groups as rank 1, yet its entries of group 7 carry id 2 where
    # rank 1's carry 3: the two made their groups otherwise, so rank 0, which holds
    # nothing of groups 5 and 7 and has rows under ids 2 and 3, takes neither id.
    dumps = _stalled_in_the_last_group()
    dumps[2] = copy.deepcopy(dumps[1])
    for entry in dumps[2]["entries"]:
        if entry["process_group"][0] == "7":
            entry["pg_id"] = 2
    for dump in dumps.values():
        for config in dump["pg_config"].values():
            config["ranks"] = "[0, 1, 2]"
    analysis, _ = analyse_dicts(dumps, render=False)
    assert sorted(name for rank, name in _ids_read(analysis) if rank == 0) == ["0", "3"]


def _like_ranks(told: dict[int, dict[str, int]], keys: dict[int, set[int]]) -> dict[int, dict[str, int]]:
    """`matcher._take_like_ranks_ids` over ranks of groups named 0 (default), 3, 5 and 7,
    each of one family; `told` is rank -> {group name: id} as its entries tell."""
    names = {0: "0", 1: "3", 2: "5", 3: "7"}
    own = {rank: {gid: pg_id for gid, name in names.items() for n, pg_id in ids.items() if n == name}
           for rank, ids in told.items()}
    dumps = {rank: SimpleNamespace(pg_status={key: None for key in keys[rank]}) for rank in told}
    _take_like_ranks_ids(own, {rank: list(names) for rank in told}, {gid: ("x", 2) for gid in names}, names, dumps)
    return {rank: {names[gid]: pg_id for gid, pg_id in ids.items()} for rank, ids in own.items()}


def test_ranks_whose_rows_have_other_keys_are_not_like_ranks():
    # As the two pipeline stages of the real NVRx dumps: the same families of groups, but
    # one stage made an unnamed group more (an id more, its rows' keys other): rank 1's id
    # for group 7 is not rank 0's, though rank 0 has a row under it.
    keys = {0: {0, 1, 2, 3, 4}, 1: {0, 1, 2, 4, 5}}
    assert _like_ranks({0: {"0": 0, "3": 1}, 1: {"0": 0, "3": 1, "7": 4}}, keys)[0] == {"0": 0, "3": 1}
    keys[0] = keys[1]
    assert _like_ranks({0: {"0": 0, "3": 1}, 1: {"0": 0, "3": 1, "7": 4}}, keys)[0] == {"0": 0, "3": 1, "7": 4}


@pytest.mark.parametrize("told", [
    {1: {"0": 0, "5": 3}, 2: {"0": 0, "7": 3}},  # one id at two places
    {1: {"0": 0, "5": 4}, 2: {"0": 0, "7": 3}},  # ids that fall as the places grow
])
def test_like_ranks_whose_ids_cannot_be_one_order_of_making_give_none(told):
    keys = {rank: {0, 1, 2, 3, 4} for rank in (0, 1, 2)}
    assert _like_ranks({0: {"0": 0}, **told}, keys)[0] == {"0": 0}


# --------------------------------------------------------------------------- ops queued in only-active dumps


@pytest.mark.parametrize("kind, world, tp, pp, culprit, seed, p2p, buffer_size", [
    ("extra_op", 16, 4, 2, 5, 57, "plain", 2000),
    ("skip_op", 12, 2, 3, 6, 22, "mixed", 150),
    ("skip_op", 32, 4, 4, 14, 24, "batched", 150),
])
@pytest.mark.parametrize("step", [1, 2])
def test_a_dp_fault_with_ops_queued_behind_it_is_blamed_in_only_active_dumps(kind, world, tp, pp, culprit, seed, p2p,
                                                                            buffer_size, step):
    # Ranks enqueued ops behind the one they block in. The device view leaves those out;
    # a rank that held some of a group's ops and left the op its peers wait in out as
    # queued never started it (its pg_status says it finished less). Before, it was
    # "unknown" (inconclusive), and its sibling groups' pg_status went unread, so a tie in
    # a two-rank DP group went to the wrong side once it was read.
    job = generate(world, tp, pp, steps=3, fault=Fault(kind, rank=culprit, group="dp", step=step), seed=seed,
                   timing=True, lookahead=4 if kind == "skip_op" and seed != 24 else 2, p2p=p2p, buffer_size=buffer_size,
                   only_active=True, **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (job.truth["status"], job.truth["suspect_ranks"]) == (
        "faults", [culprit])


def test_a_rank_holding_the_op_queued_is_said_never_to_have_started_it():
    job = generate(16, 4, 2, steps=3, fault=Fault("extra_op", rank=5, group="dp", step=1), seed=57, timing=True,
                   lookahead=2, p2p="plain", only_active=True, **FAITHFUL)
    analysis, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    queued = [f for f in diagnosis.findings if f.evidence.get("queued_ranks")]
    assert queued, [f.message for f in diagnosis.findings]
    for finding in queued:
        ranks = finding.evidence["queued_ranks"]
        dumped = analysis.matches.index.at.get((finding.group_id, finding.collective_seq_id))
        assert all(rank in dumped.calls for rank in ranks)  # its whole dump holds an op of that number
        assert "never started" in finding.message or "queued behind" in finding.message
        assert not any(f"rank {rank} never issued" in finding.message for rank in ranks)


@pytest.mark.parametrize("tp, p2p, seed, culprits, named", [
    # Rank 0's host ran its DP all_to_all, then blocked in its TP all_reduce; ranks 5-7,
    # rank 4's TP peers in the other stage, wait in that stage's TP all_reduce, which
    # comes before the DP all_to_all there (their fellow members of it never issued theirs
    # either). Rank 4's stall shows in nothing its dump keeps (its peers never sent it
    # what it waits for): the truth names it, the dumps cannot.
    (4, "plain", 253, (0, 4), (0,)),
    # Rank 6 waits in its stage's TP all_reduce for rank 7, which waits for a send from
    # rank 5; its DP peers finished that all_reduce before their all_to_all.
    (2, "batched", 905, (5, 8), (5, 8)),
])
def test_a_device_stall_in_another_stage_says_nothing_of_where_an_op_comes_in_this_one(tp, p2p, seed, culprits, named):
    # Two ranks stop completing GPU work (16 ranks, PP 2, only-active dumps). The like
    # rank of a rank waiting in its TP all_reduce, in a sibling DP group of the other
    # stage, ran its DP all_to_all before the all_reduce: read as the rank's, the rank was
    # said to have gone past its all_to_all, and was blamed with the culprits.
    job = generate(world_size=16, tp=tp, pp=2, steps=3, fault=Fault("gpu_error", rank=culprits[1], group="dp", step=1 + seed % 2,
                                                                       ranks=culprits), timing=True, p2p=p2p,
                   only_active=True, seed=seed, **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert job.truth["suspect_ranks"] == list(culprits)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", named)


@pytest.mark.parametrize("tp, group, seed, culprits", [
    (4, "tp", 471, (10, 12)),  # a stall in each stage: the stage-1 culprit's recv from stage 0 never finished
    (2, "pp", 745, (14, 15)),  # both TP ranks of a stage: their recvs from stage 0 never finished
])
def test_a_recv_whose_like_ranks_finished_theirs_is_not_blamed_on_its_sender(tp, group, seed, culprits):
    # Two GPUs stop completing work (16 ranks, PP 2, only-active dumps). A culprit of
    # stage 1 holds its recv from stage 0 unfinished, and its sender waits in a recv from
    # it: a circle of two findings, "the sender never posted its send" and "the culprit
    # never posted its own", that only the ops' ages told apart: the older named the
    # sender. The sender's like rank in a sibling pipeline waits in the same op of the same
    # number, and its partner there finished its recv of that number (its pg_status says
    # so): the send was posted, and the culprit's recv is what never finished.
    job = generate(world_size=16, tp=tp, pp=2, steps=3, timing=True, p2p="plain", only_active=True, seed=seed,
                   fault=Fault("gpu_error", rank=culprits[0], group=group, step=1 + seed % 2, ranks=culprits),
                   **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert job.truth["suspect_ranks"] == list(culprits)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", culprits)
    belied = [f for f in diagnosis.findings if f.partner_posted is not None]
    assert belied and all(f.p2p_ends is not None and f.p2p_ends.posted_by in culprits for f in belied)
    assert all("it is rank" in f.message and "op that never finished" in f.message for f in belied)


@pytest.mark.parametrize("only_active", [False, True])
@pytest.mark.parametrize("world, tp, pp, culprits", [(16, 2, 2, (10, 15)), (16, 4, 2, (3, 8))])
def test_two_hosts_that_stop_at_once_are_named_without_their_victims(world, tp, pp, culprits, only_active):
    # Two hosts stop issuing at once (NVRx's LOCK_GIL), each at the step's collective of its
    # own DP group: a root finding each. Neither issued the job-wide all_reduce either, nor
    # did their DP peers, which wait in the DP collective: an even split whose free ranks
    # (waiting nowhere) are the two culprits, each blamed by a different root. It was read
    # as a root of its own, blaming every rank that had not arrived.
    synth_job = generate(world, tp=tp, pp=pp, steps=3, timing=True, only_active=only_active, seed=3,
                         fault=Fault("hang", rank=culprits[0], group="dp", step=1, ranks=culprits), **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(synth_job.dumps), render=False)
    assert synth_job.truth["suspect_ranks"] == list(culprits)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", culprits)
    roots = [f for f in diagnosis.findings if f.is_root and f.suspect_ranks]
    assert sorted(r for f in roots for r in f.suspect_ranks) == list(culprits)
    job_wide = [f for f in diagnosis.findings if f.pg_desc == "default_pg" and f.kind == "not_issued"]
    assert job_wide and all(f.link == "same_suspects" for f in job_wide)


@pytest.mark.parametrize("world, tp, pp, shape, culprit, seed, lookahead, p2p", [
    (8, 2, 1, {}, 2, 187, 2, "plain"), (8, 2, 1, {}, 3, 637, 0, "batched"), (8, 2, 4, {"ring": True}, 3, 481, 2, "mixed")])
def test_a_group_of_one_rank_takes_no_row_from_the_group_a_rank_holds_nothing_of(world, tp, pp, shape, culprit, seed,
                                                                                  lookahead, p2p):
    """Hashed group names made in each rank's own order: a rank's only pg_status key left
    unplaced is its TP group's, not that of its pipeline or DP group of one rank, which
    never ran an op (a row is made by a group's first op). Its like ranks' TP rows then
    show that they ran the op the culprit skipped, so the culprit is named, not its
    partner waiting in the op."""
    job = generate(world, tp, pp, steps=3, fault=Fault("skip_op", rank=culprit, group="tp", step=1 + seed % 2),
                   timing=True, p2p=p2p, only_active=True, seed=seed, lookahead=lookahead, pg_order="rotated",
                   hashed_names=True, **FAITHFUL, **shape)
    assert job.truth["suspect_ranks"] == [culprit]
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == ("faults", [culprit])


def test_a_group_of_one_rank_keeps_its_chance_of_a_row_where_no_dump_shows_the_wider_group_running():
    """A rank with one key left for a group of one rank and a group of two: the key goes
    to the pair only where some dump shows the pair's family running; an unused pair and a
    group of one rank that ran ops would otherwise swap rows."""
    alone = Group(7, "7", "pp", (4,), 1, "pg_config")
    pair = Group(3, "3", "tp", (4, 5), 2, "pg_config")
    assert _may_have_rows([alone, pair], {family_of(pair)}) == [3]
    assert _may_have_rows([alone, pair], set()) == [7, 3]
    assert _may_have_rows([pair], {family_of(pair)}) == [3]
