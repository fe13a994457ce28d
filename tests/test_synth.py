"""The synthetic dump generator keeps its own promises (frtrace/testing/synth.py)."""

from __future__ import annotations

import io
import json
import pickle
import statistics
from collections import Counter, defaultdict
from dataclasses import replace

import pytest

from frtrace.testing import synth
from frtrace.testing.synth import FAULT_KINDS, Fault, SynthJob, generate, write_job

P2P_NAME_PARTS = ("send ", "recv ")


class _NoClasses(pickle.Unpickler):
    def find_class(self, module, name):  # a real dump holds plain data only
        raise pickle.UnpicklingError(f"class {module}.{name} in a dump")


def _entries(dump: dict) -> list:
    return dump.get("entries", [])


def _by_group(job: SynthJob, group_name: str) -> dict:
    """rank -> that rank's entries of the group (oldest first)."""
    return {r: [e for e in _entries(d) if e["process_group"][0] == group_name] for r, d in job.dumps.items()}


def _seqs(entries: list) -> dict:
    """collective_seq_id -> non-marker collective entries with it."""
    out = defaultdict(list)
    for e in entries:
        if not e["is_p2p"] and not e["profiling_name"].endswith(":coalesced"):
            out[e["collective_seq_id"]].append(e)
    return out


def _signature(e: dict) -> tuple:
    name = e["profiling_name"]
    sizes = None if "all_to_all" in name else json.dumps([e["input_sizes"], e["output_sizes"]])
    return name, sizes, tuple(e["input_dtypes"])


# --------------------------------------------------------------------------- layout


def test_layout_groups_and_pg_config():
    job = generate(16, tp=2, pp=2, steps=2)
    names_to_ranks = {}
    for rank, dump in job.dumps.items():
        assert dump["version"] == "2.10" and dump["comm_lib_version"] == "2.27.5"
        cfg = dump["pg_config"]
        assert len(cfg) == 4  # default, tp, pp, dp
        for name, group in cfg.items():
            assert group["name"] == name and isinstance(group["ranks"], str)
            ranks = json.loads(group["ranks"])
            assert rank in ranks and ranks == sorted(ranks)
            assert names_to_ranks.setdefault(name, group["ranks"]) == group["ranks"]  # all ranks agree
        descs = sorted(g["desc"] for g in cfg.values())
        assert descs == ["default_pg", "dp", "pp", "tp"]
        # pg_id is rank-local: default 0, then creation order; process_group is (name, desc).
        pg_ids = {}
        for e in _entries(dump):
            assert isinstance(e["process_group"], tuple)
            assert pg_ids.setdefault(e["pg_id"], e["process_group"]) == e["process_group"]
            assert e["process_group"][0] in cfg
        assert pg_ids[0] == ("0", "default_pg")
        assert [pg_ids[i][1] for i in sorted(pg_ids)] == ["default_pg", "tp", "pp", "dp"]
        assert set(dump["pg_status"]) == {str(i) for i in pg_ids}
    # tp innermost: rank = dp*pp*tp + pp*tp + tp
    cfg5 = job.dumps[5]["pg_config"]
    assert {g["desc"]: g["ranks"] for g in cfg5.values()} == {
        "default_pg": str(list(range(16))), "tp": "[4, 5]", "pp": "[5, 7]", "dp": "[1, 5, 9, 13]"}


def test_bad_layout_raises():
    with pytest.raises(ValueError):
        generate(10, tp=4, pp=2)
    with pytest.raises(ValueError):
        generate(8, tp=2, pp=4, fault=Fault("hang", rank=1, group="dp"))  # dp == 1: nothing to hang in
    with pytest.raises(ValueError):
        generate(8, fault=Fault("p2p_unmatched", rank=1, group="tp"))
    with pytest.raises(ValueError):
        generate(8, fault=Fault("nonsense"))


# --------------------------------------------------------------------------- healthy invariants


@pytest.mark.parametrize("layout", [(8, 2, 2), (16, 2, 4), (12, 1, 3)])
def test_healthy_job_is_consistent(layout):
    world, tp, pp = layout
    job = generate(world, tp=tp, pp=pp, steps=3, timing=True)
    assert job.truth["status"] == "healthy" and job.truth["suspect_ranks"] == []
    sends, recvs = Counter(), Counter()
    for rank, dump in job.dumps.items():
        entries = _entries(dump)
        assert [e["record_id"] for e in entries] == list(range(len(entries)))
        assert all(e["state"] == "completed" and e["retired"] for e in entries)
        assert all(e["time_discovered_completed_ns"] >= e["time_discovered_started_ns"] > 0 for e in entries)
        assert all(e["duration_ms"] > 0 for e in entries)
        times = [e["time_created_ns"] for e in entries]
        assert times == sorted(times)
        last = defaultdict(lambda: [0, 0, 0])  # pg -> [coll seq, p2p seq, op_id]
        for e in entries:
            seq, p2p, op_id = last[e["pg_id"]]
            name = e["profiling_name"]
            assert name.startswith("nccl:")
            if e["is_p2p"]:
                assert name.split(":", 1)[1].startswith(P2P_NAME_PARTS)
                assert e["p2p_seq_id"] == p2p + 1 and e["collective_seq_id"] == seq
            elif name == "nccl:coalesced":
                assert e["collective_seq_id"] == seq and e["op_id"] == op_id and e["input_sizes"] == []
            else:
                assert e["collective_seq_id"] in (seq, seq + 1) and e["p2p_seq_id"] == p2p
            if name != "nccl:coalesced":
                assert e["op_id"] == op_id + 1
            last[e["pg_id"]] = [e["collective_seq_id"], e["p2p_seq_id"], e["op_id"]]
        status = dump["pg_status"]
        for pg, (seq, _, _) in last.items():
            assert status[str(pg)]["last_completed_collective"] == status[str(pg)]["last_enqueued_collective"]
            assert status[str(pg)]["last_enqueued_collective"] == (seq if seq else -1)
        # P2P names carry group-local ranks: map them back through the sorted group ranks.
        for e in entries:
            if not e["is_p2p"]:
                continue
            ranks = json.loads(dump["pg_config"][e["process_group"][0]]["ranks"])
            op, arrow = e["profiling_name"].split(":", 1)[1].split(" ")
            if op == "send":
                me, peer = map(int, arrow.split("->"))
                assert ranks[me] == rank
                sends[(e["process_group"][0], rank, ranks[peer], json.dumps(e["input_sizes"]))] += 1
            else:
                me, peer = map(int, arrow.split("<-"))
                assert ranks[me] == rank
                recvs[(e["process_group"][0], ranks[peer], rank, json.dumps(e["input_sizes"]))] += 1
    assert sends == recvs
    assert bool(sends) == (pp > 1)

    # Every member of a group has the same collectives at the same collective_seq_id.
    all_groups = {n for d in job.dumps.values() for n in d["pg_config"]}
    for name in all_groups:
        per_rank = {r: _seqs(es) for r, es in _by_group(job, name).items() if es}
        if not per_rank:
            continue
        reference = next(iter(per_rank.values()))
        for r, seqs in per_rank.items():
            assert sorted(seqs) == list(range(1, len(seqs) + 1))
            assert {k: [_signature(e) for e in v] for k, v in seqs.items()} == \
                   {k: [_signature(e) for e in v] for k, v in reference.items()}


