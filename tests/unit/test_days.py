"""The day-selection rule with hand-worked cases. Run upper limit 2024-03-05 12:00,
reprocess_days 5 (horizon: 2024-02-29), min_rows_to_process 5, start_date 2024-01-01."""

from datetime import date, datetime, timezone

import pytest

from incremental_assets.lib.incremental.days import (
    DayArrivals,
    LoadGroup,
    arrivals_by_day,
    arrivals_from_rows,
    contiguous_ranges,
    days_to_process,
    mark_processed,
    stranded,
)
from incremental_assets.lib.state.records import BEYOND_HORIZON, DEFERRED, PROCESSED, TO_PROCESS, DayStatus

UPPER = datetime(2024, 3, 5, 12)


def arrive(day, rows, late, delay=1.0):
    return DayArrivals(day, rows, late, datetime(2024, 3, 5, 11), delay)


def select(arrivals, state=None, min_rows=5):
    return days_to_process(arrivals, state or {}, UPPER, date(2024, 1, 1), 5, min_rows, "run-1")


def processed(day, events=100):
    return DayStatus(day, processed_events=events, status=PROCESSED)


def test_a_fresh_day_is_processed():
    [entry] = select([arrive(date(2024, 3, 5), 10, 0)], {date(2024, 3, 5): processed(date(2024, 3, 5))}).values()
    assert (entry.status, entry.pending_late_events) == (TO_PROCESS, 0)


def test_late_rows_below_the_threshold_are_deferred_then_processed_once_they_reach_it():
    day = date(2024, 3, 1)
    first = select([arrive(day, 2, 2)], {day: processed(day)})[day]
    assert (first.status, first.pending_late_events, first.late_events_total) == (DEFERRED, 2, 2)
    second = select([arrive(day, 3, 3)], {day: first})[day]
    assert (second.status, second.pending_late_events, second.late_events_total) == (TO_PROCESS, 5, 5)
    done = mark_processed(second, 105, datetime(2024, 3, 5, 13), "run-2")
    assert (done.status, done.pending_late_events, done.processed_events, done.late_events_total) == (
        PROCESSED, 0, 105, 5)


def test_late_rows_older_than_the_horizon_stay_counted_and_visible():
    day = date(2024, 2, 20)
    entry = select([arrive(day, 7, 7, delay=300.0)], {day: processed(day)})[day]
    assert (entry.status, entry.pending_late_events, entry.max_delay_hours) == (BEYOND_HORIZON, 7, 300.0)
    assert stranded({day: entry}) == [entry]


def test_the_horizon_is_a_date_window_inclusive_of_its_first_day():
    day = date(2024, 2, 29)
    assert select([arrive(day, 5, 5)], {day: processed(day)})[day].status == TO_PROCESS


def test_a_day_both_fresh_and_late_in_one_run_is_recomputed():
    day = date(2024, 3, 5)
    entry = select([arrive(day, 6, 2)], {day: processed(day)})[day]
    assert (entry.status, entry.pending_late_events, entry.late_events_total) == (TO_PROCESS, 0, 2)


def test_a_day_never_aggregated_is_processed_even_when_late_and_old():
    entry = select([arrive(date(2024, 1, 10), 1, 1)])[date(2024, 1, 10)]
    assert entry.status == TO_PROCESS


def test_days_before_start_date_and_days_without_rows_are_left_alone():
    assert select([arrive(date(2023, 12, 31), 4, 0), arrive(date(2024, 3, 4), 0, 0)]) == {}


def test_contiguous_days_make_one_range_each():
    days = [date(2024, 3, 5), date(2024, 3, 1), date(2024, 3, 2), date(2024, 3, 3), date(2024, 3, 3)]
    assert contiguous_ranges(days) == [(date(2024, 3, 1), date(2024, 3, 3)), (date(2024, 3, 5), date(2024, 3, 5))]
    assert contiguous_ranges([]) == []


