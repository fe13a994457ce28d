"""What PyTorch's NCCL Flight Recorder writes, on small jobs written here by hand: batched
P2P with its end marker, receivers posting first, pg_status behind a wrapped buffer,
only-active dumps, and watchdog-tick discovery times. Each case once misled frtrace on
dumps its team did not write (issue 13)."""

from __future__ import annotations

from helpers import analyse_dicts, entry

PP = ("1", "pp")
DP = ("2", "dp")
T0 = 1_760_000_000_000_000_000
MS = 1_000_000


def rec(record_id: int, op: str, *, seq: int, pg=("0", "default_pg"), pg_id: int = 0, p2p_seq: int = 0,
        state: str = "completed", t_ms: float = 0.0, **extra) -> dict:
    return entry(seq, op, record_id=record_id, pg=pg, pg_id=pg_id, p2p_seq=p2p_seq, state=state,
                 time_ns=T0 + int(t_ms * MS), frames=(), **extra)


def batch(first_record: int, ops: list[str], *, seq: int, p2p_seq: int, state: str, t_ms: float) -> list[dict]:
    """A batch_isend_irecv as torch records it: each op `scheduled` forever, then the
    `nccl:coalesced` marker (is_p2p False, the group's current collective_seq_id)
    holding the batch's state."""
    records = [rec(first_record + i, op, seq=seq, pg=PP, pg_id=1, p2p_seq=p2p_seq, state="scheduled", t_ms=t_ms)
               for i, op in enumerate(ops)]
    return records + [rec(first_record + len(ops), "coalesced", seq=seq, pg=PP, pg_id=1, p2p_seq=p2p_seq,
                          state=state, t_ms=t_ms)]


def dump(entries: list[dict], configs: dict, status: dict | None = None) -> dict:
    pg_config = {name: {"name": name, "desc": desc, "ranks": str(list(ranks))} for name, (desc, ranks) in configs.items()}
    return {"version": "2.10", "pg_config": pg_config, "pg_status": status or {}, "comm_lib_version": "2.27.5",
            "entries": entries}


PAIR = {"0": ("default_pg", (0, 1)), "1": ("pp", (0, 1))}


def test_a_healthy_batched_pipeline_is_healthy_though_its_ops_stay_scheduled():
    # The receiver posts its recv 120 ms before the sender's send; both batches completed.
    dumps = {
        0: dump([rec(0, "all_reduce", seq=1), *batch(1, ["send 0->1"], seq=1, p2p_seq=1, state="completed", t_ms=150)],
                PAIR),
        1: dump([rec(0, "all_reduce", seq=1), *batch(1, ["recv 1<-0"], seq=1, p2p_seq=1, state="completed", t_ms=30)],
                PAIR),
    }
    analysis, diagnosis = analyse_dicts(dumps)
    assert diagnosis.status == "healthy", diagnosis.verdict
    assert [(p.send is not None, p.recv is not None) for p in analysis.matches.p2p] == [(True, True)]
    # The markers are not collectives: group pp holds none.
    assert [m.group_id for m in analysis.matches.collectives] == [0]


def test_a_batch_marker_is_no_collective_and_a_send_never_received_blames_the_receiver():
    # Both ranks ran pp all_reduce #1; rank 0 then posted a batched send (its marker carries
    # collective_seq_id 1 too) that rank 1, which issues nothing more, never received.
    configs = PAIR
    dumps = {
        0: dump([rec(0, "all_reduce", seq=1, pg=PP, pg_id=1),
                 *batch(1, ["send 0->1"], seq=1, p2p_seq=1, state="started", t_ms=10)], configs),
        1: dump([rec(0, "all_reduce", seq=1, pg=PP, pg_id=1)], configs),
    }
    _, diagnosis = analyse_dicts(dumps)
    assert [f.kind for f in diagnosis.findings if f.is_root] == ["p2p_unmatched"]
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1,))


