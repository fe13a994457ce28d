"""One small in-memory job per diagnosis rule (frtrace/diagnosis/*), run through the whole
pipeline: each asserts the finding's kind, the rule that made it, its suspects and the
diagnosis status. Jobs are built with `helpers.job`."""

import sqlite3

import pytest
from helpers import analyse_dicts, job, write_job

import frtrace.match.analysis
import frtrace.match.matcher
from frtrace.diagnosis import Finding, UnknownKind, diagnose, kind
from frtrace.export.sqlite import write_sqlite
from frtrace.match.analysis import analyze
from frtrace.report.render import report_dict

AR = ["all_reduce"]
DONE = ("all_reduce", {"state": "completed"})  # completed, though a member's dump does not show it
BIG = ("all_reduce", {"sizes": ((32,),)})
PROGRAM = ["all_reduce", "broadcast", "all_gather"]
TP_DP = {"tp01": ("tp", (0, 1)), "tp23": ("tp", (2, 3)), "tp45": ("tp", (4, 5)),
         "dp0": ("dp", (0, 2, 4)), "dp1": ("dp", (1, 3, 5))}


def _tp_dp_steps(rank: int, steps: int) -> list:
    """One training step of rank `rank` in TP_DP: its TP all_gather, then its DP all_reduce."""
    tp = f"tp{rank // 2 * 2}{rank // 2 * 2 + 1}"
    return [f"all_gather@{tp}", f"all_reduce@dp{rank % 2}"] * steps


def _tp_hang(queued: bool = False) -> dict:
    """Rank 1 stops after two steps; rank 0 waits in TP all_gather #3 for it, so it never
    reaches DP all_reduce #3 (with `queued`, its host enqueued that one behind: `scheduled`),
    where ranks 2-5 wait for them."""
    steps = {r: _tp_dp_steps(r, 3)[:-1] + [(f"all_reduce@dp{r % 2}", {"state": "started"})] for r in range(2, 6)}
    steps[1] = _tp_dp_steps(1, 2)
    steps[0] = _tp_dp_steps(0, 2) + ["all_gather@tp01"]
    if queued:
        steps[0].append(("all_reduce@dp0", {"state": "scheduled"}))
    return job(steps, groups=TP_DP)


def _timeout_ms(dumps: dict, timeout_ms: int) -> dict:
    """Every op of the job with this timeout (what the process group was created with)."""
    for dump in dumps.values():
        for record in dump["entries"]:
            record["timeout_ms"] = timeout_ms
    return dumps


def _ring_step(rank: int, step: int, state: tuple = (None, None)) -> list:
    """Rank `rank`'s ops of ring step `step` in a ring of four (a context-parallel group):
    it sends to the next rank and receives from the previous one, even ranks sending first;
    the steps' tensors alternate between 16 and 32 elements. `state` fixes the two ops'."""
    size = ((16,),) if step % 2 == 0 else ((32,),)
    send = (f"send {rank}->{(rank + 1) % 4}", {"sizes": size} | ({"state": state[0]} if state[0] else {}))
    recv = (f"recv {rank}<-{(rank - 1) % 4}", {"sizes": size} | ({"state": state[1]} if state[1] else {}))
    return [send, recv] if rank % 2 == 0 else [recv, send]


def _ring_same_sizes() -> dict:
    """Four ranks in a ring whose forward steps 0-3 move 16 elements and backward steps 4-5
    32: rank 2 leaves out step 1, and the ops are paired by the step they belong to, so its
    step-2 send and rank 3's step-1 recv, alike, are posted and never finish; ranks 0 and 1
    wait on ranks 3 and 2, who queued the ops they need behind; every host queued the rest
    of its ring. Only the queued ops show rank 2 a step ahead: its backward starts early."""
    def step(rank: int, number: int, state: tuple) -> list:
        size = ((16,),) if number < 4 else ((32,),)
        send = (f"send {rank}->{(rank + 1) % 4}", {"sizes": size, "state": state[0]})
        recv = (f"recv {rank}<-{(rank - 1) % 4}", {"sizes": size, "state": state[1]})
        return [send, recv] if rank % 2 == 0 else [recv, send]
    done, queued = ("completed", "completed"), ("scheduled", "scheduled")
    steps = {rank: step(rank, 0, done) for rank in range(4)}
    steps[0] += step(0, 1, ("completed", "started"))
    steps[1] += step(1, 1, ("started", "completed"))
    steps[2] += step(2, 2, ("started", "scheduled"))
    steps[3] += step(3, 1, ("scheduled", "started"))
    for rank in range(4):
        steps[rank] += [op for number in range(3 if rank == 2 else 2, 6) for op in step(rank, number, queued)]
    return job(steps)


