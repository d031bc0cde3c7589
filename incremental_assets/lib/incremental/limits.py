"""Run limits and the incremental manifest's update rule, on plain Python values.

The manifest keeps, per incremental asset, `last_success` (the greatest cursor value it has
processed) and `last_upper` (how far an empty window has moved it on; FIX "never stuck"). The
position an asset has reached is the greater of the two; the four states are Snowplow's,
computed over those positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from enum import Enum
from typing import Iterable, Mapping

from incremental_assets.lib.state.records import ManifestEntry


class RunState(str, Enum):
    FIRST_RUN = "first_run"
    NEW_MODEL = "new_model"
    OUT_OF_SYNC = "out_of_sync"
    STANDARD = "standard"
    KEYHOLE = "keyhole"


STATE_LOG = {
    RunState.FIRST_RUN: "No data in manifest. Processing data from start_date",
    RunState.NEW_MODEL: "New incremental model. Backfilling",
    RunState.OUT_OF_SYNC: "Incremental models out of sync. Syncing",
    RunState.STANDARD: "Standard incremental run",
    RunState.KEYHOLE: "Keyhole backfill of an explicit window. The manifest will not move",
}


@dataclass(frozen=True)
class RunLimits:
    state: RunState
    lower: datetime
    upper: datetime
    now: datetime

    @property
    def log_lines(self) -> list[str]:
        return [STATE_LOG[self.state], f"Processing data between '{self.lower}' and '{self.upper}'"]

    @property
    def moves_manifest(self) -> bool:
        return self.state is not RunState.KEYHOLE


def run_limits(
    state: Mapping[str, ManifestEntry],
    models: Iterable[str],
    start_date: date,
    backfill_limit_days: int,
    lookback_window_hours: float,
    now: datetime,
) -> RunLimits:
    """The window [lower, upper] (inclusive) of the next run over the incremental `models`."""
    models = list(models)
    if not models:
        raise ValueError("A run needs at least one incremental asset to compute its limits")
    start = datetime.combine(start_date, time.min)
    backfill, lookback = timedelta(days=backfill_limit_days), timedelta(hours=lookback_window_hours)
    positions = [state[m].position for m in models if m in state and state[m].position is not None]
    if not positions:
        return RunLimits(RunState.FIRST_RUN, start, min(start + backfill, now), now)
    min_ls, max_ls = min(positions), max(positions)
    if len(positions) < len(models):
        return RunLimits(RunState.NEW_MODEL, start, min(max_ls, start + backfill), now)
    if min_ls < max_ls:
        return RunLimits(RunState.OUT_OF_SYNC, min_ls - lookback, min(max_ls, min_ls + backfill), now)
    return RunLimits(RunState.STANDARD, max_ls - lookback, min(max_ls + backfill, now), now)


def next_standard_lower(
    state: Mapping[str, ManifestEntry], models: Iterable[str], lookback_window_hours: float
) -> datetime | None:
    """Where the standard cursor's next window starts for the first of `models` to read it: a row
    behind it is read by no standard window of some asset (None: no asset has a position yet)."""
    positions = [state[m].position for m in models if m in state and state[m].position is not None]
    return min(positions) - timedelta(hours=lookback_window_hours) if positions else None


def keyhole_limits(lower: datetime, upper: datetime, now: datetime) -> RunLimits:
    if lower > upper:
        raise ValueError(f"keyhole lower ({lower}) must not be after upper ({upper})")
    if upper > now:
        raise ValueError(f"keyhole upper ({upper}) must not be in the future (now is {now})")
    return RunLimits(RunState.KEYHOLE, lower, upper, now)


def ahead_of(limits: RunLimits, entry: ManifestEntry | None) -> bool:
    """Whether an asset at `entry` has nothing new in the window: it is at or past the upper limit.
    A keyhole backfill processes its window wherever the manifest stands."""
    position = entry.position if entry else None
    return limits.moves_manifest and position is not None and limits.upper <= position


def nothing_new(limits: RunLimits, state: Mapping[str, ManifestEntry], models: Iterable[str]) -> bool:
    """Every incremental asset of the run is ahead of its window (a run repeated with no new data and
    the same 'now'): none will write, so the session layer has nothing to compute either."""
    return all(ahead_of(limits, state.get(model)) for model in models)


@dataclass(frozen=True)
class BatchStats:
    """What a run's batch (events_this_run) found; it decides how every incremental asset moves."""

    limits: RunLimits
    events_found: int
    batch_max: datetime | None  # greatest cursor value among the batch's events
    next_event: datetime | None  # first source event after the window (up to now); None: caught up

    @property
    def caught_up(self) -> bool:
        """No source event lies past the window: every one loaded so far was inside a processed window."""
        return self.next_event is None


@dataclass(frozen=True)
class Cursor:
    """One incremental asset in one run: the manifest contract, decided in one place.

    Skip when already ahead; after the asset's write commits, advance its row. An explicit window
    (keyhole backfill) writes no state.
    """

    model: str
    entry: ManifestEntry | None
    batch: BatchStats

    @property
    def ahead(self) -> bool:
        """Already at or past this run's upper limit (e.g. the others during a new asset's backfill)."""
        return ahead_of(self.batch.limits, self.entry)

    def advanced(self) -> ManifestEntry | None:
        """The row to store once this asset's write committed; None when no state is written.

        `last_success` takes the batch maximum. When that does not go past the asset's position the
        window held nothing new, and Snowplow would repeat it forever (FIX "never stuck"): the
        position moves on to the next source event, or to the window's upper limit when there is
        none yet.
        """
        if not self.batch.limits.moves_manifest or self.ahead:
            return None
        entry = self.entry or ManifestEntry(self.model)
        batch_max = self.batch.batch_max
        last_success = _latest(entry.last_success, batch_max)
        progressed = batch_max is not None and (entry.position is None or batch_max > entry.position)
        last_upper = entry.last_upper
        if not progressed:
            last_upper = _latest(entry.last_upper, self.batch.next_event or self.batch.limits.upper)
        return replace(
            entry, last_success=last_success, last_upper=last_upper, first_success=entry.first_success or last_success
        )


def _latest(*moments: datetime | None) -> datetime | None:
    return max((m for m in moments if m is not None), default=None)