def test_pg_status_says_a_wrapped_rank_never_issued_the_collective_its_peers_wait_in():
    # dp = ranks 0-3. Rank 0's buffer wrapped past all its dp entries (it holds one newer
    # op of another group, finished); its pg_status says dp #89 was its last. Ranks 1-3
    # wait in dp #90.
    configs = {"0": ("default_pg", (0, 1, 2, 3)), "2": ("dp", (0, 1, 2, 3))}
    peers = {r: dump([rec(500 + i, "all_reduce", seq=88 + i, pg=DP, pg_id=2) for i in range(2)]
                     + [rec(502, "reduce_scatter", seq=90, pg=DP, pg_id=2, state="started")], configs,
                     {"2": {"last_enqueued_collective": 90, "last_started_collective": 90, "last_completed_collective": 89}})
             for r in (1, 2, 3)}
    rank_0 = dump([rec(900, "all_reduce", seq=7)], configs,
                  {"0": {"last_enqueued_collective": 7, "last_started_collective": 7, "last_completed_collective": 6},
                   "2": {"last_enqueued_collective": 89, "last_started_collective": 89, "last_completed_collective": 89}})
    _, diagnosis = analyse_dicts({0: rank_0, **peers})
    root = next(f for f in diagnosis.findings if f.is_root and f.group_id is not None and f.pg_name == "2")
    assert (root.kind, root.suspect_ranks, root.collective_seq_id) == ("not_issued", (0,), 90)
    assert not any(f.kind == "stuck" and f.suspect_ranks for f in diagnosis.findings)


def test_an_only_active_dump_names_every_rank_stuck_on_its_device():
    # Only active entries (gaps in record ids): ranks 0 and 2 still hold #5-#6 of the group,
    # which ranks 1 and 3 finished (pg_status) before going on to #7.
    configs = {"0": ("default_pg", (0, 1, 2, 3))}
    def holder(base: int) -> dict:
        return dump([rec(base, "all_reduce", seq=5, state="scheduled"), rec(base + 1, "all_reduce", seq=6, state="scheduled"),
                     rec(base + 5, "all_reduce", seq=7, state="scheduled")], configs,
                    {"0": {"last_enqueued_collective": 7, "last_started_collective": -1, "last_completed_collective": 4}})
    def mover(base: int) -> dict:
        return dump([rec(base, "all_reduce", seq=7, state="scheduled"), rec(base + 3, "all_gather", seq=8, state="scheduled")],
                    configs,
                    {"0": {"last_enqueued_collective": 8, "last_started_collective": -1, "last_completed_collective": 6}})
    _, diagnosis = analyse_dicts({0: holder(100), 1: mover(120), 2: holder(200), 3: mover(220)})
    stuck = [f for f in diagnosis.findings if f.rule == "frontier.stuck_on_device"]
    assert [(f.kind, f.suspect_ranks, f.collective_seq_id) for f in stuck] == [("stuck", (0, 2), 5)]
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (0, 2))


def test_watchdog_ticks_make_no_straggler_of_a_healthy_job():
    # Every rank enqueues each collective at the same moment; the watchdog discovers its
    # completion on a 100 ms grid with a phase of its own per rank.
    groups = {"0": ("default_pg", tuple(range(4))), "1": ("tp", (0, 1)), "2": ("tp", (2, 3))}
    phase_ms = {0: 7, 1: 93, 2: 41, 3: 66}
    dumps = {}
    for rank in range(4):
        records, tp = [], ("1", "tp") if rank < 2 else ("2", "tp")
        for i in range(12):
            created = 1000.0 * i
            tick = created + 100 - (created % 100) + phase_ms[rank]
            pg, pg_id = (("0", "default_pg"), 0) if i % 2 == 0 else (tp, 1)
            records.append(rec(i, "all_reduce", seq=i // 2 + 1, pg=pg, pg_id=pg_id, t_ms=created,
                               time_discovered_started_ns=T0 + int(tick * MS) - 100 * MS,
                               time_discovered_completed_ns=T0 + int(tick * MS)))
        dumps[rank] = dump(records, {name: conf for name, conf in groups.items() if rank in conf[1]})
    _, diagnosis = analyse_dicts(dumps)
    assert diagnosis.status == "healthy", diagnosis.verdict
    assert not any(f.kind == "straggler" for f in diagnosis.findings)


