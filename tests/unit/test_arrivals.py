"""Rows arriving in the source, classified once: the rule on plain values and on Arrow; what a
rewrite of the source copied is not an arrival."""

from datetime import date, datetime

import pyarrow as pa
import pytest

from incremental_assets.lib.incremental.limits import RunLimits, RunState
from incremental_assets.lib.incremental.run_plan import run_arrival_bounds
from incremental_assets.lib.source.arrivals import (
    Arrival,
    ArrivalBounds,
    Arrivals,
    Origin,
    count_arrow,
    inserted_rows,
    origin_by_metrics,
    origin_of_added,
)

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
    before = CountedArrivals("k0", 12, Arrivals(), keyhole=(datetime(2024, 1, 20), datetime(2024, 1, 21)))
    assert stranded([standard, before, covering], {"k0", "keyhole"}) == [], "an earlier, disjoint keyhole hides nothing"
    assert stranded([standard, before, halves[0]], {"k0", "k1"}) != [], "half the range is still waiting"

    failed = CountedArrivals("failed", 13, Arrivals({Arrival.IN_KEYHOLE: 3}), keyhole=(feb2, feb3))
    assert stranded([failed], set()) == [Stranded("failed", 3, feb2, feb3)]
    assert stranded([failed], {"failed"}) == []


# -- rows a rewrite copied are not arrivals ----------------------------------------------------------

HELD, NEW, MIXED = Origin.HELD, Origin.NEW, Origin.MIXED
SPARK_DELETE = {"numRemovedFiles": "1", "numCopiedRows": "9", "numDeletedRows": "1", "numAddedFiles": "1"}
SPARK_UPDATE = {"numRemovedFiles": "1", "numCopiedRows": "9", "numUpdatedRows": "1", "numAddedFiles": "1"}
SPARK_MERGE = {"numTargetRowsCopied": "17", "numTargetRowsUpdated": "2", "numTargetRowsInserted": "3", "numOutputRows": "22"}
SPARK_APPEND = {"numFiles": "2", "numOutputRows": "20", "numOutputBytes": "10099"}
SPARK_OPTIMIZE = {"numRemovedFiles": "4", "numAddedFiles": "2", "minFileSize": "5450"}
RS_DELETE = {"num_removed_files": 1, "num_deleted_rows": 1, "num_copied_rows": 2}
RS_MERGE = {"num_target_rows_inserted": 1, "num_target_rows_updated": 1, "num_target_rows_copied": 1}


@pytest.mark.parametrize(
    "removed, data_change, expected",
    [
        ([], True, NEW),  # an append
        ([], False, HELD),  # changes no data and removes nothing: nothing new
        ([HELD, HELD], False, HELD),  # a compaction of files the table held
        ([NEW, NEW], False, NEW),  # a compaction of files appended since: their rows, moved
        ([HELD, NEW], False, MIXED),  # a compaction of both
        ([MIXED], False, MIXED),  # a compaction of a rewrite's files
        ([HELD], True, MIXED),  # a DELETE, UPDATE or MERGE of held rows: copies, maybe inserts
        ([NEW], True, NEW),  # a DELETE or UPDATE of rows appended since: what survives is new
        ([NEW, MIXED], True, MIXED),
    ],
)
def test_what_a_commit_added_is_what_it_removed_rearranged_copied_or_appended(removed, data_change, expected):
    assert origin_of_added(removed, data_change) is expected


@pytest.mark.parametrize(
    "metrics, expected",
    [
        (SPARK_MERGE, 3), (RS_MERGE, 1),  # a MERGE says, in Spark's names and in delta-rs'
        (SPARK_DELETE, 0), (SPARK_UPDATE, 0), (RS_DELETE, 0),  # copied rows and no insert
        (SPARK_APPEND, None), (SPARK_OPTIMIZE, None), ({}, None),  # they do not say
    ],
)
def test_inserted_rows_by_operation_metrics(metrics, expected):
    assert inserted_rows(metrics) == expected


@pytest.mark.parametrize(
    "removed, metrics, expected",
    [
        ([HELD], SPARK_DELETE, HELD),  # an erasure whose removed file VACUUM took: copies only
        ([HELD, HELD], RS_DELETE, HELD),
        ([HELD], SPARK_MERGE, NEW),  # 3 inserts among 22 rows, not which: all 22 counted
        ([HELD], {**SPARK_MERGE, "numTargetRowsInserted": "0"}, HELD),
        ([HELD, NEW], SPARK_DELETE, NEW),  # rows appended since survive in it: all counted
        ([HELD], {}, NEW),  # metrics that do not say: all counted
    ],
)
def test_when_a_removed_file_is_gone_the_metrics_decide_and_doubt_counts(removed, metrics, expected):
    assert origin_by_metrics(removed, metrics) is expected


def test_no_rows_count_as_nothing():
    assert count_arrow(pa.array([], pa.timestamp("us")), STANDARD) == Arrivals()
