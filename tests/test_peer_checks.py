"""The checks PyTorch's own analyzer makes beyond order and op names (issue 29), each on a
faulty job and a healthy twin that must stay healthy: P2P pair sizes and dtypes, an
all_to_all's exchange as a whole, entries that contradict their own op and group size,
and entries whose fields come in other shapes (compared as far as they can be read;
never "agreed" where nothing could be). Every case asserts status, suspects, the rule
and the exit code of the CLI."""

import pytest
from helpers import analyse_dicts, dump, entry, job, run_cli, write_job

AR = "all_reduce"
RUNNING = {"state": "started"}
QUEUED = {"state": "scheduled"}


def _verdict(dumps: dict, tmp_path) -> tuple:
    """(diagnosis, the CLI's exit code) of a job."""
    _, diagnosis = analyse_dicts(dumps)
    result = run_cli([write_job(tmp_path / "job", dumps), "--workers", "1"])
    return diagnosis, result.exit_code


def _rules(diagnosis) -> set:
    return {f.rule for f in diagnosis.findings}


def _only(diagnosis, rule: str):
    (finding,) = [f for f in diagnosis.findings if f.rule == rule]
    return finding


# --------------------------------------------------------------------------- P2P sizes


def _pair(send: dict, recv: dict, recv_op: str = "recv 1<-0") -> dict:
    return job({0: [AR, ("send 0->1", send)], 1: [AR, (recv_op, recv)]})


@pytest.mark.parametrize("send, recv, recv_op, kind", [
    ({"sizes": ((4,),)}, {"sizes": ((8,),)}, "recv 1<-0", "size_mismatch"),
    ({"sizes": ((4,),)}, {"sizes": ((8,),), "state": "started"}, "recv 1<-?", "size_mismatch"),
    ({"sizes": ((4,),)}, {"sizes": ((4,),), "dtype": "BFloat16"}, "recv 1<-0", "dtype_mismatch"),
], ids=["sizes", "sizes-any-source", "dtypes"])
def test_a_send_and_its_recv_that_move_different_data_name_both_ends(send, recv, recv_op, kind, tmp_path):
    diagnosis, code = _verdict(_pair(send, recv, recv_op), tmp_path)
    finding = _only(diagnosis, "p2p_sizes.mismatched_pairs")
    assert (finding.kind, finding.suspect_ranks, finding.severity) == (kind, (0, 1), "error")
    assert "rank 0 sends 4 element(s)" in finding.message
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (0, 1), 1)


@pytest.mark.parametrize("recv_op, state", [("recv 1<-0", None), ("recv 1<-?", "completed")])
def test_a_send_and_its_recv_that_agree_stay_healthy(recv_op, state, tmp_path):
    recv = {"sizes": ((2, 2),)} | ({"state": state} if state else {})  # as many elements, another shape
    diagnosis, code = _verdict(_pair({"sizes": ((4,),)}, recv, recv_op), tmp_path)
    assert (diagnosis.status, diagnosis.findings, code) == ("healthy", [], 0)


def _ring_steps(skip: bool) -> dict:
    """Rank 0 sends rank 1 activations in a period of three (A, A, B); with `skip` it
    leaves out the second B: its next send (an A) pairs with rank 1's recv of that B."""
    a, b = {"sizes": ((4, 8),)}, {"sizes": ((2, 4, 8),)}
    sizes = [a, a, b] * 4
    skipped = 5
    sends = sizes[:skipped] + sizes[skipped + 1:] if skip else sizes

    def state(k: int) -> str:
        return "completed" if k < skipped or not skip else "started" if k == skipped else "scheduled"

    sent = [("send 0->1", dict(s, state=state(k))) for k, s in enumerate(sends)]
    taken = [("recv 1<-0", dict(s, state=state(k))) for k, s in enumerate(sizes)]
    return job({0: [AR] + sent, 1: [AR] + taken})


def test_a_rank_that_skipped_one_send_is_blamed_not_its_partner(tmp_path):
    diagnosis, code = _verdict(_ring_steps(skip=True), tmp_path)
    finding = _only(diagnosis, "p2p_sizes.skipped_one")
    assert (finding.kind, finding.suspect_ranks, finding.p2p_ends.missing_on) == ("p2p_unmatched", (0,), 0)
    assert "it skipped one" in finding.message
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (0,), 1)