def test_coalesced_batches_and_uneven_all_to_all():
    job = generate(8, tp=2, pp=2, steps=2)
    entries = _entries(job.dumps[0])
    markers = [i for i, e in enumerate(entries) if e["profiling_name"] == "nccl:coalesced"]
    assert len(markers) == 2
    for i in markers:
        batch = [e for e in entries[:i] if e["process_group"] == entries[i]["process_group"]
                 and e["collective_seq_id"] == entries[i]["collective_seq_id"]]
        assert len(batch) == 3 and all(not e["is_p2p"] for e in batch)
        assert entries[i - 1] is batch[-1]  # the marker follows its members
    a2a = {r: [e["input_sizes"] for e in _entries(d) if e["profiling_name"] == "nccl:all_to_all_single"]
           for r, d in job.dumps.items()}
    assert all(len(v) == 1 for v in a2a.values())  # even steps only
    assert len({json.dumps(v) for v in a2a.values()}) > 1  # legitimately rank-dependent
    gathers = [e for e in entries if e["profiling_name"] == "nccl:_all_gather_base"]
    assert gathers[0]["output_sizes"][0][0] == gathers[0]["input_sizes"][0][0] * 2


def test_frames_are_shared_and_optional():
    job = generate(8, steps=2)
    entries = _entries(job.dumps[0])
    frames = entries[0]["frames"]
    assert frames[0]["filename"].endswith("torch/distributed/distributed_c10d.py")
    assert frames[1]["name"] == "wrapper" and frames[-1]["name"] == "<module>"
    stacks = {id(e["frames"]) for e in entries}
    assert len(stacks) < len(entries)
    bare = generate(8, steps=2, with_frames=False)
    assert all("frames" not in e for e in _entries(bare.dumps[0]))


# --------------------------------------------------------------------------- ring buffer, timing, lookahead


def test_ring_buffer_keeps_the_newest_entries():
    job = generate(8, steps=6, buffer_size=40, fault=Fault("hang", rank=3, group="default", step=5))
    firsts = set()
    for rank, dump in job.dumps.items():
        entries = _entries(dump)
        assert len(entries) == 40
        ids = [e["record_id"] for e in entries]
        assert ids == list(range(ids[0], ids[0] + 40)) and ids[0] > 0
        firsts.add(ids[0])
    assert len(firsts) > 1  # ranks did different numbers of ops: windows differ
    full = generate(8, steps=6, fault=Fault("hang", rank=3, group="default", step=5))
    assert _entries(job.dumps[2]) == _entries(full.dumps[2])[-40:]
    assert job.dumps[2]["pg_status"] == full.dumps[2]["pg_status"]  # status sees past the horizon
    empty = generate(8, steps=1, buffer_size=0)
    assert _entries(empty.dumps[0]) == []


@pytest.mark.parametrize("timing", [False, True])
@pytest.mark.parametrize("lookahead", [0, 2])
def test_states_timing_and_lookahead(timing, lookahead):
    job = generate(8, steps=3, timing=timing, lookahead=lookahead, fault=Fault("hang", rank=1, group="tp"))
    blocked = set(job.truth["blocked_ranks"])
    assert 1 not in blocked and blocked
    for rank, dump in job.dumps.items():
        states = [e["state"] for e in _entries(dump)]
        done = [e for e in _entries(dump) if e["state"] == "completed"]
        rest = [e for e in _entries(dump) if e["state"] != "completed"]
        assert states == sorted(states, key=lambda s: s != "completed")  # completed, then in flight
        assert all(e["retired"] for e in done) and not any(e["retired"] for e in rest)
        for e in done:
            assert ("duration_ms" in e) == timing
            assert (e["time_discovered_started_ns"] is not None) == timing
        if rank not in blocked:
            assert rest == []
            continue
        # The blocked op plus `lookahead` more; a coalesced batch is one op of several entries.
        def unit(e):
            return e["pg_id"], e["collective_seq_id"], e["p2p_seq_id"], e["is_p2p"]
        blocked_op = [e for e in rest if unit(e) == unit(rest[0])]
        assert all(e["state"] == ("started" if timing else "scheduled") for e in blocked_op)
        assert all(e["state"] == "scheduled" for e in rest[len(blocked_op):])
        assert rest[0]["time_discovered_completed_ns"] is None and "duration_ms" not in rest[0]
        assert (rest[0]["time_discovered_started_ns"] is not None) == timing
        assert len({unit(e) for e in rest}) == 1 + lookahead
        pg = str(rest[0]["pg_id"])
        status = dump["pg_status"][pg]
        if not rest[0]["is_p2p"]:
            assert status["last_started_collective"] == (rest[0]["collective_seq_id"] if timing else -1)
            assert status["last_completed_collective"] == rest[0]["collective_seq_id"] - 1


# --------------------------------------------------------------------------- faults


def _group_entries(job: SynthJob) -> dict:
    return _by_group(job, job.truth["group"]["name"])


def _pending(entries: list) -> list:
    return [e for e in entries if e["state"] != "completed"]