def _ring(skip: bool = False, mid_transfer: bool = False) -> dict:
    """Four ranks run ring steps 0-2 alike. With `skip`, rank 2 leaves out step 3 (its send
    and its recv) and goes on to step 4, whose send its neighbour pairs with its own step-3
    recv: they disagree and hang there (both started), rank 0 and 1 wait on ranks 3 and 2
    for the step-3 ops these queued behind (scheduled); every host queued its next step
    too. `mid_transfer`: every rank is in its
    step-3 ops, posted on both ends, none finished (a healthy ring dumped mid-step)."""
    steps = {rank: [op for step in range(3) for op in _ring_step(rank, step)] for rank in range(4)}
    if skip:
        queued = ("scheduled", "scheduled")  # each host enqueued its next step behind the one it waits in
        steps[0] += _ring_step(0, 3, ("completed", "started")) + _ring_step(0, 4, queued)
        steps[1] += _ring_step(1, 3, ("started", "completed")) + _ring_step(1, 4, queued)
        steps[2] += _ring_step(2, 4, ("started", "scheduled")) + _ring_step(2, 5, queued)
        steps[3] += _ring_step(3, 3, ("scheduled", "started")) + _ring_step(3, 4, queued)
    elif mid_transfer:  # each host queued its next step too
        for rank in range(4):
            steps[rank] += _ring_step(rank, 3, ("started", "started")) + _ring_step(rank, 4, ("scheduled", "scheduled"))
    else:
        for rank in range(4):
            steps[rank] += _ring_step(rank, 3) + _ring_step(rank, 4)
    return job(steps)


def _without_pg_status(dumps: dict, rank: int) -> dict:
    dumps[rank].pop("pg_status", None)
    return dumps


def _version(version: str, dumps: dict) -> dict:
    for data in dumps.values():
        data["version"] = version
    return dumps


def _unreadable_op(dumps: dict) -> dict:
    """Every rank's last op, with a profiling name that is not a string."""
    for data in dumps.values():
        data["entries"][-1]["profiling_name"] = 5
    return dumps


def _late_rank_2() -> dict:
    groups = {"0": ("default_pg", range(4)), "1": ("tp", (0, 1)), "2": ("tp", (2, 3))}
    return job({r: ["all_reduce", f"all_gather@{1 + r // 2}"] * 5 for r in range(4)}, groups=groups, late_ms={2: 50})