def test_an_odd_send_among_alike_ones_is_no_skip_of_its_partner(tmp_path):
    """Every step moves A, but rank 0 sends a C once: rank 1's recvs line up with rank 0's
    sends shifted by one, yet C is no step of the program it could have skipped."""
    a, c = {"sizes": ((4,),)}, {"sizes": ((9,),)}
    sends = [a, a, c, a, a, a]

    def state(k: int) -> str:
        return "completed" if k < 2 else "started" if k == 2 else "scheduled"

    dumps = job({0: [AR] + [("send 0->1", dict(s, state=state(k))) for k, s in enumerate(sends)],
                 1: [AR] + [("recv 1<-0", dict(a, state=state(k))) for k in range(5)]})
    diagnosis, code = _verdict(dumps, tmp_path)
    finding = _only(diagnosis, "p2p_sizes.mismatched_pairs")
    assert (finding.kind, finding.suspect_ranks) == ("size_mismatch", (0, 1))
    assert (diagnosis.status, code) == ("faults", 1)


def test_a_ring_of_uneven_steps_in_order_stays_healthy(tmp_path):
    diagnosis, code = _verdict(_ring_steps(skip=False), tmp_path)
    assert (diagnosis.status, code) == ("healthy", 0)


# --------------------------------------------------------------------------- all_to_all as a whole


def _a2a(sizes: dict, op: str = "all_to_all_single", state: str = "started") -> dict:
    """rank -> its all_to_all's fields (input_sizes, output_sizes, splits ...): split sizes
    come with dump format 2.11."""
    dumps = job({r: [AR, (op, dict(fields, state=state))] for r, fields in sizes.items()})
    if any("input_split_sizes" in fields for fields in sizes.values()):
        for data in dumps.values():
            data["version"] = "2.11"
    return dumps


def test_an_all_to_all_whose_totals_differ_is_a_fault_of_the_group(tmp_path):
    diagnosis, code = _verdict(_a2a({0: {"input_sizes": [[8]], "output_sizes": [[8]]},
                                     1: {"input_sizes": [[4]], "output_sizes": [[8]]}}), tmp_path)
    finding = _only(diagnosis, "all_to_all.totals")
    assert (finding.kind, finding.suspect_ranks, finding.evidence["tie"]) == ("size_mismatch", (0, 1), True)
    assert finding.evidence["stuck_ranks"] == [0, 1]  # stuck in it: no separate `stuck` finding
    assert "frontier.stuck" not in _rules(diagnosis)
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (0, 1), 1)


def test_an_all_to_all_every_member_completed_blames_nobody(tmp_path):
    # The dumps say every member finished it: whatever its sizes, it holds no rank up.
    diagnosis, code = _verdict(_a2a({0: {"input_sizes": [[8]], "output_sizes": [[8]]},
                                     1: {"input_sizes": [[4]], "output_sizes": [[8]]}}, state="completed"), tmp_path)
    finding = _only(diagnosis, "all_to_all.totals")
    assert (finding.kind, finding.severity, finding.suspect_ranks) == ("size_mismatch", "warning", ())
    assert finding.evidence["completed_by_all"] and "tie" not in finding.evidence
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("inconclusive", (), 3)


def _moe_steps(culprit=None) -> dict:
    """rank -> ops of a 4-rank expert group: a token dispatch whose sizes differ per rank
    (their totals add up), then the combine that sends the tokens back. `culprit` leaves
    out the dispatch: its combine meets its peers' dispatch, which every member completes
    (the dumps cannot tell it apart by its sizes), then it exchanges the token counts
    (Long) where its peers combine, and the group blocks there."""
    dispatch = {0: (8, 6), 1: (4, 6), 2: (6, 8), 3: (6, 4)}  # rank -> (elements sent, received)

    def a2a(sent, received, dtype, state):
        return ("all_to_all_single", {"input_sizes": [[sent]], "output_sizes": [[received]], "dtype": dtype, "state": state})

    steps = {}
    for rank, (sent, received) in dispatch.items():
        combine = "completed" if culprit is None else "started"
        steps[rank] = [AR, a2a(sent, received, "BFloat16", "completed"), a2a(received, sent, "BFloat16", combine)]
    if culprit is not None:
        sent, received = dispatch[culprit]
        steps[culprit] = [AR, a2a(received, sent, "BFloat16", "completed"), a2a(16, 16, "Long", "started")]
    return steps


