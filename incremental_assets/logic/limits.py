"""Run limits and the incremental manifest's update rule, on plain Python values (SPEC §4).

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
class ManifestEntry:
    model: str
    last_success: datetime | None = None
    last_upper: datetime | None = None
    first_success: datetime | None = None

    @property
    def position(self) -> datetime | None:
        """How far the asset has got: its last processed event, or the end of a later empty window."""
        known = [t for t in (self.last_success, self.last_upper) if t is not None]
        return max(known) if known else None


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
    manifest: Mapping[str, ManifestEntry],
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
    positions = [manifest[m].position for m in models if m in manifest and manifest[m].position is not None]
    if not positions:
        return RunLimits(RunState.FIRST_RUN, start, min(start + backfill, now), now)
    min_ls, max_ls = min(positions), max(positions)
    if len(positions) < len(models):
        return RunLimits(RunState.NEW_MODEL, start, min(max_ls, start + backfill), now)
    if min_ls < max_ls:
        return RunLimits(RunState.OUT_OF_SYNC, min_ls - lookback, min(max_ls, min_ls + backfill), now)
    return RunLimits(RunState.STANDARD, max_ls - lookback, min(max_ls + backfill, now), now)


def keyhole_limits(lower: datetime, upper: datetime, now: datetime) -> RunLimits:
    if lower > upper:
        raise ValueError(f"keyhole lower ({lower}) must not be after upper ({upper})")
    if upper > now:
        raise ValueError(f"keyhole upper ({upper}) must not be in the future (now is {now})")
    return RunLimits(RunState.KEYHOLE, lower, upper, now)


def is_ahead(entry: ManifestEntry | None, limits: RunLimits) -> bool:
    """An asset whose position is already at or past the run's upper limit has nothing to do."""
    return entry is not None and entry.position is not None and limits.upper <= entry.position


def advance(
    entry: ManifestEntry | None,
    model: str,
    batch_max: datetime | None,
    resume_from: datetime | None,
) -> ManifestEntry:
    """The manifest row of an asset that succeeded in this run.

    `batch_max` is the greatest cursor value of the run's events (None when it had none). When
    it does not go past the asset's position, the window held nothing new and Snowplow would
    repeat it forever (FIX "never stuck"): the position moves to `resume_from` instead, the next
    source event after the window, or the window's upper limit when there is none yet.
    """
    entry = entry or ManifestEntry(model)
    last_success = max((t for t in (entry.last_success, batch_max) if t is not None), default=None)
    progressed = batch_max is not None and (entry.position is None or batch_max > entry.position)
    last_upper = entry.last_upper
    if not progressed and resume_from is not None:
        last_upper = max(t for t in (entry.last_upper, resume_from) if t is not None)
    return replace(
        entry, last_success=last_success, last_upper=last_upper, first_success=entry.first_success or last_success
    )


def advance_all(
    manifest: Mapping[str, ManifestEntry],
    succeeded: Iterable[str],
    batch_max: datetime | None,
    resume_from: datetime | None = None,
) -> dict[str, ManifestEntry]:
    """The whole manifest after a run: assets that succeeded advance, all others keep their row."""
    updated = dict(manifest)
    for model in succeeded:
        updated[model] = advance(manifest.get(model), model, batch_max, resume_from)
    return updated