CASES = {
    "size_mismatch": lambda: job({0: AR * 2, 1: AR * 2, 2: AR + [BIG], 3: AR * 2}),
    "dtype_mismatch": lambda: job({0: AR * 2, 1: AR * 2, 2: AR + [("all_reduce", {"dtype": "BFloat16"})], 3: AR * 2}),
    "skipped_one_op": lambda: job({0: PROGRAM, 1: PROGRAM, 2: PROGRAM, 3: ["all_reduce", "all_gather"]}),
    "added_one_op": lambda: job({0: ["all_reduce", "all_gather"], 1: PROGRAM, 2: ["all_reduce", "all_gather"],
                                 3: ["all_reduce", "all_gather"]}),
    "mismatch_tie": lambda: job({0: AR, 1: AR, 2: [BIG], 3: [BIG]}),
    # A rank's own counter has no gaps: one shows only where entries were lost, and then
    # its pg_status (which would say it finished #2) is no help either.
    "gap": lambda: _without_pg_status(job({0: AR * 3, 1: AR * 3, 2: AR + [("all_reduce", {"seq": 3})], 3: AR * 3}), 2),
    "never_issued": lambda: job({0: AR * 4, 1: AR * 4, 2: AR * 3, 3: AR * 4}),
    "went_ahead": lambda: job({0: AR * 3, 1: AR * 4, 2: AR * 3, 3: AR * 3}),
    # Every rank is in all_reduce #4 and none completed it; 10 ms later each enqueued the
    # next op, past the group's 5 ms timeout: a hang, not a job dumped mid-op.
    "stuck": lambda: _timeout_ms(job({r: AR * 3 + [("all_reduce", {"state": "started"}),
                                                    ("all_gather", {"state": "scheduled"})] for r in range(4)}), 5),
    # The same, rank 2's op never started (timing on): its GPU never reached it.
    "never_started": lambda: _timeout_ms(job({r: AR * 3 + [("all_reduce", {"state": "scheduled" if r == 2 else "started"}),
                                                            ("all_gather", {"state": "scheduled"})] for r in range(4)}), 5),
    "in_flight": lambda: job({r: AR * 3 + [("all_reduce", {"state": "started"})] for r in range(4)}),
    "skipped_ring_step": lambda: _ring(skip=True),
    "ring_mid_transfer": lambda: _ring(mid_transfer=True),
    "skipped_ring_step_same_sizes": _ring_same_sizes,
    "stuck_gloo": lambda: job({r: AR * 3 + [("all_reduce", {"state": "started"})] for r in range(4)}, backend="gloo"),
    "waited_on_without_dump": lambda: job({r: [DONE] * 2 + AR for r in range(3)}, world=4),
    "took_part_without_dump": lambda: job({r: [DONE] * 3 for r in range(3)}, world=4),
    "unmatched_send": lambda: job({0: AR + ["send 0->1"], 1: AR}),
    "late_arrivals": _late_rank_2,
    # Rank 3 is named only by a group nobody issued anything in (listed by two dumps:
    # one dump alone does not size the world).
    "unaccounted_missing": lambda: job({r: AR * 2 for r in range(3)},
                                       groups={"0": ("default_pg", (0, 1, 2)), "1": ("trio", (1, 2, 3))}),
    "empty_dump": lambda: job({0: [DONE] * 2, 1: [DONE] * 2, 2: [DONE] * 2, 3: []}),
    "tp_hang_stalls_dp": _tp_hang,
    "p2p_sizes": lambda: job({0: AR + [("send 0->1", {"sizes": ((4,),)})], 1: AR + [("recv 1<-0", {"sizes": ((8,),)})]}),
    # Rank 0 sends 12 elements in all, rank 1 takes 8 from it and 8 from itself: 16 received.
    "all_to_all_totals": lambda: job({0: AR + [("all_to_all_single", {"input_sizes": [[8]], "output_sizes": [[8]]})],
                                      1: AR + [("all_to_all_single", {"input_sizes": [[4]], "output_sizes": [[8]]})]}),
    "all_to_all_split_pairs": lambda: _version("2.11", job({
        r: AR + [("all_to_all_single", {"input_sizes": [[4]], "output_sizes": [[4]], "state": "started",
                                        "input_split_sizes": [1, 3] if r == 1 else [2, 2], "output_split_sizes": [2, 2]})]
        for r in range(2)})),
    # The same, every member having completed it: the job went on past it.
    "all_to_all_completed_by_all": lambda: _version("2.11", job({
        r: AR + [("all_to_all_single", {"input_sizes": [[4]], "output_sizes": [[4]], "state": "completed",
                                        "input_split_sizes": [1, 3] if r == 1 else [2, 2], "output_split_sizes": [2, 2]})]
        for r in range(2)})),
    "inconsistent_entry": lambda: job({r: AR + [("all_reduce", {"output_sizes": [[17]]})] for r in range(4)}),
    "not_compared": lambda: _unreadable_op(job({r: AR * 2 for r in range(4)})),
}


def run(case: str):
    return analyse_dicts(CASES[case]())


def only(diagnosis, rule: str) -> Finding:
    (finding,) = [f for f in diagnosis.findings if f.rule == rule]
    return finding