GROUPS = ["tp", "pp", "dp", "default"]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("kind", ["hang", "missing_dump_hang", "skip_op"])
def test_not_issued(kind, group):
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault(kind, rank=5, group=group, step=1))
    t = job.truth
    assert t["status"] == "faults" and t["suspect_ranks"] == [5]
    assert t["fault_kind"] == ("missing_dump" if kind == "missing_dump_hang" else "not_issued")
    k = t["collective_seq_id"]
    per_rank = _group_entries(job)
    for rank in t["group"]["ranks"]:
        if rank == 5:
            if kind == "missing_dump_hang":
                assert 5 not in job.dumps and t["missing_dumps"] == [5]
                continue
            assert k not in _seqs(per_rank[5]) and k - 1 in _seqs(per_rank[5])
            if kind == "hang":  # stuck outside collectives: everything it issued completed
                assert _pending(_entries(job.dumps[5])) == []
            else:  # it went on and waits in a later op of another group
                assert _pending(_entries(job.dumps[5]))[0]["process_group"][0] != t["group"]["name"]
            continue
        waiting = _pending(per_rank[rank])
        assert waiting and waiting[0]["collective_seq_id"] == k and not waiting[0]["is_p2p"]
        assert waiting[0]["profiling_name"] == "nccl:" + t["op"]


@pytest.mark.parametrize("group", GROUPS)
def test_stuck(group):
    # Nothing in the dumps is as old as the 10 min timeout: a job dumped mid-op looks the same.
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault("stuck", rank=5, group=group))
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"]) == ("inconclusive", "in_flight", [])
    assert 0 <= t["age_ms_at_least"] < t["params"]["timeout_ms"]
    k = t["collective_seq_id"]
    sigs = set()
    for rank, entries in _group_entries(job).items():
        if rank in t["group"]["ranks"]:
            (e,) = _seqs(entries)[k]
            assert e["state"] != "completed"
            sigs.add(_signature(e))
    assert len(sigs) == 1


def test_stuck_past_its_timeout_is_a_hang():
    # The blocked ranks' hosts queue 4 more ops, over a millisecond after the stuck one.
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault("stuck", rank=5, group="tp"), lookahead=4, timeout_ms=1)
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"]) == ("faults", "stuck", t["group"]["ranks"])
    assert t["age_ms_at_least"] >= 1
    assert {e["timeout_ms"] for e in _entries(job.dumps[0])} == {1}


@pytest.mark.parametrize("group", ["tp", "dp", "default"])
def test_in_flight_dumps_every_group_of_a_family_in_one_op(group):
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault("in_flight", rank=5, group=group, step=2), timing=True)
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"]) == ("inconclusive", "in_flight", [])
    desc, in_it = t["group"]["desc"], 0
    for rank in range(16):
        pending = _pending(_entries(job.dumps[rank]))
        if pending and pending[0]["process_group"][1] == desc and not pending[0]["is_p2p"]:
            assert pending[0]["state"] == "started"  # in flight: it started and did not complete
            assert pending[0]["collective_seq_id"] == t["collective_seq_id"]
            in_it += 1
    # Every rank of the family's groups (for tp, the first stage's; the second waits on it).
    assert in_it == (8 if group == "tp" else 16)


@pytest.mark.parametrize("group", GROUPS)
def test_extra_op(group):
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault("extra_op", rank=5, group=group))
    t = job.truth
    assert t["fault_kind"] == "extra_op" and t["suspect_ranks"] == [5]
    k = t["collective_seq_id"]
    for rank, entries in _group_entries(job).items():
        if rank not in t["group"]["ranks"]:
            continue
        if rank == 5:
            (e,) = _seqs(entries)[k]
            assert e["state"] != "completed" and _pending(_entries(job.dumps[5]))[0] is e
        else:
            assert max(_seqs(entries)) == k - 1


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("kind,field", [("size_mismatch", "input_sizes"), ("dtype_mismatch", "input_dtypes"),
                                        ("op_mismatch", "profiling_name")])
def test_mismatch(kind, field, group):
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault(kind, rank=5, group=group))
    t = job.truth
    assert t["fault_kind"] == kind and t["suspect_ranks"] == [5]
    assert t["tie"] == (len(t["group"]["ranks"]) == 2)
    k = t["collective_seq_id"]
    values = {}
    for rank, entries in _group_entries(job).items():
        if rank in t["group"]["ranks"]:
            (e,) = _seqs(entries)[k]
            assert e["state"] != "completed"
            values[rank] = json.dumps(e[field])
    assert json.loads(values[5]) != json.loads(next(v for r, v in values.items() if r != 5))
    assert len({v for r, v in values.items() if r != 5}) == 1  # the peers agree
    if kind == "op_mismatch":
        assert all(json.loads(v) == "nccl:" + t["op"] for r, v in values.items() if r != 5)


def test_missing_dump_alone_is_inconclusive():
    job = generate(8, fault=Fault("missing_dump", rank=6))
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"], t["missing_dumps"]) == \
           ("inconclusive", "missing_dump", [], [6])
    assert sorted(job.dumps) == [0, 1, 2, 3, 4, 5, 7]
    assert all(e["state"] == "completed" for d in job.dumps.values() for e in _entries(d))


@pytest.mark.parametrize("culprit", [0, 1, 2, 3, 5])
def test_p2p_unmatched(culprit):
    job = generate(12, tp=1, pp=3, steps=3, fault=Fault("p2p_unmatched", rank=culprit, group="pp"))
    t = job.truth
    peer = t["p2p_peer"]
    assert t["fault_kind"] == "p2p_unmatched" and t["suspect_ranks"] == [culprit] and t["op"] == "send"
    ranks = t["group"]["ranks"]
    entries = _group_entries(job)
    waiting = _pending(entries[peer])[0]
    assert waiting["is_p2p"] and waiting["p2p_seq_id"] == t["p2p_seq_id"]
    assert waiting["profiling_name"] == f"nccl:recv {ranks.index(peer)}<-{ranks.index(culprit)}"
    sent = sum(1 for e in entries[culprit] if e["profiling_name"].startswith(f"nccl:send {ranks.index(culprit)}->{ranks.index(peer)}"))
    wanted = sum(1 for e in entries[peer] if e["profiling_name"] == waiting["profiling_name"])
    assert sent == wanted - 1


def test_straggler_arrives_last_and_late():
    job = generate(16, tp=2, pp=2, steps=3, fault=Fault("straggler", rank=6, straggler_ms=40.0))
    t = job.truth
    assert (t["status"], t["fault_kind"], t["warned_ranks"], t["lateness_ms"]) == ("healthy", "straggler", [6], 40.0)
    assert t["blocked_ranks"] == []
    lateness = []
    for name in (g["name"] for g in job.dumps[6]["pg_config"].values()):
        per_rank = {r: _seqs(es) for r, es in _by_group(job, name).items() if es}
        for k, mine in per_rank[6].items():
            others = [seqs[k][0]["time_created_ns"] for r, seqs in per_rank.items() if r != 6]
            lateness.append((mine[0]["time_created_ns"] - max(others)) / 1e6)
    # Last to arrive at every collective; by about straggler_ms, more where its delay piles up
    # over a step before it meets those peers again (DP).
    assert len(lateness) > 20 and min(lateness) > 30
    assert 30 < statistics.median(lateness) < 50


