"""A pg_config's rank list read the quick way (`_rank_list_text`) and by its plain twin
(`_rank_list_text_plain`, a regular expression) gives the same answer for any text: the
texts c10d writes, and anything a hostile or odd writer could put there."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from frtrace.load.normalise import _parse_rank_list, _rank_list_text, _rank_list_text_plain

_ranks = st.lists(st.integers(min_value=0, max_value=10**26), max_size=40)


@settings(max_examples=400, deadline=None)
@given(_ranks)
def test_the_text_c10d_writes_reads_alike_both_ways(ranks):
    text = str(ranks)
    assert _rank_list_text(text) == _rank_list_text_plain(text)


# Pieces a rank list's text is made of, odd ones included: other brackets, other spaces,
# signs, floats, nested lists, leading zeros, non-ASCII digits, long numbers.
_pieces = st.sampled_from(["[", "]", "(", ")", ",", ", ", " ", "\t", "\n", "-", "+", ".", "e", "0", "7", "12",
                           "007", "٣", "true", "null", '"', "[1]", "9" * 25, "1_0"])


@settings(max_examples=1500, deadline=None)
@given(st.lists(_pieces, max_size=14).map("".join))
def test_any_text_reads_alike_both_ways(text):
    assert _rank_list_text(text) == _rank_list_text_plain(text)


def test_the_quick_way_reads_the_whole_world_of_a_large_job():
    text = str(list(range(32768)))
    assert _parse_rank_list(text) == tuple(range(32768))
    assert _parse_rank_list(str(list(range(5, 32768, 32)))) == tuple(range(5, 32768, 32))


def test_unsorted_and_repeated_ranks_come_back_sorted_and_once():
    assert _parse_rank_list("[3, 1, 2, 2]") == (1, 2, 3)
    assert _parse_rank_list("[]") is None
    assert _parse_rank_list("[1, -2]") is None