def test_a_rank_that_left_out_an_uneven_all_to_all_is_named_where_its_peers_block(tmp_path):
    healthy, code = _verdict(job(_moe_steps()), tmp_path / "healthy")
    assert (healthy.status, code) == ("healthy", 0)
    diagnosis, code = _verdict(job(_moe_steps(culprit=2)), tmp_path / "skip")
    totals = _only(diagnosis, "all_to_all.totals")
    assert (totals.collective_seq_id, totals.severity, totals.suspect_ranks) == (2, "warning", ())
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (2,), 1)


def _splits(send: list) -> dict:
    """rank -> all_to_all_single fields (dump format 2.11) for `send[i][j]` elements from i to j."""
    members = range(len(send))
    return {i: {"input_sizes": [[sum(send[i])]], "output_sizes": [[sum(send[k][i] for k in members)]],
                "input_split_sizes": list(send[i]), "output_split_sizes": [send[k][i] for k in members]}
            for i in members}


def test_split_sizes_name_the_member_whose_splits_disagree_with_every_peer(tmp_path):
    fields = _splits([[2, 2, 2], [2, 2, 2], [2, 2, 2]])
    fields[2]["input_split_sizes"] = [1, 3, 2]  # what rank 2 sends: its total (6) is unchanged
    dumps = _a2a(fields)
    diagnosis, code = _verdict(dumps, tmp_path)
    finding = _only(diagnosis, "all_to_all.split_pairs")
    assert (finding.kind, finding.suspect_ranks) == ("size_mismatch", (2,))
    assert {(p["src"], p["dst"]) for p in finding.evidence["pairs"]} == {(2, 0), (2, 1)}
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (2,), 1)
    # Before format 2.11 no dump holds them: the fields are not even looked for.
    for data in dumps.values():
        data["version"] = "2.10"
    assert "all_to_all.split_pairs" not in _rules(analyse_dicts(dumps)[1])


def test_a_list_form_all_to_all_names_the_mismatched_pair(tmp_path):
    sizes = {0: {"input_sizes": [[2], [3]], "output_sizes": [[2], [2]]},
             1: {"input_sizes": [[2], [2]], "output_sizes": [[4], [2]]}}  # takes 4 from rank 0, which sends 3
    diagnosis, code = _verdict(_a2a(sizes, "all_to_all"), tmp_path)
    finding = _only(diagnosis, "all_to_all.split_pairs")
    assert finding.evidence["pairs"] == [{"src": 0, "dst": 1, "sent": 3, "received": 4}]
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (0, 1), 1)


@pytest.mark.parametrize("with_splits", [False, True])
def test_an_uneven_moe_all_to_all_that_adds_up_stays_healthy(with_splits, tmp_path):
    send = [[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8], [9, 7, 9, 3]]  # every member's totals differ
    fields = _splits(send)
    if not with_splits:
        for f in fields.values():
            del f["input_split_sizes"], f["output_split_sizes"]
    diagnosis, code = _verdict(_a2a(fields, state="completed"), tmp_path)
    assert (diagnosis.status, diagnosis.findings, code) == ("healthy", [], 0)


def test_an_uneven_list_form_all_to_all_that_adds_up_stays_healthy(tmp_path):
    sizes = {0: {"input_sizes": [[2], [3]], "output_sizes": [[2], [2]]},
             1: {"input_sizes": [[2], [2]], "output_sizes": [[3], [2]]}}
    diagnosis, code = _verdict(_a2a(sizes, "all_to_all", state="completed"), tmp_path)
    assert (diagnosis.status, code) == ("healthy", 0)


# --------------------------------------------------------------------------- entries that contradict themselves


def _alike(op: str, world: int = 4, backend: str = "nccl", **fields) -> dict:
    """Every rank records `op` alike (with `fields`), between two all_reduces."""
    return job({r: [AR, (op, dict(fields, state="completed")), AR] for r in range(world)}, backend=backend)