@pytest.mark.parametrize("case, rule, kind_name, suspects, severity, status", [
    ("size_mismatch", "divergence.mismatch", "size_mismatch", (2,), "error", "faults"),
    ("dtype_mismatch", "divergence.mismatch", "dtype_mismatch", (2,), "error", "faults"),
    ("skipped_one_op", "divergence.skipped_one_op", "not_issued", (3,), "error", "faults"),
    ("added_one_op", "divergence.added_one_op", "extra_op", (1,), "error", "faults"),
    ("mismatch_tie", "divergence.mismatch_tie", "size_mismatch", (0, 1, 2, 3), "error", "faults"),
    ("gap", "divergence.gap", "not_issued", (2,), "error", "faults"),
    ("never_issued", "divergence.never_issued", "not_issued", (2,), "error", "faults"),
    ("went_ahead", "divergence.went_ahead", "extra_op", (1,), "error", "faults"),
    ("stuck", "frontier.stuck", "stuck", (0, 1, 2, 3), "error", "faults"),
    ("never_started", "frontier.never_started", "stuck", (2,), "error", "faults"),
    # The same, with nothing in the dumps older than the timeout: it may be the moment of the dump.
    ("in_flight", "frontier.in_flight", "in_flight", (), "warning", "inconclusive"),
    ("skipped_ring_step", "p2p.skipped_ring_step", "not_issued", (2,), "error", "faults"),
    # The same when the pairs agree: only the ops rank 2 queued show it a step ahead.
    ("skipped_ring_step_same_sizes", "p2p.skipped_ring_step", "not_issued", (2,), "error", "faults"),
    # Sends and recvs posted on both ends that agree: a note, the ring may be mid-step.
    ("ring_mid_transfer", "p2p.posted_pair", "in_flight", (), "info", "healthy"),
    ("waited_on_without_dump", "frontier.waited_on_without_dump", "missing_dump", (3,), "error", "faults"),
    ("took_part_without_dump", "frontier.took_part_without_dump", "missing_dump", (), "warning", "inconclusive"),
    ("unmatched_send", "p2p.unmatched_p2p", "p2p_unmatched", (1,), "error", "faults"),
    # A straggler is a warning on a healthy job, never a FAULT on its own.
    ("late_arrivals", "stragglers.late_arrivals", "straggler", (2,), "warning", "healthy"),
    ("unaccounted_missing", "missing.unaccounted_missing_ranks", "missing_dump", (), "warning", "inconclusive"),
    ("empty_dump", "missing.empty_dumps", "no_entries", (), "info", "healthy"),
    ("p2p_sizes", "p2p_sizes.mismatched_pairs", "size_mismatch", (0, 1), "error", "faults"),
    ("all_to_all_totals", "all_to_all.totals", "size_mismatch", (0, 1), "error", "faults"),
    ("all_to_all_split_pairs", "all_to_all.split_pairs", "size_mismatch", (1,), "error", "faults"),
    ("all_to_all_completed_by_all", "all_to_all.split_pairs", "size_mismatch", (), "warning", "inconclusive"),
    # An entry no producer of torch's would write: the dumps cannot be taken at their word.
    ("inconsistent_entry", "entry_checks.inconsistent_entries", "inconsistent_entry", (), "warning", "inconclusive"),
    ("not_compared", "unchecked.unreadable_entries", "not_compared", (), "warning", "inconclusive"),
])
def test_each_rule_names_its_kind_suspects_and_status(case, rule, kind_name, suspects, severity, status):
    _, diagnosis = run(case)
    finding = only(diagnosis, rule)
    assert (finding.kind, finding.suspect_ranks, finding.severity) == (kind_name, suspects, severity)
    assert finding.is_root
    assert diagnosis.status == status
    assert diagnosis.suspect_ranks == (suspects if status == "faults" else ())


def test_a_member_whose_own_dump_records_no_starts_is_not_named_for_never_starting():
    # Timing can be set per group: where rank 2's dump shows no start anywhere, its op in
    # flight is `scheduled` whether or not its GPU got there. Every member stays a suspect.
    dumps = CASES["never_started"]()
    for record in dumps[2]["entries"]:
        record["time_discovered_started_ns"] = None
    _, diagnosis = analyse_dicts(dumps)
    assert not any(f.rule == "frontier.never_started" for f in diagnosis.findings)
    assert only(diagnosis, "frontier.stuck").suspect_ranks == (0, 1, 2, 3)


def test_stuck_without_progress_signals_is_a_note_not_a_fault():
    """gloo only retires ops: an op nobody retired may just be the moment of the dump."""
    _, diagnosis = run("stuck_gloo")
    finding = only(diagnosis, "frontier.stuck")
    assert (finding.kind, finding.severity, finding.suspect_ranks) == ("stuck", "info", ())
    assert diagnosis.status in ("healthy", "inconclusive")


def test_send_is_unmatched_on_the_rank_that_never_posted_the_recv():
    finding = only(run("unmatched_send")[1], "p2p.unmatched_p2p")
    assert (finding.p2p_ends.src, finding.p2p_ends.dst, finding.p2p_ends.posted_by, finding.p2p_ends.missing_on) == (0, 1, 0, 1)


def test_a_tp_hang_is_the_root_and_the_dp_group_it_stalls_a_blocked_consequence():
    _, diagnosis = run("tp_hang_stalls_dp")
    by_group = {f.pg_name: f for f in diagnosis.findings if f.rule == "divergence.never_issued"}
    tp, dp = by_group["tp01"], by_group["dp0"]
    assert (tp.is_root, tp.suspect_ranks, tp.severity) == (True, (1,), "error")
    assert dp.caused_by is tp
    assert (dp.link, dp.severity, dp.suspect_ranks, dp.is_root) == ("blocked", "warning", (), False)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (1,)


def test_missing_rank_is_a_probable_victim_when_another_rank_is_blamed():
    dumps = job({0: AR * 2, 1: AR * 2, 2: AR}, groups={"0": ("default_pg", (0, 1, 2)), "1": ("trio", (1, 2, 3))})
    _, diagnosis = analyse_dicts(dumps)
    note = only(diagnosis, "missing.unaccounted_missing_ranks")
    assert (note.kind, note.severity, note.ranks, note.suspect_ranks) == ("missing_dump", "info", (3,), ())
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (2,)


