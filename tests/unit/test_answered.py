"""The answered-offsets commit metadata (schemas/answered.py): round trips, bounds, and what
a reader makes of metadata it did not write."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import answered


@given(
    st.integers(min_value=0, max_value=2**62),
    st.sets(st.integers(min_value=0, max_value=answered.MAX_SPAN - 1), max_size=300),
)
def test_round_trip_and_count(committed: int, rel: set[int]) -> None:
    done = {committed + r for r in rel}
    meta = answered.encode(committed, done)
    assert answered.decode(committed, meta) == done
    assert answered.count(meta) == len(done)
    assert len(meta) <= 4096  # Kafka's default offset.metadata.max.bytes


def test_offsets_below_the_commit_are_left_out_and_none_is_the_empty_string() -> None:
    assert answered.encode(100, [3, 99]) == ""
    assert answered.decode(100, answered.encode(100, [50, 100, 107])) == {100, 107}
    assert answered.decode(7, "") == set() and answered.count("") == 0


def test_past_the_span_is_refused() -> None:
    with pytest.raises(ValueError, match="past the commit"):
        answered.encode(10, [10 + answered.MAX_SPAN])


@pytest.mark.parametrize("meta", ["some tool's note", "done1:***", "done1:" + "AA==" * 1500])
def test_foreign_or_broken_metadata_is_an_error_to_decode_and_counts_nothing(meta: str) -> None:
    with pytest.raises(ValueError):
        answered.decode(0, meta)
    assert answered.count(meta) == 0
