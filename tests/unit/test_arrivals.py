"""Rows arriving in the source, classified once: the rule on plain values and on Arrow."""

from datetime import date, datetime

import pyarrow as pa
import pytest

from incremental_assets.lib.incremental.limits import RunLimits, RunState
from incremental_assets.lib.incremental.plan import run_arrival_bounds
from incremental_assets.lib.source.arrivals import Arrival, ArrivalBounds, Arrivals, count_arrow

START, NOW = datetime(2024, 1, 1), datetime(2024, 3, 10, 12)
LOWER = datetime(2024, 3, 10, 6)  # the next standard window's lower limit
STANDARD = ArrivalBounds(START, NOW, next_lower=LOWER)
KEYHOLE = ArrivalBounds(START, NOW, next_lower=LOWER, keyhole=(datetime(2024, 2, 1), datetime(2024, 2, 2)))


@pytest.mark.parametrize(
    "bounds, ts, expected",
    [
        (STANDARD, None, Arrival.NULL_CURSOR),
        (STANDARD, datetime(2023, 12, 31, 23), Arrival.BEFORE_START),
        (STANDARD, datetime(2024, 3, 11), Arrival.IN_FUTURE),
        (STANDARD, datetime(2024, 2, 1, 12), Arrival.BEHIND),
        (STANDARD, LOWER, Arrival.PENDING),  # the window's lower limit is inclusive
        (STANDARD, NOW, Arrival.PENDING),
        (KEYHOLE, datetime(2024, 2, 1, 12), Arrival.IN_KEYHOLE),
        (KEYHOLE, datetime(2024, 2, 2), Arrival.IN_KEYHOLE),  # inclusive
        (KEYHOLE, datetime(2024, 2, 3), Arrival.BEHIND),
        (ArrivalBounds(START, NOW), datetime(2024, 2, 1), Arrival.PENDING),  # no position yet: the first run reads it
    ],
)
def test_each_row_is_classified_once_first_rule_wins(bounds, ts, expected):
    assert bounds.reason(ts) is expected


def test_the_bounds_of_a_run():
    keyhole = RunLimits(RunState.KEYHOLE, datetime(2024, 2, 1), datetime(2024, 2, 2), NOW)
    assert run_arrival_bounds(keyhole, date(2024, 1, 1), LOWER) == KEYHOLE
    standard = RunLimits(RunState.STANDARD, LOWER, NOW, NOW)
    assert run_arrival_bounds(standard, date(2024, 1, 1), LOWER) == STANDARD


@pytest.mark.parametrize("tz", [None, "UTC"])
def test_arrow_counts_what_the_rule_says_row_by_row(tz):
    values = [None, datetime(2023, 6, 1), datetime(2024, 2, 5), datetime(2024, 2, 1, 9), datetime(2024, 3, 10, 7),
              datetime(2025, 1, 1), datetime(2024, 1, 15)]
    array = pa.array(values, pa.timestamp("us", tz))
    counted = count_arrow(array, STANDARD)
    expected = {}
    for value in values:
        expected[STANDARD.reason(value)] = expected.get(STANDARD.reason(value), 0) + 1
    assert dict(counted.counts) == expected == {
        Arrival.NULL_CURSOR: 1, Arrival.BEFORE_START: 1, Arrival.BEHIND: 3, Arrival.PENDING: 1, Arrival.IN_FUTURE: 1,
    }
    assert (counted.behind_from, counted.behind_to) == (datetime(2024, 1, 15), datetime(2024, 2, 5))
    assert counted.skipped() == {"cursor_before_start_date": 1, "cursor_in_future": 1, "behind_cursor": 3}


def test_arrivals_add_up():
    a = Arrivals({Arrival.BEHIND: 2}, datetime(2024, 2, 1), datetime(2024, 2, 3))
    b = Arrivals({Arrival.BEHIND: 1, Arrival.PENDING: 4}, datetime(2024, 1, 20), datetime(2024, 2, 2))
    assert a + b == Arrivals({Arrival.BEHIND: 3, Arrival.PENDING: 4}, datetime(2024, 1, 20), datetime(2024, 2, 3))
    assert (a + b).rows == 7


@pytest.mark.parametrize(
    "bounds, low, high, expected",
    [
        (STANDARD, LOWER, NOW, Arrival.PENDING),
        (STANDARD, datetime(2024, 2, 1), datetime(2024, 2, 2), Arrival.BEHIND),
        (STANDARD, datetime(2024, 2, 1), LOWER, None),  # straddles the window's lower limit: read it
        (STANDARD, datetime(2023, 1, 1), datetime(2023, 2, 1), Arrival.BEFORE_START),
        (STANDARD, datetime(2025, 1, 1), datetime(2025, 2, 1), Arrival.IN_FUTURE),
        (STANDARD, LOWER, datetime(2025, 1, 1), None),
        (KEYHOLE, datetime(2024, 2, 1, 1), datetime(2024, 2, 1, 2), Arrival.IN_KEYHOLE),
        (KEYHOLE, datetime(2024, 1, 31), datetime(2024, 2, 1, 2), None),
    ],
)
def test_a_files_range_has_one_class_or_must_be_read(bounds, low, high, expected):
    assert bounds.reason_of_range(low, high) is expected


def test_rows_behind_the_cursor_stay_stranded_until_a_keyhole_that_saw_them_covers_them():
    from incremental_assets.lib.source.arrivals import CountedArrivals, Stranded, stranded

    feb1, feb2, feb3 = datetime(2024, 2, 1), datetime(2024, 2, 2), datetime(2024, 2, 3)
    behind = Arrivals({Arrival.BEHIND: 5}, feb1, feb2)
    standard = CountedArrivals("standard", 10, behind)
    assert stranded([standard], set()) == [Stranded("standard", 5, feb1, feb2)]
    assert stranded([standard], set())[0].command == (
        "incremental-assets run --lower 2024-02-01T00:00:00 --upper 2024-02-02T00:00:00")

    covering = CountedArrivals("keyhole", 11, Arrivals(), keyhole=(feb1, feb3))
    assert stranded([standard, covering], {"keyhole"}) == [], "a later keyhole over the range"
    assert stranded([standard, covering], set()) != [], "a keyhole that did not succeed covers nothing"
    earlier = CountedArrivals("keyhole", 9, Arrivals(), keyhole=(feb1, feb3))
    assert stranded([standard, earlier], {"keyhole"}) != [], "it ran before the rows arrived"
    halves = [CountedArrivals("k1", 12, Arrivals(), keyhole=(feb1, datetime(2024, 2, 1, 12))),
              CountedArrivals("k2", 12, Arrivals(), keyhole=(datetime(2024, 2, 1, 12), feb2))]
    assert stranded([standard, *halves], {"k1", "k2"}) == [], "two keyholes together"

    failed = CountedArrivals("failed", 13, Arrivals({Arrival.IN_KEYHOLE: 3}), keyhole=(feb2, feb3))
    assert stranded([failed], set()) == [Stranded("failed", 3, feb2, feb3)]
    assert stranded([failed], {"failed"}) == []