def test_every_fault_kind_generates():
    for kind in FAULT_KINDS:
        group = {"p2p_unmatched": "pp", "skip_ring_step": "cp"}.get(kind, "tp")
        job = generate(8, fault=Fault(kind, rank=2, group=group), ring=kind == "skip_ring_step")
        assert job.truth["fault"]["kind"] == kind
        assert job.truth["status"] in (("healthy",) if kind == "straggler" else ("faults", "inconclusive"))
        json.dumps(job.truth)


# --------------------------------------------------------------------------- files


def test_pickle_files_are_plain_data(tmp_path):
    job = generate(8, steps=2, timing=True)
    paths = write_job(job, tmp_path / "d", suffix=".pkl")
    assert [p.name for p in paths] == [f"nccl_trace_rank_{r}.pkl" for r in range(8)]
    for rank, path in enumerate(paths):
        data = path.read_bytes()
        assert data[:2] == b"\x80\x02"
        assert _NoClasses(io.BytesIO(data)).load() == job.dumps[rank]


def test_pickles_share_containers_like_torch(tmp_path):
    # torch's pickler memoizes strings and writes one dict per distinct stack frame (real 2.13
    # dumps show this); every entry still owns its frames list and its sizes.
    job = generate(8, steps=2)
    job.dumps[1]  # one dump cached in memory (entries share lists there), the others streamed
    paths = write_job(job, tmp_path)
    for rank in (0, 1):
        entries = pickle.loads(paths[rank].read_bytes())["entries"]
        assert entries == job.dumps[rank]["entries"]
        assert len({id(e["frames"]) for e in entries}) == len(entries)
        assert len({id(e["input_sizes"]) for e in entries}) == len(entries)
        frame_dicts = {id(f) for e in entries for f in e["frames"]}
        distinct = {tuple(sorted(f.items())) for e in entries for f in e["frames"]}
        assert len(frame_dicts) == len(distinct) < sum(len(e["frames"]) for e in entries)
        names = {id(e["profiling_name"]) for e in entries}
        assert len(names) < len(entries)  # strings are shared after loading: memoized


def test_forked_writers_write_the_same_files(tmp_path):
    job = generate(8, steps=2, fault=Fault("stuck", rank=2))
    one = write_job(job, tmp_path / "one")
    two = write_job(job, tmp_path / "two", workers=3)
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]


def test_json_round_trip(tmp_path):
    job = generate(8, steps=2, fault=Fault("hang", rank=1), lookahead=1)
    paths = write_job(job, tmp_path, fmt="json", prefix="rank_", suffix=".json")
    for rank, path in enumerate(paths):
        text = path.read_text()
        assert text.startswith("{")
        loaded = json.loads(text)
        assert list(loaded) == sorted(loaded)
        dump = job.dumps[rank]
        assert loaded["nccl_comm_state"] == {}
        assert loaded["pg_config"] == dump["pg_config"]
        assert loaded["pg_status"] == {pg: {k: str(v) for k, v in s.items()} for pg, s in dump["pg_status"].items()}
        assert len(loaded["entries"]) == len(dump["entries"])
        for got, want in zip(loaded["entries"], dump["entries"]):
            assert "frames" not in got and list(got) == sorted(got)
            assert got["process_group"] == list(want["process_group"])
            assert got["time_discovered_started_ns"] == (want["time_discovered_started_ns"] or 0)
            want = {k: v for k, v in want.items() if k not in ("frames", "process_group") and v is not None}
            assert {k: got[k] for k in want} == json.loads(json.dumps(want))
    empty = generate(2, tp=1, pp=1, steps=1, buffer_size=0)
    (path,) = write_job(empty, tmp_path / "empty", fmt="json", prefix="rank_", suffix="")[:1]
    assert "entries" not in json.loads(path.read_text())


def test_deterministic_and_seeded(tmp_path):
    a = write_job(generate(8, steps=2, seed=3), tmp_path / "a")
    b = write_job(generate(8, steps=2, seed=3), tmp_path / "b")
    c = write_job(generate(8, steps=2, seed=4), tmp_path / "c")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]


def test_rank_dumps_mapping():
    job = generate(8, steps=1, fault=Fault("missing_dump", rank=3))
    dumps = job.dumps
    assert len(dumps) == 7 and 3 not in dumps and list(dumps) == [0, 1, 2, 4, 5, 6, 7]
    assert dumps[0] is dumps[0]  # cached once built
    assert dumps.for_file(1) is not dumps.for_file(1) and dumps.for_file(1) == dumps[1]
    dumps[0]["entries"] = []
    assert dumps[0]["entries"] == []
    del dumps[7]
    assert 7 not in dumps and len(dumps) == 6
    with pytest.raises(KeyError):
        dumps[3]
    assert dict(dumps).keys() == {0, 1, 2, 4, 5, 6}


def test_cli(tmp_path, capsys):
    out = tmp_path / "jobs" / "hang"
    assert synth.main([str(out), "--world-size", "16", "--tp", "2", "--pp", "2", "--fault", "hang",
                       "--fault-rank", "5", "--fault-group", "dp", "--timing", "--entries-per-rank", "60"]) == 0
    truth = json.loads((tmp_path / "jobs" / "hang.truth.json").read_text())
    assert truth["suspect_ranks"] == [5] and truth["group"]["desc"] == "dp"
    assert len(list(out.iterdir())) == 16
    assert synth.main([str(tmp_path / "healthy"), "--world-size", "16", "--entries-per-rank", "100"]) == 0
    sizes = [len(pickle.loads(p.read_bytes())["entries"]) for p in (tmp_path / "healthy").iterdir()]
    assert 85 <= max(sizes) <= 115
    assert synth.main([str(tmp_path / "j"), "--json", "--fault", "p2p_unmatched", "--steps", "2",
                       "--truth", str(tmp_path / "t.json")]) == 0
    assert json.loads((tmp_path / "t.json").read_text())["fault_kind"] == "p2p_unmatched"
    assert (tmp_path / "j" / "nccl_trace_rank_0").read_bytes()[:1] == b"{"


# --------------------------------------------------------------------------- faithful options
# What PyTorch really records (see "Faithful options" in the synth module doc).

FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}
MARKER = "nccl:coalesced"


def _batches(entries: list) -> list:
    """(per-op entries, marker) of each batch in one rank's entries of one group, oldest first:
    the run of entries with the same seqs that a `nccl:coalesced` marker closes."""
    def unit(e):
        return e["is_p2p"], e["p2p_seq_id"], e["collective_seq_id"]

    out, run = [], []
    for e in entries:
        if e["profiling_name"] == MARKER:
            out.append((run, e))
            run = []
        else:
            run = run + [e] if run and unit(run[-1]) == unit(e) else [e]
    return out


def _pp_entries(job: SynthJob, rank: int) -> list:
    return [e for e in _entries(job.dumps[rank]) if e["process_group"][1] == "pp"]


@pytest.mark.parametrize("p2p", ["batched", "mixed"])
@pytest.mark.parametrize("layout", [(8, 2, 2), (16, 2, 4)])
def test_batched_p2p_is_recorded_like_batch_isend_irecv(layout, p2p):
    job = generate(*layout, steps=4, p2p=p2p, timing=True, **FAITHFUL)
    assert job.truth["status"] == "healthy" and job.truth["blocked_ranks"] == []
    kinds = Counter()
    for rank in job.dumps:
        entries = _pp_entries(job, rank)
        batches = [(ops, m) for ops, m in _batches(entries) if ops and ops[0]["is_p2p"]]
        assert batches
        for ops, marker in batches:
            # Every per-op entry stays scheduled, without events; the marker follows them
            # with is_p2p False, the same seqs, and is the only one whose state advances.
            assert all(e["state"] == "scheduled" and not e["retired"] and e["time_discovered_started_ns"] is None
                       and e["time_discovered_completed_ns"] is None and "duration_ms" not in e for e in ops)
            assert {(e["p2p_seq_id"], e["collective_seq_id"]) for e in ops} == \
                   {(marker["p2p_seq_id"], marker["collective_seq_id"])}
            assert [e["op_id"] for e in ops] == list(range(ops[0]["op_id"], ops[0]["op_id"] + len(ops)))
            assert marker["op_id"] == ops[-1]["op_id"] and marker["record_id"] == ops[-1]["record_id"] + 1
            assert marker["is_p2p"] is False and marker["input_sizes"] == []
            assert marker["state"] == "completed" and marker["retired"] and marker["duration_ms"] > 0
            assert marker["time_discovered_completed_ns"] >= marker["time_discovered_started_ns"]
            kinds[len(ops)] += 1
        # p2p_seq_id goes +1 per batch (or plain op); a batch does not bump collective_seq_id.
        p2p_seqs = [e["p2p_seq_id"] for e in entries if e["is_p2p"]]
        assert sorted(set(p2p_seqs)) == list(range(1, max(p2p_seqs) + 1))
        plain = [e for e in entries if e["is_p2p"] and e["state"] == "completed"]
        assert bool(plain) == (p2p == "mixed")
    assert kinds[2] > 0  # a stage's forward send and backward recv share one batch


def test_coalesced_collectives_keep_their_state_in_the_marker():
    old = generate(8, steps=2)
    new = generate(8, steps=2, coalesced_events="marker")
    for job, frozen in ((old, False), (new, True)):
        dp = [e for e in _entries(job.dumps[0]) if e["process_group"][1] == "dp"]
        batches = _batches(dp)
        assert len(batches) == 2
        for ops, marker in batches:
            assert len(ops) == 3 and not marker["is_p2p"] and marker["state"] == "completed"
            assert all(e["state"] == ("scheduled" if frozen else "completed") for e in ops)
            assert all(e["retired"] != frozen for e in ops)


@pytest.mark.parametrize("timing", [False, True])
def test_discovered_times_are_watchdog_ticks(timing):
    period = 100 * 10**6
    job = generate(16, 2, 4, steps=3, timing=timing, fault=Fault("hang", rank=5, group="tp"), **FAITHFUL)
    phases = set()
    for rank, dump in job.dumps.items():
        times, entries = [], _entries(dump)
        for e in entries:
            started, ended = e["time_discovered_started_ns"], e["time_discovered_completed_ns"]
            # The end event always exists: a completed op has its tick, timing or not.
            assert (ended is not None) == (e["state"] == "completed")
            assert (started is not None) == (timing and e["state"] != "scheduled")
            assert ("duration_ms" in e) == (timing and e["state"] == "completed")
            for t in (started, ended):
                if t is not None:
                    assert e["time_created_ns"] < t <= e["time_created_ns"] + period + 2 * 10**9
                    times.append(t)
        assert times
        phase = times[0] % period
        assert all(t % period == phase for t in times)  # one grid per rank
        phases.add(phase)
    assert len(phases) > len(job.dumps) // 2  # each rank polls with its own phase


def _matched_p2p(job: SynthJob) -> list:
    """(send entry, recv entry) pairs, the n-th send a->b with the n-th recv at b from a."""
    chans = defaultdict(lambda: ([], []))
    for rank, dump in job.dumps.items():
        for e in _entries(dump):
            if not e["is_p2p"]:
                continue
            ranks = json.loads(dump["pg_config"][e["process_group"][0]]["ranks"])
            op, arrow = e["profiling_name"].split(":", 1)[1].split(" ")
            me, peer = map(int, arrow.split("->" if op == "send" else "<-"))
            src, dst = (ranks[me], ranks[peer]) if op == "send" else (ranks[peer], ranks[me])
            chans[(e["process_group"][0], src, dst)][op == "recv"].append(e)
    pairs = []
    for sends, recvs in chans.values():
        assert len(sends) == len(recvs)
        pairs += list(zip(sends, recvs))
    return pairs


@pytest.mark.parametrize("p2p", ["plain", "batched"])
def test_receivers_post_their_recv_before_the_send(p2p):
    job = generate(16, 2, 4, steps=3, p2p=p2p, bubble_ms=100.0)
    pairs = _matched_p2p(job)
    assert pairs
    leads = [(send["time_created_ns"] - recv["time_created_ns"]) / 1e6 for send, recv in pairs]
    assert min(leads) > 90  # pipeline bubbles: the receiver waits ~100 ms for its sender
    assert min(leads) < 200
    base = generate(16, 2, 4, steps=3, p2p=p2p)
    assert max((s["time_created_ns"] - r["time_created_ns"]) / 1e6 for s, r in _matched_p2p(base)) < 50