def test_a_day_whose_rows_have_no_load_time_is_still_selected():
    entry = select([DayArrivals(date(2024, 3, 4), 2, 2, None, 0.0)])[date(2024, 3, 4)]
    assert (entry.status, entry.pending_late_events, entry.max_load_tstamp) == (TO_PROCESS, 2, None)


# The arrival rule: per event day, new rows, late rows (loaded on another day, or without a load
# time), the latest load and the longest delay.


def test_arrivals_add_up_the_load_groups_of_each_day_sorted_by_day():
    march_4 = date(2024, 3, 4)
    arrivals = arrivals_by_day([
        LoadGroup(march_4, march_4, 3, datetime(2024, 3, 4, 23), 1.0),  # fresh
        LoadGroup(date(2024, 3, 1), date(2024, 3, 5), 4, datetime(2024, 3, 5, 1), 96.0),  # only late rows
        LoadGroup(march_4, date(2024, 3, 5), 2, datetime(2024, 3, 5, 2), 5.5),  # late rows of a fresh day
    ])
    assert arrivals == [
        DayArrivals(date(2024, 3, 1), 4, 4, datetime(2024, 3, 5, 1), 96.0),
        DayArrivals(march_4, 5, 2, datetime(2024, 3, 5, 2), 5.5),
    ]
    assert [a.fresh for a in arrivals] == [False, True]


def test_rows_without_a_load_time_are_late():
    # Two rows from an older loader next to one loaded on the day: 3 rows, 2 late, still fresh;
    # the latest load and longest delay come from the row that has them.
    march_4 = date(2024, 3, 4)
    [arrival] = arrivals_by_day([
        LoadGroup(march_4, None, 2, None, None),
        LoadGroup(march_4, march_4, 1, datetime(2024, 3, 4, 10), 0.5),
    ])
    assert arrival == DayArrivals(march_4, 3, 2, datetime(2024, 3, 4, 10), 0.5)
    assert arrivals_by_day([LoadGroup(march_4, None, 2, None, None)]) == [DayArrivals(march_4, 2, 2, None, 0.0)]


def test_arrivals_from_rows_read_as_the_preview_does():
    # pyarrow hands back UTC-aware timestamps; a null load_tstamp comes from an older loader.
    # 03-01: loaded 03-03 10:00 after 48 h, and one without a load time: 2 rows, both late.
    # 03-04: loaded 23:00 after 1 h (fresh) and 03-05 02:00 after 2.5 h (late).
    def utc(*parts):
        return datetime(2024, *parts, tzinfo=timezone.utc)

    rows = [
        {"event_date": date(2024, 3, 4), "derived_tstamp": utc(3, 4, 22), "load_tstamp": utc(3, 4, 23)},
        {"event_date": date(2024, 3, 4), "derived_tstamp": utc(3, 4, 23, 30), "load_tstamp": utc(3, 5, 2)},
        {"event_date": date(2024, 3, 1), "derived_tstamp": utc(3, 1, 12), "load_tstamp": None},
        {"event_date": date(2024, 3, 1), "derived_tstamp": utc(3, 1, 10), "load_tstamp": utc(3, 3, 10)},
    ]
    assert arrivals_from_rows(rows) == [
        DayArrivals(date(2024, 3, 1), 2, 2, datetime(2024, 3, 3, 10), 48.0),
        DayArrivals(date(2024, 3, 4), 2, 1, datetime(2024, 3, 5, 2), 2.5),
    ]


def test_requested_ranges_stop_at_today_and_today_has_a_partition():
    """Today's events are aggregated hourly into today's partition; a day after today (events stamped in
    the future) waits, still to_process, until its partition exists."""
    from incremental_assets.defs.daily.aggregates import build_daily_assets
    from incremental_assets.lib.incremental.days import requested_day_ranges
    from incremental_assets.lib.utc import utcnow

    today = date(2024, 3, 4)
    days = {date(2024, 3, d): DayStatus(date(2024, 3, d), status=TO_PROCESS) for d in (2, 3, 4, 5)}
    assert requested_day_ranges(days, today) == [(date(2024, 3, 2), date(2024, 3, 4))]
    partitions = build_daily_assets(date(2024, 3, 1)).partitions_def
    assert partitions.get_last_partition_key() == utcnow().date().isoformat()