def test_a_rank_that_took_part_without_a_dump_is_reported_once():
    _, diagnosis = run("took_part_without_dump")
    about_3 = [f.rule for f in diagnosis.findings if 3 in f.ranks]
    assert about_3 == ["frontier.took_part_without_dump"]


# --------------------------------------------------------------------------- the kind table


def test_an_unregistered_kind_is_refused():
    assert kind("stuck").severity == "error"
    with pytest.raises(UnknownKind):
        kind("nope")
    with pytest.raises(UnknownKind):
        Finding(kind="nope", rule="tests.made_up", own_severity="error", group_id=None, pg_name="", pg_desc="", op=None,
                collective_seq_id=None, p2p_seq_id=None, ranks=(1,), own_suspects=(1,), statement="made up")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_finding_names_its_rule_in_the_json_report_and_sqlite(case, tmp_path):
    analysis, diagnosis = run(case)
    named = [(f.kind, f.rule) for f in diagnosis.findings]
    assert named and all(rule for _, rule in named)
    assert [(f["kind"], f["rule"]) for f in report_dict(analysis, diagnosis)["findings"]] == named
    path = tmp_path / "db.sqlite"
    write_sqlite(str(path), analysis, diagnosis)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT kind, rule FROM findings ORDER BY id").fetchall() == named


# --------------------------------------------------------------------------- one match per analysis


def test_the_matcher_runs_once_per_analysis_and_never_in_diagnosis(tmp_path, monkeypatch):
    calls = []
    phase = ["analyze"]

    def spy(name, real):
        def called(*args, **kwargs):
            calls.append((phase[0], name))
            return real(*args, **kwargs)
        return called

    match_spy = spy("match", frtrace.match.matcher.match)
    monkeypatch.setattr(frtrace.match.matcher, "match", match_spy)
    monkeypatch.setattr(frtrace.match.analysis, "match", match_spy)  # the pipeline's own name for it
    monkeypatch.setattr(frtrace.match.matcher, "build_views", spy("build_views", frtrace.match.matcher.build_views))

    analysis = analyze([write_job(tmp_path / "dumps", _tp_hang(queued=True))])
    assert analysis.device is not analysis.matches  # rank 0 queued an op: the device view was matched again
    phase[0] = "diagnose"
    diagnosis = diagnose(analysis)

    assert diagnosis.suspect_ranks == (1,)
    assert calls.count(("analyze", "match")) == 1 and ("analyze", "build_views") in calls
    assert [c for c in calls if c[0] == "diagnose"] == []


def _without_entries(dumps: dict) -> dict:
    for dump in dumps.values():
        dump.pop("entries")
    return dumps


def test_dumps_without_entries_blame_the_rank_pg_status_puts_behind():
    # The hang of rank 2 dumped with includeCollectives=False: only pg_status is left.
    _, diagnosis = analyse_dicts(_without_entries(job({0: AR * 4, 1: AR * 4, 2: AR * 3, 3: AR * 4})))
    finding = only(diagnosis, "status_only.positions_from_pg_status")
    assert (finding.kind, finding.suspect_ranks) == ("not_issued", (2,))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (2,))


def test_dumps_without_entries_that_agree_are_healthy_and_with_nothing_inconclusive():
    _, agreeing = analyse_dicts(_without_entries(job({r: AR * 4 for r in range(4)})))
    assert agreeing.status == "healthy"
    bare = _without_entries(job({r: AR * 4 for r in range(4)}))
    for dump in bare.values():
        dump.pop("pg_status")
    _, nothing = analyse_dicts(bare)
    assert nothing.status == "inconclusive"
    assert only(nothing, "status_only.positions_from_pg_status").severity == "warning"


def test_an_even_split_is_no_tie_when_the_absent_rank_waits_in_nothing():
    # Two members: rank 0 waits in its 4th all_reduce, rank 1 finished its 3 and issues nothing more.
    _, diagnosis = analyse_dicts(job({0: AR * 4, 1: AR * 3}))
    finding = only(diagnosis, "divergence.never_issued")
    assert (finding.suspect_ranks, finding.tie, finding.evidence["idle_ranks"]) == ((1,), False, [1])
    assert "even split" not in finding.message
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1,))


def _pair_tie(desc: str, other_pair: tuple[int, int] = (2, 3), other_desc: str = "") -> dict:
    # Ranks 0 and 1 disagree on their pair group's 2nd all_reduce; the other pair
    # issued it as rank 1 did.
    a, b = other_pair
    world = tuple(range(max(other_pair) + 1))
    groups = {"0": ("default_pg", world), "1": (desc, (0, 1)), "2": (other_desc or desc, other_pair)}
    pair = ["all_reduce@1", "all_reduce@1"]
    steps = {0: ["all_reduce@1", ("all_reduce@1", {"sizes": ((32,),)})], 1: pair,
             a: ["all_reduce@2", "all_reduce@2"], b: ["all_reduce@2", "all_reduce@2"]}
    return job({**{r: [] for r in world}, **steps}, groups=groups)