def _newest_work_seq(entries: list, pg_id: int, completed: bool = False):
    """The seq torch keeps for the group's newest Work (or newest completed one): a batch is one
    Work (its marker), a P2P Work counts in p2p_seq_id, a collective in collective_seq_id."""
    mine = [e for e in entries if e["pg_id"] == pg_id and not (e["is_p2p"] and e["state"] == "scheduled"
                                                                and _in_batch(entries, e))]
    if completed:
        mine = [e for e in mine if e["state"] == "completed"]
    if not mine:
        return -1
    e = mine[-1]
    is_p2p_work = e["is_p2p"] or (e["profiling_name"] == MARKER and _marker_of_p2p(entries, e))
    return e["p2p_seq_id"] if is_p2p_work else e["collective_seq_id"]


def _in_batch(entries: list, e: dict) -> bool:
    later = [x for x in entries if x["pg_id"] == e["pg_id"] and x["record_id"] > e["record_id"]]
    for x in later:
        if x["profiling_name"] == MARKER:
            return x["p2p_seq_id"] == e["p2p_seq_id"]
        if not x["is_p2p"] or x["p2p_seq_id"] != e["p2p_seq_id"]:
            return False
    return False


def _marker_of_p2p(entries: list, marker: dict) -> bool:
    before = [x for x in entries if x["pg_id"] == marker["pg_id"] and x["record_id"] < marker["record_id"]]
    return bool(before) and before[-1]["is_p2p"]


@pytest.mark.parametrize("p2p", ["plain", "batched", "mixed"])
@pytest.mark.parametrize("fault", [None, Fault("hang", rank=5, group="tp", step=1)])
def test_pg_status_holds_the_newest_works_seq(p2p, fault):
    job = generate(16, 2, 4, steps=3, p2p=p2p, fault=fault, timing=True, **FAITHFUL)
    in_p2p_numbers = 0
    for rank, dump in job.dumps.items():
        entries = _entries(dump)
        for pg, status in dump["pg_status"].items():
            assert status["last_enqueued_collective"] == _newest_work_seq(entries, int(pg))
            assert status["last_completed_collective"] == _newest_work_seq(entries, int(pg), completed=True)
            assert status["last_started_collective"] >= status["last_completed_collective"] or \
                status["last_started_collective"] == -1
            pp_entries = [e for e in entries if e["pg_id"] == int(pg) and e["process_group"][1] == "pp"]
            if pp_entries and status["last_enqueued_collective"] == max(e["p2p_seq_id"] for e in pp_entries) \
                    != max(e["collective_seq_id"] for e in pp_entries):
                in_p2p_numbers += 1
    # Where a rank's newest pipeline Work is P2P (blocked in it), pg_status follows p2p_seq_id.
    assert in_p2p_numbers > 0 if fault else in_p2p_numbers == 0
    legacy = generate(16, 2, 4, steps=3, p2p=p2p, fault=fault)
    for dump in legacy.dumps.values():  # collectives only, as before
        for pg, status in dump["pg_status"].items():
            colls = [e["collective_seq_id"] for e in _entries(dump) if e["pg_id"] == int(pg) and not e["is_p2p"]]
            assert status["last_enqueued_collective"] == (max(colls) if colls else -1)


@pytest.mark.parametrize("p2p", ["plain", "batched"])
@pytest.mark.parametrize("buffer_size", [2000, 40])
def test_only_active_dumps_drop_what_completed(p2p, buffer_size):
    fault = Fault("hang", rank=5, group="tp", step=1)
    full = generate(16, 2, 2, steps=3, p2p=p2p, fault=fault, buffer_size=buffer_size, **FAITHFUL)
    active = generate(16, 2, 2, steps=3, p2p=p2p, fault=fault, buffer_size=buffer_size, only_active=True, **FAITHFUL)
    assert active.truth["suspect_ranks"] == full.truth["suspect_ranks"] == [5]
    for rank in full.dumps:
        kept = _entries(active.dumps[rank])
        assert all(e["state"] != "completed" and e["time_discovered_completed_ns"] is None for e in kept)
        # The same entries, less the completed ones; pg_status is untouched.
        assert kept == [e for e in _entries(full.dumps[rank]) if e["time_discovered_completed_ns"] is None]
        assert active.dumps[rank]["pg_status"] == full.dumps[rank]["pg_status"]
    # Per-op entries of completed batches never get a discovered-completed time: they stay.
    frozen = [e for d in active.dumps.values() for e in _entries(d) if e["state"] == "scheduled" and not e["retired"]
              and e["process_group"][1] == "dp"]
    assert frozen
    healthy = generate(16, 2, 2, steps=3, p2p=p2p, only_active=True, **FAITHFUL)
    for dump in healthy.dumps.values():
        assert all(e["state"] == "scheduled" and e["profiling_name"] != MARKER for e in _entries(dump))


@pytest.mark.parametrize("p2p", ["plain", "batched"])
@pytest.mark.parametrize("culprits", [(5,), (5, 7)])
def test_gpu_error_leaves_the_culprits_holding_what_peers_completed(culprits, p2p):
    job = generate(16, 4, 2, steps=3, p2p=p2p, only_active=True,
                   fault=Fault("gpu_error", ranks=culprits, step=1), **FAITHFUL)
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"]) == ("faults", "stuck", list(culprits))
    assert set(culprits) <= set(t["blocked_ranks"])
    (tp_name, tp), = [(n, json.loads(g["ranks"])) for n, g in job.dumps[5]["pg_config"].items() if g["desc"] == "tp"]
    for rank in culprits:
        held = [e for e in _entries(job.dumps[rank]) if not e["is_p2p"] and e["process_group"][0] == tp_name]
        assert held and all(e["state"] == "scheduled" for e in held)
        # Peers that are not culprits completed the collectives it still holds.
        for peer in set(tp) - set(culprits):
            status = job.dumps[peer]["pg_status"][str(held[0]["pg_id"])]
            assert status["last_completed_collective"] >= held[0]["collective_seq_id"]
    # Its host went on a little: its pg_status enqueued more than it completed.
    status = job.dumps[5]["pg_status"][str(held[0]["pg_id"])]
    assert status["last_enqueued_collective"] > status["last_completed_collective"]
    with pytest.raises(ValueError):
        generate(16, 4, 2, fault=Fault("skip_op", ranks=(1, 2)))


