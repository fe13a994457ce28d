"""gloo dumps of a job with several groups list no ranks (pg_config: one group '' with
"[]"), so the job's size is not in them. A top rank that left no dump must not pass for a
smaller healthy job: its absence is found from the groups' shapes where they show it, the
report says how the size was found, and where nothing shows it an op every dumped rank
still holds is not called healthy."""

import json

import pytest
from helpers import gloo_job, run_cli, write_job

EXIT = {"healthy": 0, "faults": 1, "inconclusive": 3}


def mesh_groups(world: int = 8) -> dict:
    """A 2 x 4 mesh as new_group(..., group_desc=) makes it: tp [0-3], [4-7]; dp [i, i+4]."""
    groups = {"0": ("default_pg", tuple(range(world)))}
    for t in range(2):
        groups[str(1 + t)] = ("tp", tuple(range(4 * t, 4 * t + 4)))
    for i in range(4):
        groups[str(3 + i)] = ("dp", (i, i + 4))
    return groups


def mesh_program(rank: int, steps: int = 3, barrier: bool = True) -> list:
    tp, dp = ("1" if rank < 4 else "2"), str(3 + rank % 4)
    return [op for _ in range(steps) for op in (f"all_reduce@{tp}", f"all_reduce@{dp}")] + (["barrier"] if barrier else [])


def report_of(tmp_path, dumps: dict) -> tuple:
    result = run_cli([write_job(tmp_path / "job", dumps), "--format", "json", "--workers", "1"])
    report = json.loads(result.stdout)
    assert result.exit_code == EXIT[report["status"]]
    return report, result


def text_of(tmp_path) -> str:
    """The text report with its lines unwrapped, so phrases are found wherever the width broke them."""
    return " ".join(run_cli([tmp_path / "job", "--workers", "1"]).stdout.split())


def test_a_mesh_whose_top_rank_hung_without_a_dump_blames_it(tmp_path):
    steps = {r: mesh_program(r, barrier=False) for r in range(8)}
    steps[7] = steps[7][:4]  # never issues its third tp all_reduce; 4-6 wait in it
    dumps = gloo_job(steps, groups=mesh_groups())
    del dumps[7]
    report, _ = report_of(tmp_path, dumps)
    assert (report["status"], report["suspect_ranks"]) == ("faults", [7])
    assert report["inputs"]["world_size"] == 8 and report["inputs"]["ranks_missing"] == [7]
    assert report["inputs"]["world_size_source"] == "group_shapes"
    assert "sibling groups are short of rank 7" in text_of(tmp_path)


@pytest.mark.parametrize("hang", [True, False], ids=["peers_timed_out", "healthy"])
def test_a_mesh_whose_top_rank_left_no_dump_is_not_called_healthy(tmp_path, hang):
    # Peers that timed out retire the op as if it finished, and a healthy job retires it
    # too: the dumps cannot tell which, so inconclusive, naming the missing rank.
    steps = {r: mesh_program(r, barrier=not hang) for r in range(8)}
    if hang:
        steps[7] = steps[7][:4]
    dumps = gloo_job(steps, groups=mesh_groups(), timed_out=hang)
    del dumps[7]
    report, _ = report_of(tmp_path, dumps)
    assert (report["status"], report["suspect_ranks"]) == ("inconclusive", [])
    assert report["inputs"]["ranks_missing"] == [7]
    assert any(f["kind"] == "missing_dump" and 7 in f["ranks"] for f in report["findings"])


def test_a_complete_mesh_is_healthy_and_says_its_size_comes_from_the_file_names(tmp_path):
    report, _ = report_of(tmp_path, gloo_job({r: mesh_program(r) for r in range(8)}, groups=mesh_groups()))
    assert (report["status"], report["inputs"]["world_size"], report["inputs"]["world_size_source"]) == ("healthy", 8, "files")
    assert "World size 8 is taken from the file names" in text_of(tmp_path)


def test_ranks_still_holding_an_op_of_a_world_of_guessed_size_are_inconclusive(tmp_path):
    # Nothing shows a rank 3 (one group, no shapes to compare), but every dumped rank holds
    # all_reduce #4 unretired: it may be waiting on a top rank that left no dump.
    report, _ = report_of(tmp_path, gloo_job({r: ["all_reduce"] * 4 for r in range(3)}, world=4))
    assert (report["status"], report["suspect_ranks"], report["inputs"]["world_size"]) == ("inconclusive", [], 3)
    (warning,) = [f for f in report["findings"] if f["rule"] == "missing.unseen_top_ranks"]
    assert (warning["severity"], warning["collective_seq_id"], warning["ranks"]) == ("warning", 4, [0, 1, 2])


def test_the_same_ranks_with_the_size_given_blame_the_missing_rank(tmp_path):
    dumps = gloo_job({r: ["all_reduce"] * 4 for r in range(3)}, world=4)
    result = run_cli([write_job(tmp_path / "job", dumps), "--format", "json", "--workers", "1", "--world-size", "4"])
    report = json.loads(result.stdout)
    assert (report["status"], report["suspect_ranks"], report["inputs"]["world_size_source"]) == ("faults", [3], "option")


def test_undescribed_groups_of_different_sizes_invent_no_rank(tmp_path):
    # Groups without a description need not be alike: [0, 1, 2] next to [3] says nothing.
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("undefined", (0, 1, 2)), "2": ("undefined", (3,))}
    steps = {r: (["all_reduce@1"] if r < 3 else ["all_reduce@2"]) * 2 + ["barrier"] for r in range(4)}
    report, _ = report_of(tmp_path, gloo_job(steps, groups=groups))
    assert (report["status"], report["inputs"]["world_size"], report["inputs"]["ranks_missing"]) == ("healthy", 4, [])


def test_a_family_missing_a_dumped_rank_invents_no_rank(tmp_path):
    # Rank 6 holds no dp entries (its buffer kept only tp ones): dp [2] looks short, but the
    # family misses a rank with a dump, so its shape proves nothing about ranks above 7.
    steps = {r: mesh_program(r) for r in range(8)}
    steps[6] = [op for op in steps[6] if "@5" not in op]
    report, _ = report_of(tmp_path, gloo_job(steps, groups=mesh_groups()))
    assert report["inputs"]["world_size"] == 8 and report["inputs"]["ranks_missing"] == []


@pytest.mark.parametrize("hang", [True, False], ids=["hung", "healthy"])
@pytest.mark.parametrize("lost", [0, 1, 3, 5])
def test_a_mesh_without_the_dump_of_a_rank_below_the_top_keeps_its_size(tmp_path, lost, hang):
    # Rank 7 left a dump, so the files say 8 ranks. The dp group of the lost rank shows one
    # member, a rank short; the lost rank itself completes it. It used to be read as short
    # of a rank beyond the files (rank 11 next to rank 7), which made a 12-rank job of
    # ranks 8-11 that never existed and named them as ranks without a dump.
    steps = {r: mesh_program(r, barrier=not hang) for r in range(8)}
    if hang:
        steps[lost] = steps[lost][:4]  # never issues its third tp all_reduce
    dumps = gloo_job(steps, groups=mesh_groups())
    del dumps[lost]
    report, _ = report_of(tmp_path, dumps)
    assert report["inputs"]["world_size"] == 8 and report["inputs"]["ranks_missing"] == [lost]
    assert report["inputs"]["world_size_source"] == "files"
    assert {r for f in report["findings"] for r in f["ranks"]} <= set(range(8))
    expected = ("faults", [lost]) if hang else ("inconclusive", [])
    assert (report["status"], report["suspect_ranks"]) == expected