def test_an_only_active_dump_keeps_the_ops_of_finished_batches_and_they_are_no_fault():
    # Only active entries are kept (nothing is active), yet rank 0 still holds the send and
    # recv of two batches that finished: recorded without events they never look
    # finished, and their markers (records 42 and 46), which did, were left out. Rank 1's
    # own entries of those batches fell off its ring buffer.
    configs = {"0": ("default_pg", (0, 1)), "1": ("pp", (0, 1))}
    status: dict = {}  # and no pg_status to say so either
    held = [rec(record, op, seq=3, pg=PP, pg_id=1, p2p_seq=p2p, state="scheduled")
            for record, op, p2p in ((40, "send 0->1", 7), (41, "recv 0<-1", 7), (44, "send 0->1", 8), (45, "recv 0<-1", 8))]
    _, diagnosis = analyse_dicts({0: dump(held, configs, status), 1: dump([], configs, status)})
    assert not any(f.kind == "p2p_unmatched" for f in diagnosis.findings), diagnosis.verdict
    assert diagnosis.status == "healthy", diagnosis.verdict


def test_pg_status_in_collective_numbers_settles_p2p_ops_a_later_collective_followed():
    # Only active entries kept: rank 0 still holds single-op batches (their markers
    # finished and were left out: records 11 and 21 are gone) of its pp group, whose last
    # work was all_reduce #2 (pg_status 2 is below the ops' p2p #5 and #6, so it counts
    # collectives). The ops were issued under collective #1: a later collective of the
    # group finished after them, and the group's work finishes in order.
    configs = {"0": ("default_pg", (0, 1)), "1": ("pp", (0, 1))}
    status = {"1": {"last_enqueued_collective": 2, "last_started_collective": -1, "last_completed_collective": 2}}
    def rank(first: str, second: str) -> dict:
        return dump([rec(10, first, seq=1, pg=PP, pg_id=1, p2p_seq=5, state="scheduled"),
                     rec(20, second, seq=1, pg=PP, pg_id=1, p2p_seq=6, state="scheduled")], configs, status)
    # Rank 1's own ops of those batches all finished and were left out of its dump.
    _, diagnosis = analyse_dicts({0: rank("send 0->1", "recv 0<-1"), 1: dump([], configs, status)})
    assert not any(f.kind == "p2p_unmatched" for f in diagnosis.findings), diagnosis.verdict
    assert diagnosis.status == "healthy", diagnosis.verdict


def test_a_pg_status_mixing_p2p_and_collective_numbers_is_not_read_as_collectives():
    # Only active entries: rank 1 holds the pp group's all_reduce #2 and #3, pending; its
    # pg_status says 3 enqueued but 4 finished: the 4 is a P2P number (the group runs
    # sends and recvs too). Rank 0 holds nothing; its 4 is a P2P number as well, so it
    # does not say rank 0 finished all_reduce #2, and rank 1 is no device stall. Had rank 0
    # finished #2, so would rank 1, still in it: rank 0 never issued it.
    configs = {"0": ("default_pg", (0, 1)), "1": ("pp", (0, 1))}
    rank_0 = dump([], configs, {"1": {"last_enqueued_collective": 4, "last_started_collective": -1,
                                      "last_completed_collective": 4}})
    rank_1 = dump([rec(5, "all_reduce", seq=2, pg=PP, pg_id=1, state="scheduled"),
                   rec(8, "all_reduce", seq=3, pg=PP, pg_id=1, state="scheduled")], configs,
                  {"1": {"last_enqueued_collective": 3, "last_started_collective": -1, "last_completed_collective": 4}})
    _, diagnosis = analyse_dicts({0: rank_0, 1: rank_1})
    assert not any(f.rule == "frontier.stuck_on_device" for f in diagnosis.findings), diagnosis.verdict
    root = next(f for f in diagnosis.findings if f.is_root)
    assert (root.kind, root.collective_seq_id, root.suspect_ranks) == ("not_issued", 2, (0,)), diagnosis.verdict
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (0,)