@pytest.mark.parametrize("only_active", [False, True])
def test_several_hosts_that_stop_issuing_each_stop_at_their_own_groups_collective(only_active):
    # As NVRx's LOCK_GIL stops two hosts at once: each culprit issues nothing from the
    # step's DP collective of its own DP group on; the peers of each wait in it.
    job = generate(16, 2, 2, steps=3, only_active=only_active, timing=True,
                   fault=Fault("hang", rank=10, group="dp", step=1, ranks=(10, 15)), **FAITHFUL)
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"]) == ("faults", "not_issued", [10, 15])
    for culprit in (10, 15):
        (dp_name, dp), = [(n, json.loads(g["ranks"])) for n, g in job.dumps[culprit]["pg_config"].items()
                          if g["desc"] == "dp" and culprit in json.loads(g["ranks"])]
        held = {e["collective_seq_id"] for e in _entries(job.dumps[culprit]) if e["process_group"][0] == dp_name}
        # Every other member waits in one DP collective the culprit never issued.
        waiting = {peer: {e["collective_seq_id"] for e in _entries(job.dumps[peer])
                          if e["process_group"][0] == dp_name and e["state"] != "completed"} - held
                   for peer in set(dp) - {culprit}}
        assert all(len(seqs) == 1 for seqs in waiting.values()) and len(set.union(*waiting.values())) == 1


def _created(dump: dict) -> list[int]:
    return [e["time_created_ns"] for e in _entries(dump)]


@pytest.mark.parametrize("kind", ["hang", "gpu_error"])
def test_culprits_that_stop_at_once_stop_at_one_moment_wherever_each_is(kind):
    # NVRx starts both faults after one delay: the second culprit stops at the moment the
    # first does, wherever it then is in its own program, not at the same collective of its
    # own. Up to that moment the job is the healthy one (same draws, same times).
    fault = Fault(kind, rank=6, group="pp", step=1, ranks=(6, 12), at_once=True)
    job = generate(16, 2, 4, steps=4, timing=True, fault=fault, **FAITHFUL)
    healthy = generate(16, 2, 4, steps=4, timing=True, **FAITHFUL)
    assert (job.truth["status"], job.truth["suspect_ranks"]) == ("faults", [6, 12])
    faulty_ops, healthy_ops = _created(job.dumps[12]), _created(healthy.dumps[12])
    # Rank 12's ops are the healthy job's, cut at one op: those before the moment.
    assert faulty_ops == healthy_ops[:len(faulty_ops)] and len(faulty_ops) < len(healthy_ops)
    if kind == "hang":
        # It issued every op the healthy job issued before rank 6 reached its target
        # (issued then: the healthy job's op of rank 6 missing from the faulty dump) and none after.
        moment = healthy.dumps[6]["entries"][len(job.dumps[6]["entries"])]["time_created_ns"]
        assert faulty_ops == [t for t in healthy_ops if t < moment]
    else:
        # Its GPU stopped: its newest ops never completed, and its host went on a little.
        assert _entries(job.dumps[12])[-1]["state"] != "completed"
        assert 12 in job.truth["blocked_ranks"]
    # The same job without at_once stops each culprit at its own step's collective instead.
    apart = generate(16, 2, 4, steps=4, timing=True, fault=replace(fault, at_once=False), **FAITHFUL)
    assert _created(apart.dumps[12]) != faulty_ops
    with pytest.raises(ValueError):
        generate(16, 2, 4, fault=Fault("skip_op", rank=1, at_once=True))
    with pytest.raises(ValueError):  # the moment is the first culprit's: it must be one of them
        generate(16, 2, 4, fault=Fault(kind, rank=1, ranks=(6, 12), at_once=True))


@pytest.mark.parametrize("p2p", ["batched", "mixed"])
def test_wrapped_buffers_with_faithful_options(p2p):
    fault = Fault("p2p_unmatched", rank=5, group="pp", step=2)
    job = generate(16, 2, 4, steps=4, p2p=p2p, fault=fault, buffer_size=40, timing=True, **FAITHFUL)
    full = generate(16, 2, 4, steps=4, p2p=p2p, fault=fault, timing=True, **FAITHFUL)
    assert job.truth["suspect_ranks"] == full.truth["suspect_ranks"] == [5]
    firsts = set()
    for rank in job.dumps:
        entries = _entries(job.dumps[rank])
        assert entries == _entries(full.dumps[rank])[-40:]
        assert job.dumps[rank]["pg_status"] == full.dumps[rank]["pg_status"]
        firsts.add(entries[0]["record_id"])
    assert len(firsts) > 1


@pytest.mark.parametrize("p2p", ["batched", "mixed"])
@pytest.mark.parametrize("culprit", [1, 5, 9, 13])
def test_p2p_unmatched_with_batches_blocks_the_receiver(culprit, p2p):
    job = generate(16, 1, 4, steps=3, p2p=p2p, timing=True,
                   fault=Fault("p2p_unmatched", rank=culprit, group="pp"), **FAITHFUL)
    t = job.truth
    assert t["suspect_ranks"] == [culprit] and t["p2p_peer"] in t["group"]["ranks"]
    # The op the receiver is blocked in is the started one (a batch's marker, or a plain recv).
    (waiting,) = [e for e in _entries(job.dumps[t["p2p_peer"]]) if e["state"] == "started"]
    assert waiting["p2p_seq_id"] == t["p2p_seq_id"] and waiting["process_group"][0] == t["group"]["name"]
    assert waiting["profiling_name"] == MARKER or waiting["profiling_name"].startswith("nccl:recv")


def test_faithful_options_are_checked():
    for bad in ({"p2p": "nope"}, {"coalesced_events": "x"}, {"pg_status": "x"}, {"watchdog_ms": 0},
                {"bubble_ms": -1}):
        with pytest.raises(ValueError):
            generate(8, **bad)


def test_cli_faithful_options(tmp_path):
    out = tmp_path / "gpu"
    assert synth.main([str(out), "--world-size", "16", "--tp", "4", "--fault", "gpu_error", "--fault-ranks", "5", "7",
                       "--p2p", "batched", "--coalesced-events", "marker", "--watchdog-ms", "100", "--bubble-ms", "100",
                       "--pg-status", "work", "--only-active"]) == 0
    truth = json.loads((tmp_path / "gpu.truth.json").read_text())
    assert truth["suspect_ranks"] == [5, 7] and truth["fault_kind"] == "stuck" and truth["params"]["only_active"]


# --------------------------------------------------------------------------- job shapes (issue 24)


def _p2p_names(dump: dict, desc: str) -> list:
    return [e["profiling_name"] for e in _entries(dump) if e["is_p2p"] and e["process_group"][1] == desc]


