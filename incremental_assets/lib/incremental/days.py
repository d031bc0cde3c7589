"""Which event days to (re)aggregate after a run, on plain Python values.

A day's new rows are *fresh* when any was loaded on the day itself (a row without a load time,
from an older loader, was not); otherwise they are *late* and wait in `pending_late_events` until
there are `min_rows_to_process` of them, within the `reprocess_days` horizon. FIXes over the seed:
recomputing a day resets its pending count; the horizon is a date window (fresh days are never
dropped); pending events beyond the horizon stay counted, with status `beyond_horizon`, for a
partition backfill to apply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from typing import Any, Iterable, Mapping

from incremental_assets.lib.state.records import BEYOND_HORIZON, DEFERRED, PROCESSED, TO_PROCESS, DayStatus
from incremental_assets.lib.utc import naive


@dataclass(frozen=True)
class LoadGroup:
    """The new rows of one event day that were loaded on one load day (None: no load_tstamp)."""

    event_date: date
    load_date: date | None
    rows: int
    max_load_tstamp: datetime | None
    max_delay_hours: float | None

    @property
    def late(self) -> bool:
        """Not loaded on its event day. A row without a load time (an older loader) was not either."""
        return self.load_date != self.event_date


@dataclass(frozen=True)
class DayArrivals:
    """The rows of one event day that a run newly inserted into filtered_events."""

    day: date
    rows: int
    late_rows: int  # loaded on another day than the event day, or without a load time
    max_load_tstamp: datetime | None  # None: no row had a load time
    max_delay_hours: float

    @property
    def fresh(self) -> bool:
        return self.rows > self.late_rows


def _greatest(values: Iterable[Any]) -> Any:
    """The largest value that is not None, or None."""
    return max((v for v in values if v is not None), default=None)


def arrivals_by_day(groups: Iterable[LoadGroup]) -> list[DayArrivals]:
    """The arrival rule, in one place for Spark and for the preview: per event day, its new rows,
    how many are late, the latest load and the longest delay; sorted by day."""
    by_day: dict[date, list[LoadGroup]] = {}
    for group in groups:
        by_day.setdefault(group.event_date, []).append(group)
    return [
        DayArrivals(
            day,
            sum(g.rows for g in day_groups),
            sum(g.rows for g in day_groups if g.late),
            _greatest(g.max_load_tstamp for g in day_groups),
            _greatest(g.max_delay_hours for g in day_groups) or 0.0,  # 0.0: no row had both times
        )
        for day, day_groups in sorted(by_day.items())
    ]


def arrivals_from_rows(rows: Iterable[Mapping]) -> list[DayArrivals]:
    """The arrival rule on plain rows (`event_date`, `load_tstamp`, `derived_tstamp`), for the
    preview that reads them without Spark; pyarrow's UTC-aware timestamps are made naive."""
    loads: dict[tuple[date, date | None], list[tuple[datetime | None, float | None]]] = {}
    for row in rows:
        loaded, derived = naive(row["load_tstamp"]), naive(row["derived_tstamp"])
        delay = (_epoch_seconds(loaded) - _epoch_seconds(derived)) / 3600 if loaded and derived else None
        loads.setdefault((row["event_date"], loaded.date() if loaded else None), []).append((loaded, delay))
    return arrivals_by_day(
        LoadGroup(event_date, load_date, len(group), _greatest(t for t, _ in group), _greatest(h for _, h in group))
        for (event_date, load_date), group in loads.items()
    )


_EPOCH = datetime(1970, 1, 1)


