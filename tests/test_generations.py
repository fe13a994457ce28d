"""Several incidents in one directory: generations told apart, the newest complete read."""

from pathlib import Path

import pytest

from frtrace.load.generations import (
    DumpFile,
    SameRankTwice,
    choose_generation,
    describe,
    plausible_time,
    split_generations,
)

T = 1_700_000_000.0


def files(directory: str, ranks, tag: str = "", mtime: float = T) -> list:
    return [DumpFile(rank, Path(directory) / f"rank_{rank}{tag}", tag, mtime) for rank in ranks]


def test_one_incident_is_one_generation_with_nothing_left_out():
    choice = choose_generation(files("d", range(4)))
    assert choice.chosen.ranks == (0, 1, 2, 3) and choice.others == ()


def test_a_tagged_rerun_is_another_generation_and_the_newest_complete_wins():
    old, new = files("d", range(4), mtime=T), files("d", range(4), ".1", mtime=T + 3600)
    choice = choose_generation(old + new)
    assert choice.chosen.files == tuple(new) and choice.left_out == tuple(old)


def test_the_newest_incomplete_set_loses_to_an_older_complete_one():
    old, new = files("a", range(4), mtime=T), files("b", [1, 2], mtime=T + 3600)
    choice = choose_generation(old + new)
    assert choice.chosen.ranks == (0, 1, 2, 3) and [g.ranks for g in choice.others] == [(1, 2)]


def test_files_minutes_apart_in_one_directory_are_two_generations():
    # A later incident overwrote ranks 0-3 of an 8-rank job's files.
    old, new = files("d", range(4, 8), mtime=T), files("d", range(4), mtime=T + 900)
    assert [g.ranks for g in split_generations(old + new)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert choose_generation(old + new).chosen.ranks == (0, 1, 2, 3)


def test_per_host_subdirectories_of_one_job_are_one_generation():
    choice = choose_generation(files("node0", range(4), mtime=T) + files("node1", range(4, 8), mtime=T + 2))
    assert choice.chosen.ranks == tuple(range(8)) and choice.others == ()


def test_subdirectories_repeating_ranks_are_generations_by_time():
    choice = choose_generation(files("run1", range(4), mtime=T) + files("run2", range(4), mtime=T + 600))
    assert {f.path.parent.name for f in choice.chosen.files} == {"run2"}


def test_the_same_rank_twice_at_the_same_time_is_an_error_naming_both():
    with pytest.raises(SameRankTwice) as err:
        choose_generation(files("a", range(4)) + files("b", [0]))
    assert "a/rank_0" in str(err.value) and "b/rank_0" in str(err.value)


def test_no_files_no_choice():
    assert choose_generation([]) is None


# Issue 26 item 3: one file's clock cannot fool the choice.


def test_one_file_touched_into_the_future_does_not_win_over_nearly_every_rank():
    job = files("d", range(1, 128), mtime=T)
    touched = files("d", [0], mtime=T + 360)  # complete on its own: rank 0 is all it needs
    choice = choose_generation(job + touched)
    assert choice.chosen.ranks == tuple(range(1, 128)) and choice.left_out == tuple(touched)
    assert "nearly every rank (127 of 128)" in describe(choice) and "left out 1 newer file" in describe(choice)


def test_one_file_touched_into_the_past_does_not_win_either():
    job, touched = files("d", range(1, 128), mtime=T), files("d", [0], mtime=T - 3600)
    assert choose_generation(job + touched).chosen.ranks == tuple(range(1, 128))


def test_a_rerun_of_a_smaller_job_still_wins_over_an_older_set_missing_many():
    # A 2-rank rerun that overwrote rank_0 and rank_1 of an 8-rank job's directory: the older
    # files hold 6 of 8 ranks, not nearly every one.
    choice = choose_generation(files("d", range(2, 8), mtime=T) + files("d", [0, 1], mtime=T + 3600))
    assert choice.chosen.ranks == (0, 1)


@pytest.mark.parametrize("mtime", [float("inf"), float("-inf"), float("nan"), -1e300, 0.0, T + 7200])
def test_a_time_no_file_can_have_is_no_time(mtime):
    assert plausible_time(mtime, now=T) is None
    assert plausible_time(T - 60, now=T) == T - 60 and plausible_time(T + 60, now=T) == T + 60