@pytest.mark.parametrize("op, fields, said", [
    ("all_reduce", {"input_sizes": [[4, 4]], "output_sizes": [[5, 4]]}, "an all_reduce's output is its input"),
    ("all_reduce", {"output_dtypes": ["Half"]}, "input dtype Float but output dtype Half"),
    ("_all_gather_base", {"input_sizes": [[4]], "output_sizes": [[4]]}, "not the group size 4 x the input's 4"),
    ("all_gather", {"input_sizes": [[4]], "output_sizes": [[4]] * 3, "output_dtypes": ["Float"] * 3},
     "3 output buffers for 1 input(s) in a group of 4"),
    ("reduce_scatter", {"input_sizes": [[4]] * 2, "output_sizes": [[4]], "input_dtypes": ["Float"] * 2},
     "2 input buffers for 1 output(s) in a group of 4"),
], ids=["all_reduce-sizes", "all_reduce-dtypes", "all_gather-into-tensor", "all_gather-list", "reduce_scatter-list"])
def test_an_entry_every_rank_recorded_alike_that_contradicts_its_op_is_a_warning(op, fields, said, tmp_path):
    diagnosis, code = _verdict(_alike(op, **fields), tmp_path)
    finding = _only(diagnosis, "entry_checks.inconsistent_entries")
    assert (finding.kind, finding.severity, finding.suspect_ranks, finding.ranks) == ("inconsistent_entry", "warning",
                                                                                    (), (0, 1, 2, 3))
    assert (finding.collective_seq_id, finding.op) == (2, op) and said in finding.message
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("inconclusive", (), 3)


@pytest.mark.parametrize("op, backend, fields", [
    ("_all_gather_base", "nccl", {"input_sizes": [[4]], "output_sizes": [[16]]}),  # all_gather_into_tensor
    ("all_gather", "nccl", {"input_sizes": [[4]], "output_sizes": [[4]] * 4, "output_dtypes": ["Float"] * 4}),
    ("reduce_scatter_tensor_coalesced", "nccl", {"input_sizes": [[8], [16]], "output_sizes": [[2], [4]],
                                                  "input_dtypes": ["Float"] * 2, "output_dtypes": ["Float"] * 2}),
    ("all_gather", "gloo", {"input_sizes": [[2]], "output_sizes": [[1, 2]]}),  # gloo's all_gather_coalesced
    ("all_gather", "gloo", {"input_sizes": [[4]], "output_sizes": [[4, 4]]}),  # gloo's all_gather_into_tensor
    ("all_reduce", "gloo", {"input_sizes": [[16]], "output_sizes": [[4]]}),  # a reduce_scatter, as gloo records it
], ids=["all_gather_into_tensor", "all_gather-list", "reduce_scatter-coalesced", "gloo-all_gather_coalesced",
        "gloo-stacked", "gloo-reduce_scatter"])