def _epoch_seconds(moment: datetime) -> float:
    """A naive UTC instant as Spark casts a timestamp to double (its microseconds / 1e6): delays
    computed from these match the daily manifest's in Spark to the last bit."""
    return ((moment - _EPOCH) // timedelta(microseconds=1)) / 1e6


def horizon(upper: datetime, reprocess_days: int) -> date:
    """The earliest day late data is still applied to automatically."""
    return upper.date() - timedelta(days=reprocess_days)


def days_to_process(
    arrivals: Iterable[DayArrivals],
    state: Mapping[date, DayStatus],
    upper: datetime,
    start_date: date,
    reprocess_days: int,
    min_rows_to_process: int,
    run_id: str,
    asked: bool = False,
) -> dict[date, DayStatus]:
    """The manifest rows this run changes, each with its new status. `asked`: a keyhole run, whose
    rows an operator, a load or the source sensor asked to process: every day they land on is
    recomputed, however late (the horizon and min_rows_to_process govern what arrives by itself)."""
    earliest = horizon(upper, reprocess_days)
    changed = {}
    for arrival in arrivals:
        if arrival.day < start_date or arrival.rows == 0:
            continue
        known = state.get(arrival.day)
        entry = known or DayStatus(arrival.day)
        pending = entry.pending_late_events + (0 if arrival.fresh else arrival.rows)
        entry = replace(
            entry,
            pending_late_events=pending,
            late_events_total=entry.late_events_total + arrival.late_rows,
            max_load_tstamp=_greatest((entry.max_load_tstamp, arrival.max_load_tstamp)),
            max_delay_hours=max(entry.max_delay_hours, arrival.max_delay_hours),
            last_run_id=run_id,
        )
        if known is None or arrival.fresh or asked or (pending >= min_rows_to_process and arrival.day >= earliest):
            status = TO_PROCESS
        elif arrival.day < earliest:
            status = BEYOND_HORIZON
        else:
            status = DEFERRED
        changed[arrival.day] = replace(entry, status=status)
    return changed


def mark_processed(entry: DayStatus, events: int, processed_at: datetime, run_id: str) -> DayStatus:
    """A day recomputed whole from filtered_events: everything pending is now applied."""
    return replace(
        entry,
        processed_events=events,
        pending_late_events=0,
        status=PROCESSED,
        last_processed_at=processed_at,
        last_run_id=run_id,
    )


def processed_days(
    days: Iterable[date], events_per_day: Mapping[date, int], known: Mapping[date, DayStatus], processed_at: datetime,
    run_id: str,
) -> list[DayStatus]:
    """The manifest rows of days a daily run recomputed: every day it aggregated events of, and
    every known day of its range (now with the events it holds, none included)."""
    return [
        mark_processed(known.get(day) or DayStatus(day), events_per_day.get(day, 0), processed_at, run_id)
        for day in days
        if events_per_day.get(day) or day in known
    ]


def stranded(state: Mapping[date, DayStatus]) -> list[DayStatus]:
    """Days whose late events will not be applied automatically (an asset check warns on these)."""
    return sorted((d for d in state.values() if d.status == BEYOND_HORIZON), key=lambda d: d.event_date)


def stranded_note(days: list[DayStatus]) -> str | None:
    """What the warning about late events beyond the horizon says: how many, on which days (as
    ranges), and the command that applies them (one backfill per range); None when there are none."""
    if not days:
        return None
    ranges = contiguous_ranges(d.event_date for d in days)
    named = ", ".join(str(first) if first == last else f"{first} .. {last}" for first, last in ranges)
    commands = "; ".join(f"incremental-assets backfill --start {first} --end {last}" for first, last in ranges)
    pending = sum(d.pending_late_events for d in days)
    return (f"{pending} late events on {len(days)} day(s) wait for a backfill ({named}): {commands}, "
            "or materialize those partitions of daily_aggregates in the UI")


def contiguous_ranges(days: Iterable[date]) -> list[tuple[date, date]]:
    """Days grouped into inclusive [first, last] runs of consecutive dates: one daily run each."""
    ranges: list[tuple[date, date]] = []
    for day in sorted(set(days)):
        if ranges and day == ranges[-1][1] + timedelta(days=1):
            ranges[-1] = (ranges[-1][0], day)
        else:
            ranges.append((day, day))
    return ranges


def mismatched_days(aggregated: Mapping[date, int], held: Mapping[date, int]) -> list[dict[str, Any]]:
    """Days whose aggregated event count differs from the events filtered_events holds, either way
    (a day missing on one side counts 0 there), in date order."""
    return [
        {"event_date": day, "aggregated": aggregated.get(day, 0), "filtered_events": held.get(day, 0)}
        for day in sorted(set(aggregated) | set(held))
        if aggregated.get(day, 0) != held.get(day, 0)
    ]


def backfill_range(start: date, end: date, first: date, today: date) -> tuple[date, date, str | None]:
    """The days of a requested backfill [start, end] that have a daily partition (from `first`,
    start_date, to today), with a note on those that have none yet; ValueError, naming the way
    out, when the range starts outside the partitions."""
    if end < start:
        raise ValueError(f"--end ({end}) is before --start ({start})")
    if start < first:
        raise ValueError(
            f"--start {start} is before the first daily partition, {first} (start_date): start the range at {first}"
        )
    if start > today:
        raise ValueError(f"no day from {start} on has a daily partition yet: the last one is today, {today}")
    if end > today:
        return start, today, (
            f"note: {today + timedelta(days=1)} .. {end} have no daily partition yet (the last one is today): "
            f"backfilling {start} .. {today}"
        )
    return start, end, None


def requested_day_ranges(days: dict[date, DayStatus], today: date) -> list[tuple[date, date]]:
    """What the daily sensor and `incremental-assets run` request: one run per range of days to
    process, up to today (the last partition). A later day (events stamped in the future) stays
    to_process until its partition exists."""
    return contiguous_ranges(day for day, status in days.items() if status.status == TO_PROCESS and day <= today)


def daily_runs(days: dict[date, DayStatus], today: date) -> list[tuple[date, date, bool]]:
    """The requested day ranges, each with whether its run writes attributes and attributes_history
    too: only the last's does, since each would recompute both over all of daily_aggregates. A run
    of the last range that ends first leaves them behind the others; the follow sensor (and the
    command line's next look) brings them up."""
    ranges = requested_day_ranges(days, today)
    return [(first, last, i == len(ranges) - 1) for i, (first, last) in enumerate(ranges)]


def days_window_tags(first: date, last: date) -> dict[str, str]:
    """Run tags that make one run (one Spark session) materialize the days [first, last]."""
    return {"dagster/asset_partition_range_start": first.isoformat(), "dagster/asset_partition_range_end": last.isoformat()}


def day_range(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]