def _stage_pairs(culprit_skips: bool = True) -> dict:
    """Two pipeline stages of two TP pairs each (desc "tp" all four). Stage 0's pairs
    (ranks 0-3) alternate all_gather and reduce_scatter from #1; stage 1's (ranks 4-7) run
    one reduce_scatter more first (a stage's own ops, as the last stage's loss), so at each
    number they run the other op. Rank 1 skips stage 0's 7th op (an all_gather) and issues
    the reduce_scatter after it."""
    groups = {"0": ("default_pg", tuple(range(8))), "1": ("tp", (0, 1)), "2": ("tp", (2, 3)),
              "3": ("tp", (4, 5)), "4": ("tp", (6, 7))}
    stage0, stage1 = ["all_gather", "reduce_scatter"] * 3 + ["all_gather"], ["reduce_scatter", "all_gather"] * 3
    stage1 += ["reduce_scatter"]
    steps = {rank: [f"{op}@{rank // 2 + 1}" for op in (stage0 if rank < 4 else stage1)] for rank in range(8)}
    if culprit_skips:
        steps[1] = [f"{op}@1" for op in stage0[:6]] + ["reduce_scatter@1"]
    return job(steps, groups=groups)


def test_siblings_at_another_place_of_their_program_cast_no_vote():
    # At #7 rank 0 issued stage 0's all_gather, rank 1 the reduce_scatter after it. The
    # other stage 0 pair issued the all_gather; stage 1's two pairs a reduce_scatter, as at
    # every number theirs is the other op. Counted, they outvoted the pair in step and
    # blamed rank 0.
    _, diagnosis = analyse_dicts(_stage_pairs())
    finding = only(diagnosis, "divergence.mismatch")
    assert (finding.suspect_ranks, finding.evidence["tie_broken_by_sibling_groups"]) == ((1,), 1)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1,))
    _, healthy = analyse_dicts(_stage_pairs(culprit_skips=False))
    assert healthy.status == "healthy"



def test_a_rank_short_of_its_own_groups_place_for_an_op_did_not_go_past_it():
    # Stage 0 (TP pair 0,1) sends to stage 1 and receives back between its TP ops #2 and
    # #3; stage 1 (pair 2,3) runs #3 right after #2. Rank 3 stops issuing (it never
    # posts its recv), so rank 1 waits in its send and rank 0, past its own send and recv,
    # waits in #3. Stage 1's ranks issued #3 right after #2, where rank 1 issued its send:
    # read as ranks like it, they said rank 1 went past #3, and blamed it beside rank 3.
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("tp", (0, 1)), "2": ("tp", (2, 3)),
              "3": ("pp", (0, 2)), "4": ("pp", (1, 3))}
    first = ["all_gather@{}", "reduce_scatter@{}"]
    steps = {0: [op.format(1) for op in first] + ["send 0->1@3", "recv 0<-1@3", "all_gather@1"],
             1: [op.format(1) for op in first] + ["send 0->1@4"],
             2: [op.format(2) for op in first] + ["all_gather@2", "reduce_scatter@2", "recv 1<-0@3", "send 1->0@3"],
             3: [op.format(2) for op in first] + ["all_gather@2", "reduce_scatter@2"]}
    _, diagnosis = analyse_dicts(job(steps, groups=groups), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,))
    tp = only(diagnosis, "divergence.never_issued")
    assert (tp.is_root, dict(tp.went_past)) == (False, {})

def test_sibling_groups_break_a_tie_only_when_they_are_alike():
    _, described = analyse_dicts(_pair_tie("tp"))
    assert described.suspect_ranks == (0,)
    # torch's "undefined" says nothing of what a group is for, but two pairs of consecutive
    # ranks are laid out alike: the pairs of one mesh dimension, siblings.
    _, undescribed = analyse_dicts(_pair_tie("undefined"))
    assert undescribed.suspect_ranks == (0,)
    # Described apart, or spaced apart without a description: no sibling, so a tie.
    for other in (_pair_tie("tp", other_desc="dp"), _pair_tie("undefined", other_pair=(2, 4))):
        _, tie = analyse_dicts(other)
        assert tie.suspect_ranks == (0, 1)
        assert only(tie, "divergence.mismatch_tie").kind == "size_mismatch"