@pytest.mark.parametrize("p2p", ["plain", "batched"])
def test_a_ring_passes_blocks_to_the_next_rank_and_takes_them_from_the_previous(p2p):
    job = generate(16, tp=2, pp=4, steps=2, ring=True, p2p=p2p)
    assert job.truth["status"] == "healthy" and job.truth["blocked_ranks"] == []
    for rank in (0, 2, 4, 6):  # ring positions 0-3 of the first ring (tp rank 0)
        me = rank // 2
        names = set(_p2p_names(job.dumps[rank], "cp"))
        assert names == {f"nccl:send {me}->{(me + 1) % 4}", f"nccl:recv {me}<-{(me - 1) % 4}"}
    sizes = {tuple(e["input_sizes"][0]) for e in _entries(job.dumps[0]) if e["is_p2p"]}
    assert sizes == {(2, 4096, 8, 128), (2, 2, 4096, 8, 128)}  # forward blocks, backward twice that


def test_a_rank_that_skips_a_ring_step_ends_a_step_short_of_its_neighbours():
    job = generate(16, tp=2, pp=4, steps=3, ring=True, fault=Fault("skip_ring_step", rank=4, group="cp", step=1))
    t = job.truth
    assert (t["status"], t["fault_kind"], t["suspect_ranks"]) == ("faults", "not_issued", [4])
    # Its ring ops paired with its neighbours' until the tensors differed: it sends a backward
    # block (5 dims) where its next neighbour (rank 6) waits for a forward one, at one number.
    (mine, *_), (theirs, *_) = _pending(_entries(job.dumps[4])), _pending(_entries(job.dumps[6]))
    assert (mine["profiling_name"], len(mine["input_sizes"][0])) == ("nccl:send 2->3", 5)
    assert (theirs["profiling_name"], len(theirs["input_sizes"][0])) == ("nccl:recv 3<-2", 4)
    assert mine["p2p_seq_id"] == theirs["p2p_seq_id"] and mine["state"] == theirs["state"] == "scheduled"


@pytest.mark.parametrize("p2p", ["plain", "batched"])
def test_an_interleaved_pipeline_hands_the_last_stage_on_to_the_first(p2p):
    job = generate(16, tp=2, pp=4, steps=2, vchunks=2, p2p=p2p)
    assert job.truth["status"] == "healthy" and job.truth["blocked_ranks"] == []
    last, first = job.dumps[6], job.dumps[0]  # stages 3 and 0 of the first pipeline
    assert "nccl:send 3->0" in _p2p_names(last, "pp") and "nccl:recv 0<-3" in _p2p_names(first, "pp")
    if p2p == "batched":  # Megatron's exchanges: a batch may hold a send and a recv
        markers = [e for e in _entries(job.dumps[2]) if e["profiling_name"] == "nccl:coalesced"]
        sizes = {sum(1 for e in _entries(job.dumps[2]) if e["is_p2p"] and e["p2p_seq_id"] == m["p2p_seq_id"]
                     and e["process_group"] == m["process_group"]) for m in markers}
        assert max(sizes) >= 2


def test_rotated_group_orders_give_each_rank_its_own_pg_ids():
    job = generate(16, tp=4, pp=1, steps=2, pg_order="rotated", hashed_names=True)
    ids: dict = {}
    for rank in range(16):
        dump = job.dumps[rank]
        for e in _entries(dump):
            ids.setdefault(e["process_group"][0], {})[rank] = e["pg_id"]
        assert set(dump["pg_config"]) >= {"0"} and all(len(n) == 40 for n in dump["pg_config"] if n != "0")
    assert all(set(by_rank.values()) == {0} for name, by_rank in ids.items() if name == "0")
    assert any(len(set(by_rank.values())) > 1 for name, by_rank in ids.items() if name != "0")


def test_unnamed_groups_take_ids_that_no_entry_or_row_shows():
    # As in the real NVRx dumps: ids the ranks' groups skip, more on one pipeline stage.
    job = generate(16, tp=2, pp=4, steps=2, pg_order="unnamed", pg_status="work")
    for rank in (0, 2):
        dump = job.dumps[rank]
        ids = sorted({e["pg_id"] for e in _entries(dump)})
        assert ids == ([0, 3, 4, 5] if rank == 0 else [0, 3, 5, 6])  # rank 2 is on stage 1, an odd one
        assert sorted(map(int, dump["pg_status"])) == ids and len(dump["pg_config"]) == 4
    same = generate(16, tp=2, pp=4, steps=2, pg_status="work")
    assert [e["process_group"] for e in _entries(job.dumps[2])] == [e["process_group"] for e in _entries(same.dumps[2])]


def test_gzipped_files_read_as_the_plain_ones(tmp_path):
    """`--gzip` (write_job(compress=True)) writes each dump gzipped; frtrace reads them to the same report."""
    from helpers import run_cli

    from frtrace.testing.synth import Fault, write_job

    job = generate(16, tp=4, pp=2, steps=3, fault=Fault("hang", rank=1, group="tp", step=2))
    plain = write_job(job, tmp_path / "plain")
    packed = write_job(job, tmp_path / "packed", compress=True)
    assert all(path.read_bytes()[:2] == b"\x1f\x8b" for path in packed)
    assert sum(p.stat().st_size for p in packed) < sum(p.stat().st_size for p in plain)
    reports = [run_cli([directory, "--format", "json"]) for directory in (tmp_path / "plain", tmp_path / "packed")]
    assert reports[0].exit_code == reports[1].exit_code == 1
    assert json.loads(reports[0].stdout)["suspect_ranks"] == json.loads(reports[1].stdout)["suspect_ranks"] == [1]
    assert [f["message"] for f in json.loads(reports[0].stdout)["findings"]] == \
        [f["message"] for f in json.loads(reports[1].stdout)["findings"]]


@pytest.mark.parametrize("size", [2, 32, 513, 1024, 3125])
def test_moe_exchange_adds_up_and_never_goes_negative(size):
    """An uneven MoE all_to_all: what the group sends is what it receives, and no rank sends or
    takes a negative number of tokens, however large the DP group (a 32,768-rank job had -4)."""
    members = tuple(range(0, size * 8, 8))
    sums = synth._moe_sums(members)
    tokens = [synth._moe_tokens(members, rank, sums) for rank in members]
    assert min(min(sent, received) for sent, received in tokens) >= 0
    assert sum(sent for sent, _ in tokens) == sum(received for _, received in tokens)
