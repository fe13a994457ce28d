"""The fast indented JSON writer against the standard library's, text for text."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from frtrace.report.json_text import indented_json

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(),
)
_KEYS = st.text()
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.lists(inner, max_size=6).map(tuple),
        st.dictionaries(_KEYS, inner, max_size=6),
        st.lists(st.integers(), max_size=8),
        st.lists(st.text(), max_size=8),
    ),
    max_leaves=40,
)


def _stdlib(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_same_text_as_the_standard_library(value: object) -> None:
    assert indented_json(value) == _stdlib(value)


def test_a_report_shaped_value() -> None:
    value = {
        "status": "faults", "suspect_ranks": [5, 9], "summary": "rank 5 \u00e9 \u202e",
        "ranks": [{"ranks": "0-3", "count": 4, "blocked_in": None, "since_s": 1.5}, {"pg_names": ["0", "1"]}],
        "empty": {}, "none": [], "nested": [[], [[1, "a"]], {"b": [True, False]}],
        "odd floats": [math.inf, -math.inf, 1e300, -0.0, 0.1],
    }
    assert indented_json(value) == _stdlib(value)


def test_values_it_does_not_spell_fall_back_to_the_standard_library() -> None:
    class Count(int):
        pass

    for value in ({1: "a", 2: "b"}, {"a": Count(3)}, [Count(1), Count(2)], {"a": {None: 1}}):
        assert indented_json(value) == _stdlib(value)


def test_a_nan_is_written_as_the_standard_library_writes_it() -> None:
    assert indented_json([math.nan, {"x": math.nan}]) == _stdlib([math.nan, {"x": math.nan}])