def _pairs_with_a_tie(wrapped_from: int) -> dict:
    """Three pairs (desc "dp") running one program; rank 1 issues an all_reduce where the
    program has its 7th op, an all_gather. The other pairs' rings keep only their ops from
    number `wrapped_from` on."""
    groups = {"0": ("default_pg", tuple(range(6))), "1": ("dp", (0, 1)), "2": ("dp", (2, 3)), "3": ("dp", (4, 5))}
    program = ["all_gather", "reduce_scatter", "all_reduce"] * 2 + ["all_gather"]
    steps = {rank: [f"{op}@{rank // 2 + 1}" for op in program] for rank in range(6)}
    steps[1][6] = "all_reduce@1"
    dumps = job(steps, groups=groups)
    for rank in range(2, 6):
        dumps[rank]["entries"] = [e for e in dumps[rank]["entries"] if e["collective_seq_id"] >= wrapped_from]
    return dumps


def test_sibling_groups_whose_rings_wrapped_still_break_a_tie():
    # The pair's last four agreed ops (#3-#6) place it in the program; the other pairs'
    # rings no longer hold #3 and #4, which says nothing against their being in step.
    for wrapped_from in (1, 5):
        _, diagnosis = analyse_dicts(_pairs_with_a_tie(wrapped_from))
        finding = only(diagnosis, "divergence.mismatch")
        assert (finding.suspect_ranks, finding.evidence["tie_broken_by_sibling_groups"]) == ((1,), 2)
        assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1,))
    # Holding only the last of those numbers, the other pairs are too little alike to vote.
    _, diagnosis = analyse_dicts(_pairs_with_a_tie(6))
    assert diagnosis.suspect_ranks == (0, 1)


def test_a_rank_whose_gpu_stalled_earlier_in_a_group_explains_its_absence_from_a_later_op():
    # Rank 3's GPU stopped at TP #1 (its host queued #2, its DP op and #3); rank 5's at EP
    # #1, so rank 1 waits in their DP op. At TP #3 ranks 0 and 2 wait, ranks 1 and 3 never
    # started it: rank 3 because of its own stall, rank 1 because it waits on rank 5. The
    # finding blamed ranks 1 and 3 as a root of its own.
    groups = {"0": ("default_pg", tuple(range(9))), "t": ("tp", (0, 1, 2, 3)), "d0": ("dp", (0, 4)), "d1": ("dp", (1, 5)),
              "d2": ("dp", (2, 6)), "d3": ("dp", (3, 7)), "e": ("ep", (5, 8))}
    done, queued = {"state": "completed"}, {"state": "scheduled"}
    steps = {r: ["all_reduce@t", ("all_reduce@t", done), f"all_reduce@d{r}", "all_reduce@t"] for r in (0, 2)}
    steps[1] = ["all_reduce@t", ("all_reduce@t", done), "all_reduce@d1"]
    steps[3] = [("all_reduce@t", {"state": "started"}), ("all_reduce@t", queued), ("all_reduce@d3", queued),
                ("all_reduce@t", queued)]
    steps.update({4: ["all_reduce@d0"], 6: ["all_reduce@d2"], 7: [("all_reduce@d3", done)]})
    steps[5] = [("all_reduce@e", {"state": "started"}), ("all_reduce@e", queued)]
    steps[8] = ["all_reduce@e", ("all_reduce@e", done)]
    _, diagnosis = analyse_dicts(job(steps, groups=groups))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3, 5))
    later = next(f for f in diagnosis.findings if f.rule == "divergence.never_issued" and f.pg_name == "t")
    assert (later.is_root, later.link, later.caused_by.rule) == (False, "same_suspects", "frontier.stuck_on_device")


def test_an_op_past_where_every_sibling_groups_ranks_stand_idle_is_the_issuers_extra_op():
    # Two model-parallel pairs run scalar all_reduces; rank 0 issues one more than the
    # program has (identical to the others, so nothing else shows it) and waits in it,
    # while its partner, rank 1, finished every op it issued. Alone that reads as rank 1
    # stopping (idle while its peer waits), but rank 3, in rank 1's place in the sibling
    # pair, stands idle at the same point and that pair never ran the op: it lies past the
    # end of this part of the program. Rank 2 waits in a data parallel op for rank 0.
    scalar = {"sizes": ((1,),)}
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "mp0": ("mp", (0, 1)), "mp1": ("mp", (2, 3)),
              "dp0": ("dp", (0, 2)), "dp1": ("dp", (1, 3))}
    steps = {
        0: ["all_reduce@dp0", ("all_reduce@mp0", scalar), ("all_reduce@mp0", scalar), ("all_reduce@mp0", scalar)],
        1: ["all_reduce@dp1", ("all_reduce@mp0", scalar), ("all_reduce@mp0", scalar), "all_reduce@dp1"],
        2: ["all_reduce@dp0", ("all_reduce@mp1", scalar), ("all_reduce@mp1", scalar), "all_reduce@dp0"],
        3: ["all_reduce@dp1", ("all_reduce@mp1", scalar), ("all_reduce@mp1", scalar), "all_reduce@dp1"],
    }
    _, diagnosis = analyse_dicts(job(steps, groups=groups), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (0,))
    (root,) = [f for f in diagnosis.findings if f.is_root and f.suspect_ranks]
    assert (root.kind, root.pg_name, root.collective_seq_id) == ("extra_op", "mp0", 3)
    assert root.facts["idle_like_their_places"]
    # Where the sibling pair's rank in rank 1's place still waits in an op, idleness is
    # rank 1's own: it stopped, as before.
    steps[3] = steps[3][:3] + [("all_reduce@mp1", scalar)]
    steps[2] = steps[2][:3]
    _, diagnosis = analyse_dicts(job(steps, groups=groups), render=False)
    assert 1 in diagnosis.suspect_ranks and 0 not in diagnosis.suspect_ranks


