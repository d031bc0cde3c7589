"""The day-selection rule (SPEC §7.2) with hand-worked cases. Run upper limit 2024-03-05 12:00,
reprocess_days 5 (horizon: 2024-02-29), min_rows_to_process 5, start_date 2024-01-01."""

from datetime import date, datetime

from incremental_assets.logic.days import (
    BEYOND_HORIZON,
    DEFERRED,
    PROCESSED,
    TO_PROCESS,
    DayArrivals,
    DayStatus,
    contiguous_ranges,
    days_to_process,
    mark_processed,
    stranded,
)

UPPER = datetime(2024, 3, 5, 12)


def arrive(day, rows, late, delay=1.0):
    return DayArrivals(day, rows, late, datetime(2024, 3, 5, 11), delay)


def select(arrivals, manifest=None, min_rows=5):
    return days_to_process(arrivals, manifest or {}, UPPER, date(2024, 1, 1), 5, min_rows, "run-1")


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