def test_entries_c10d_really_records_stay_healthy(op, backend, fields, tmp_path):
    dumps = _alike(op, backend=backend, **fields)
    if backend == "gloo":  # gloo's pg_config says nothing: membership comes from the entries
        for data in dumps.values():
            data["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
    diagnosis, code = _verdict(dumps, tmp_path)
    assert "entry_checks.inconsistent_entries" not in _rules(diagnosis)
    assert (diagnosis.status, code) == ("healthy", 0)


def test_an_even_split_is_broken_by_the_camp_whose_entry_contradicts_its_op(tmp_path):
    dumps = job({0: [AR, (AR, {"sizes": ((4, 4),)})], 1: [AR, (AR, {"sizes": ((4, 4),), "output_sizes": [[5, 4]]})]})
    diagnosis, code = _verdict(dumps, tmp_path)
    finding = _only(diagnosis, "divergence.mismatch")
    assert (finding.kind, finding.suspect_ranks, finding.evidence["tie"]) == ("size_mismatch", (1,), False)
    assert "output is its input" in finding.evidence["tie_broken_by_contradiction"]
    assert "[[4, 4]] -> [[5, 4]]" in finding.message  # the two entries do not read alike
    assert (diagnosis.status, diagnosis.suspect_ranks, code) == ("faults", (1,), 1)


def test_a_coalesced_batch_mismatch_shows_the_ops_that_differ(tmp_path):
    def batch(second: tuple) -> list:
        return [entry(1, "_broadcast_oop", record_id=0, sizes=((4, 4),)),
                entry(1, "_broadcast_oop", record_id=1, sizes=second),
                entry(1, "ALLGATHER_coalesced", record_id=2, sizes=())]
    dumps = {r: dump(batch(((5, 5),) if r == 2 else ((4, 4),)), ranks=range(3)) for r in range(3)}
    diagnosis, _ = _verdict(dumps, tmp_path)
    finding = _only(diagnosis, "divergence.mismatch")
    assert finding.suspect_ranks == (2,) and finding.evidence["batch_position"] == 1
    assert "rank 2 issued _broadcast_oop [[5, 5]]" in finding.message
    assert [c["entry"] for c in finding.evidence["classes"]] == ["_broadcast_oop [[4, 4]] Float",
                                                                "_broadcast_oop [[5, 5]] Float"]


# --------------------------------------------------------------------------- fields in other shapes


def _torch_style(ops: list, **odd) -> dict:
    """Two ranks' entries as torch's analyzer tests write them: dtypes as one bare name,
    sequence numbers as strings, no pg_id or op_id."""
    dumps = {}
    for rank, (op, ins, outs) in enumerate(ops):
        record = {"record_id": 0, "profiling_name": f"nccl:{op}", "state": "completed", "process_group": ("0", "default"),
                  "input_sizes": ins, "output_sizes": outs, "input_dtypes": "float32", "output_dtypes": "float32",
                  "collective_seq_id": "1", "p2p_seq_id": "0", "time_created_ns": 0, "frames": [], "is_p2p": False}
        record.update(odd)
        dumps[rank] = {"entries": [record], "version": "2.8",
                       "pg_config": {"0": {"name": "0", "desc": "default", "ranks": "[0, 1]"}}}
    return dumps


def test_bare_dtype_names_and_string_numbers_are_read_and_compared(tmp_path):
    diagnosis, code = _verdict(_torch_style([("all_reduce", [[4, 4]], [[4, 4]]), ("all_gather", [[4, 4]], [[8, 4]])]),
                               tmp_path)
    finding = _only(diagnosis, "divergence.mismatch_tie")
    assert (finding.kind, finding.suspect_ranks) == ("op_mismatch", (0, 1))
    assert "float32" in finding.message
    assert (diagnosis.status, code) == ("faults", 1)
    assert not any(d.warnings for d in analyse_dicts(_torch_style([("all_reduce", [[4]], [[4]])] * 2))[0].dumps)


def test_bare_dtype_names_that_agree_stay_healthy(tmp_path):
    diagnosis, code = _verdict(_torch_style([("all_reduce", [[4, 4]], [[4, 4]])] * 2), tmp_path)
    assert (diagnosis.status, diagnosis.findings, code) == ("healthy", [], 0)


def test_unreadable_sizes_still_compare_the_op_names(tmp_path):
    dumps = _torch_style([("all_reduce", [[4, 4]], [[4, 4]]), ("all_gather", [[4, 4]], [[8, 4]])],
                         input_sizes={"not": "shapes"}, input_dtypes=7)
    diagnosis, code = _verdict(dumps, tmp_path)
    assert _only(diagnosis, "divergence.mismatch_tie").kind == "op_mismatch"
    assert (diagnosis.status, code) == ("faults", 1)


def test_unreadable_sizes_of_agreeing_ops_are_a_note_not_a_verdict(tmp_path):
    dumps = _torch_style([("all_reduce", [[4, 4]], [[4, 4]])] * 2, input_sizes={"not": "shapes"})
    diagnosis, code = _verdict(dumps, tmp_path)
    note = _only(diagnosis, "unchecked.unreadable_entries")
    assert (note.kind, note.severity, note.ranks) == ("not_compared", "info", (0, 1))
    assert "input_sizes" in note.message
    assert (diagnosis.status, code) == ("healthy", 0)


def test_ops_that_could_not_be_read_are_never_agreed(tmp_path):
    diagnosis, code = _verdict(_torch_style([("all_reduce", [[4]], [[4]])] * 2, profiling_name=5), tmp_path)
    finding = _only(diagnosis, "unchecked.unreadable_entries")
    assert (finding.kind, finding.severity, finding.suspect_ranks) == ("not_compared", "warning", ())
    assert "could not be checked" in finding.message and "not agreed" in finding.message
    assert (diagnosis.status, code) == ("inconclusive", 3)