def _two_pipelines(skipped_recv: bool = False, ends_stopped_together: bool = False) -> dict:
    """Two 3-stage pipelines (pp groups pa and pb, each with an mp group of its stages),
    each stage 1 relaying 5 microbatches from stage 0 to stage 2, then an all_reduce in the
    mp group; the ring buffers wrapped (each rank's 2 oldest entries gone). Rank 3's host
    stops before pipeline b's all_reduce. Rank 1's GPU stops right after its last send
    moved its data: the send never looks finished, while rank 2, its other end, finished
    the recv and waits in the all_reduce rank 1 never issued, as rank 5 in its place does
    in pipeline b. With `skipped_recv`, rank 2 leaves its last recv out instead. With
    `ends_stopped_together`, ranks 2 and 5 are instead both in an all_reduce of a group of
    their own that neither finished (two GPUs that may have stopped in it together)."""
    groups = {"pa": ("pp", (0, 1, 2)), "pb": ("pp", (3, 4, 5)), "ma": ("mp", (0, 1, 2)), "mb": ("mp", (3, 4, 5)),
              "t": ("tp", (2, 5))}

    def relay(pipe: str, stopped: bool) -> list:
        last = (f"send 1->2@{pipe}", {"state": "started"}) if stopped else f"send 1->2@{pipe}"
        return [op for j in range(5) for op in (f"recv 1<-0@{pipe}", last if j == 4 else f"send 1->2@{pipe}")]

    steps = {
        0: ["send 0->1@pa"] * 5 + ["all_reduce@ma"],
        1: relay("pa", stopped=not skipped_recv),
        2: ["recv 2<-1@pa"] * (4 if skipped_recv else 5) + ["all_reduce@ma"],
        3: ["send 0->1@pb"] * 5,
        4: relay("pb", stopped=False) + ["all_reduce@mb"],
        5: ["recv 2<-1@pb"] * 5 + ["all_reduce@mb"],
    }
    if ends_stopped_together:
        steps[2][-1] = steps[5][-1] = ("all_reduce@t", {"state": "started"})
    dumps = job(steps, groups=groups, world=6)
    for dumped in dumps.values():
        dumped["entries"] = dumped["entries"][2:]
    return dumps


def test_the_other_end_that_went_on_as_its_like_rank_did_posted_the_partner_of_a_send_that_never_finished():
    # The channel's finished ops pair from the newest back (the buffers wrapped), one off
    # where the holder's last send never looks finished: read alone, rank 2 "never posted"
    # the recv. It posted as many as rank 5 in its place and waits in the all_reduce rank 1
    # never issued: rank 1's GPU stopped (`stuck`), rank 2 did nothing wrong.
    _, diagnosis = analyse_dicts(_two_pipelines(), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1, 3))
    stalled = only(diagnosis, "p2p.partner_went_on")
    assert stalled.kind == "stuck" and stalled.suspect_ranks == (1,) and stalled.is_root
    assert not [f for f in diagnosis.findings if f.kind == "p2p_unmatched" and f.is_root]
    # A recv really left out leaves rank 2 one short of its like rank: still its fault.
    _, diagnosis = analyse_dicts(_two_pipelines(skipped_recv=True), render=False)
    assert 2 in diagnosis.suspect_ranks and 1 not in diagnosis.suspect_ranks
    assert not [f for f in diagnosis.findings if f.rule == "p2p.partner_went_on"]
    # Ranks 2 and 5 in an op of their own that neither finished, one rank 1 is no member
    # of: they may have stopped there together, so how far they got says nothing.
    _, diagnosis = analyse_dicts(_two_pipelines(ends_stopped_together=True), render=False)
    assert not [f for f in diagnosis.findings if f.rule == "p2p.partner_went_on"]
