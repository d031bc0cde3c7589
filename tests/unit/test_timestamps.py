"""The one timestamp rule on plain values: the window, unit inference, and the messages
that refuse a load. Vectors worked out by hand: 2024-03-01 00:00:00 UTC is 1709251200 s."""

from datetime import date
from decimal import Decimal

import pytest

from incremental_assets.lib.source.timestamps import (
    EpochUnit,
    Findings,
    Plausible,
    decide,
    infer_unit,
    scale_off,
    summarise,
    unit_of,
    when,
)

WINDOW = Plausible(date(1990, 1, 1), date(2030, 1, 1))  # 631152000 .. 1893456000 s
MARCH = 1709251200  # 2024-03-01 00:00:00 UTC, in seconds


def test_the_default_window_runs_from_1990_to_a_year_after_today_plus_days_late_allowed():
    window = Plausible.around(date(2026, 11, 24), days_late_allowed=3)
    assert (window.earliest, window.latest) == (date(1990, 1, 1), date(2027, 11, 27))
    assert Plausible.around(date(2026, 11, 24), 3, earliest=date(1970, 1, 1)).earliest == date(1970, 1, 1)
    with pytest.raises(ValueError, match="empty"):
        Plausible(date(2020, 1, 1), date(2020, 1, 1))


def test_the_window_in_each_unit():
    assert WINDOW.bounds(EpochUnit.SECONDS) == (631152000, 1893456000)
    assert WINDOW.bounds(EpochUnit.NANOS) == (631152000 * 10**9, 1893456000 * 10**9)
    assert WINDOW.holds(MARCH, EpochUnit.SECONDS) and not WINDOW.holds(MARCH, EpochUnit.MILLIS)
    assert not WINDOW.holds(1893456000, EpochUnit.SECONDS), "the upper end is open"


@pytest.mark.parametrize(
    "value, unit",
    [
        (MARCH, EpochUnit.SECONDS),
        (MARCH * 1000 + 123, EpochUnit.MILLIS),
        (MARCH * 10**6 + 123456, EpochUnit.MICROS),
        (MARCH * 10**9 + 123456789, EpochUnit.NANOS),
        (Decimal("1709251200.5"), EpochUnit.SECONDS),  # fractional seconds
        (12345, None),  # 1970: no unit puts it in the window
        (10**20, None),
    ],
)
def test_a_unit_is_inferred_from_magnitude(value, unit):
    assert unit_of(value, WINDOW) is unit


def test_a_column_fits_one_unit_or_none():
    assert infer_unit(MARCH, MARCH + 86_400, WINDOW) is EpochUnit.SECONDS
    assert infer_unit(MARCH, MARCH * 1000, WINDOW) is None, "seconds and milliseconds mixed"


def test_when_names_the_moment_or_only_the_year_when_no_datetime_holds_it():
    assert when(MARCH, EpochUnit.SECONDS) == "2024-03-01 00:00:00"
    assert when(MARCH * 10**6, EpochUnit.MICROS) == "2024-03-01 00:00:00"
    assert when(MARCH * 1000, EpochUnit.SECONDS) == "the year 56134"  # milliseconds taken as seconds


def test_scale_off_tells_how_many_thousands_a_time_is_off():
    assert scale_off(Decimal(MARCH * 1000), WINDOW) == 3  # milliseconds read as seconds
    assert scale_off(Decimal(MARCH * 10**9), WINDOW) == 9
    assert scale_off(Decimal(MARCH) / 1000, WINDOW) == -3  # seconds read as milliseconds: 1970-01-20
    assert scale_off(Decimal(42), WINDOW) == 0


def test_epochs_in_one_unit_are_read_in_it():
    found = Findings("load_tstamp", numbers=3, low=Decimal(MARCH * 1000), high=Decimal(MARCH * 1000 + 5000))
    assert decide(found, WINDOW) == decide(found, WINDOW, EpochUnit.MILLIS)
    assert decide(found, WINDOW).unit is EpochUnit.MILLIS and decide(found, WINDOW).problems == ()


def test_a_given_unit_that_puts_values_outside_the_window_refuses_with_the_unit_they_look_like():
    example = Decimal(MARCH * 1000)
    found = Findings("load_tstamp", numbers=200, low=example, high=example + 1,
                     outside={EpochUnit.SECONDS: (200, example)})
    [problem] = decide(found, WINDOW, EpochUnit.SECONDS).problems
    assert problem == (
        "200 epoch value(s) outside 1990-01-01 .. 2030-01-01 as seconds (e.g. 1709251200000: "
        "the year 56134); they look like epoch milliseconds (--epoch-unit ms)"
    )


def test_epochs_of_mixed_units_are_refused():
    found = Findings("collector_tstamp", numbers=2, low=Decimal(MARCH), high=Decimal(MARCH * 1000))
    [problem] = decide(found, WINDOW).problems
    assert "mix units (e.g. 1709251200 looks like seconds, 1709251200000 like milliseconds)" in problem


def test_epochs_no_unit_fits_are_refused_with_an_example():
    found = Findings("dvce_created_tstamp", numbers=10, low=Decimal(0), high=Decimal(MARCH),
                     outside={EpochUnit.SECONDS: (1, Decimal(0)), EpochUnit.MILLIS: (10, Decimal(0)),
                              EpochUnit.MICROS: (10, Decimal(0)), EpochUnit.NANOS: (10, Decimal(0))})
    [problem] = decide(found, WINDOW).problems
    assert problem == (
        "1 epoch value(s) fit no unit in 1990-01-01 .. 2030-01-01 (e.g. 0: as seconds "
        "1970-01-01 00:00:00, no epoch unit puts it there)"
    )


def test_timestamps_outside_the_window_and_unreadable_text_are_refused():
    found = Findings("derived_tstamp", stamps=5, stamps_outside=2, stamp_example=Decimal(MARCH * 1000),
                     unreadable=1, unreadable_example="yesterday at noon")
    assert decide(found, WINDOW).problems == (
        "1 value(s) are neither a timestamp nor an epoch number (e.g. 'yesterday at noon')",
        "2 timestamp(s) outside 1990-01-01 .. 2030-01-01 (e.g. the year 56134); they look "
        "1,000 times too large, as if epoch milliseconds were read as seconds",
    )
    assert decide(found, WINDOW).unit is None


def test_a_problem_shared_by_columns_is_told_once_naming_them_all():
    problem = "3 epoch value(s) outside 1990-01-01 .. 2030-01-01 as seconds (e.g. {}: the year 56134)"
    decisions = [
        decide(Findings(c, numbers=3, low=Decimal(MARCH * 1000), high=Decimal(MARCH * 1000),
                        outside={EpochUnit.SECONDS: (3, Decimal(MARCH * 1000 + i))}), WINDOW, EpochUnit.SECONDS)
        for i, c in enumerate(("collector_tstamp", "load_tstamp"))
    ]
    [line] = summarise(decisions)
    assert line.startswith("collector_tstamp, load_tstamp: " + problem.format(MARCH * 1000))