def test_a_backfill_range_is_checked_against_the_partitions_before_it_runs():
    from incremental_assets.lib.incremental.days import backfill_range

    first, today = date(2024, 3, 1), date(2024, 3, 10)
    assert backfill_range(date(2024, 3, 2), date(2024, 3, 4), first, today) == (date(2024, 3, 2), date(2024, 3, 4), None)
    start, end, note = backfill_range(date(2024, 3, 8), date(2024, 3, 12), first, today)
    assert (start, end) == (date(2024, 3, 8), today)
    assert note.startswith("note: 2024-03-11 .. 2024-03-12 have no daily partition yet")
    with pytest.raises(ValueError, match=r"--start 2024-02-27 is before the first daily partition, 2024-03-01 \(start_date\): start the range at 2024-03-01"):
        backfill_range(date(2024, 2, 27), date(2024, 3, 2), first, today)
    with pytest.raises(ValueError, match="no day from 2024-03-11 on has a daily partition yet"):
        backfill_range(date(2024, 3, 11), date(2024, 3, 12), first, today)
    with pytest.raises(ValueError, match="is before --start"):
        backfill_range(date(2024, 3, 5), date(2024, 3, 4), first, today)


def test_a_keyhole_runs_days_are_recomputed_however_late_and_few_their_rows():
    """A keyhole run's rows were asked for (a load, an operator, the source sensor): beyond the
    horizon and below min_rows_to_process alike, the days they land on are recomputed."""
    old, recent = date(2024, 2, 20), date(2024, 3, 4)
    state = {old: processed(old), recent: processed(recent)}
    arrivals = [arrive(old, 1, 1, delay=300.0), arrive(recent, 1, 1)]
    assert {d: s.status for d, s in select(arrivals, state).items()} == {old: BEYOND_HORIZON, recent: DEFERRED}
    asked = days_to_process(arrivals, state, UPPER, date(2024, 1, 1), 5, 5, "run-1", asked=True)
    assert {d: (s.status, s.pending_late_events) for d, s in asked.items()} == {old: (TO_PROCESS, 1), recent: (TO_PROCESS, 1)}


def test_only_the_last_range_of_days_writes_attributes():
    """Two gaps, three runs: attributes and their history once, in the last range's run (each run
    would recompute both over all of daily_aggregates); one range writes them in its own run."""
    from incremental_assets.lib.incremental.days import daily_runs

    today = date(2024, 3, 20)
    marked = {date(2024, 3, d): DayStatus(date(2024, 3, d), status=TO_PROCESS) for d in (2, 3, 9, 19, 20)}
    marked[date(2024, 3, 5)] = DayStatus(date(2024, 3, 5), status=PROCESSED)
    assert daily_runs(marked, today) == [
        (date(2024, 3, 2), date(2024, 3, 3), False),
        (date(2024, 3, 9), date(2024, 3, 9), False),
        (date(2024, 3, 19), date(2024, 3, 20), True),
    ]
    assert daily_runs({date(2024, 3, 9): DayStatus(date(2024, 3, 9), status=TO_PROCESS)}, today) == [
        (date(2024, 3, 9), date(2024, 3, 9), True)]
    assert daily_runs({}, today) == []


def test_the_stranded_note_names_the_days_and_the_backfill_of_each_range():
    from incremental_assets.lib.incremental.days import stranded_note

    days = [DayStatus(date(2024, 2, d), pending_late_events=n, status=BEYOND_HORIZON) for d, n in ((1, 5), (2, 3), (9, 14))]
    assert stranded_note([]) is None
    assert stranded_note(days) == (
        "22 late events on 3 day(s) wait for a backfill (2024-02-01 .. 2024-02-02, 2024-02-09): "
        "incremental-assets backfill --start 2024-02-01 --end 2024-02-02; "
        "incremental-assets backfill --start 2024-02-09 --end 2024-02-09, "
        "or materialize those partitions of daily_aggregates in the UI"
    )
