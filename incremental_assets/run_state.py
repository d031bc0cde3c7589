"""What a run hands down its graph: its limits, and its batch of events with what the batch found.

Both are stored by the Delta IO manager (the limits as one row per run in `new_event_limits`,
the batch as the `events_this_run` scratch table plus its materialization metadata) and loaded
back as Dagster inputs of the same run; these functions convert them to and from storage.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from incremental_assets.logic.limits import BatchStats, RunLimits, RunState
from incremental_assets.utc import UTC_TIMESTAMP, aware, naive

LIMITS_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("state", pa.string()), ("lower_limit", UTC_TIMESTAMP),
     ("upper_limit", UTC_TIMESTAMP), ("now", UTC_TIMESTAMP)]
)


@dataclass(frozen=True)
class Found:
    """What a batch's events are: how many, the greatest cursor value among them, and how many
    copies of them the dedupe dropped (None: not known, for a batch counted from its stored rows)."""

    events: int
    batch_max: datetime | None
    duplicates: int | None


NOTHING_FOUND = Found(0, None, 0)


OBSERVED_WAIT_SECONDS = 60  # for a write's observed metrics, before its rows are counted instead


@dataclass(frozen=True)
class RunBatch:
    """This run's events (every event of the sessions it touches) and what they found.

    session_batch hands its events over with their counts observed (`found` is an Observation of
    `transforms.sessions.batch_counts`): the IO manager's write of the events fills it, so the batch
    is deduplicated once, by that write, not a second time to be counted first. Loaded back by the
    next steps, a batch carries the counts its materialization's metadata stored.
    """

    events: DataFrame
    limits: RunLimits
    next_event: datetime | None
    found: Found | Observation
    cursor: str  # the session timestamp column (what batch_max is the greatest of)

    @property
    def known_empty(self) -> bool:
        return self.found == NOTHING_FOUND

    @property
    def stats(self) -> BatchStats:
        if not isinstance(self.found, Found):
            raise ValueError("a batch's counts are known once its events are written: see RunBatch.counted")
        return BatchStats(self.limits, self.found.events, self.found.batch_max, self.next_event)

    def counted(self, written: bool, stored: Callable[[], DataFrame], wait_seconds: float = OBSERVED_WAIT_SECONDS) -> "RunBatch":
        """The batch with its counts, once its events are stored: those its write observed, or, when
        nothing was written (an earlier attempt of the step committed it) or the write reported no
        metrics within `wait_seconds` (a Spark Connect server may report none), counted from the
        `stored` rows. A run never waits on metrics that will not come."""
        if isinstance(self.found, Found):
            return self
        found = _observed(self.found, wait_seconds) if written else None
        if found is None:
            row = stored().agg(F.count(F.lit(1)).alias("n"), F.max(self.cursor).alias("batch_max")).first()
            found = Found(row["n"], row["batch_max"], None)
        return replace(self, found=found)


def _observed(observation: Observation, wait_seconds: float) -> Found | None:
    """The observed counts; they reach the driver through Spark's listener bus, just after the write
    returns. Classic Spark's `get` blocks until they do, so it is asked from a thread of its own."""
    metrics: dict = {}
    reader = threading.Thread(target=lambda: metrics.update(observation.get), daemon=True)
    reader.start()
    reader.join(wait_seconds)
    if "events" not in metrics:
        return None
    micros = metrics["batch_max_micros"]
    batch_max = None if micros is None else EPOCH + timedelta(microseconds=micros)
    return Found(int(metrics["events"]), batch_max, int(metrics["duplicates"] or 0))


EPOCH = datetime(1970, 1, 1)


def materialization_metadata(materialization) -> dict[str, Any]:
    """The plain values of an AssetMaterialization's metadata (what steps of a run read back)."""
    return {key: value.value for key, value in materialization.metadata.items()}


def limits_table(limits: RunLimits, run_id: str) -> pa.Table:
    """The run's row of `new_event_limits`."""
    row = (run_id, limits.state.value, aware(limits.lower), aware(limits.upper), aware(limits.now))
    return pa.Table.from_pylist([dict(zip(LIMITS_SCHEMA.names, row))], LIMITS_SCHEMA)


def limits_from_row(row: Mapping[str, Any]) -> RunLimits:
    return RunLimits(RunState(row["state"]), *(naive(row[c]) for c in ("lower_limit", "upper_limit", "now")))


def limits_metadata(limits: RunLimits) -> dict[str, str]:
    return {
        "run_state": limits.state.value,
        "lower_limit": str(limits.lower),
        "upper_limit": str(limits.upper),
        "now": str(limits.now),
    }


def batch_metadata(batch: RunBatch) -> dict[str, Any]:
    """A counted batch's stats as materialization metadata: shown in the UI, read back by the next steps."""
    stats = batch.stats
    duplicates = {} if batch.found.duplicates is None else {"duplicates_dropped": batch.found.duplicates}
    return {
        **limits_metadata(stats.limits),
        "events_found": stats.events_found,
        "batch_max": _text(stats.batch_max),
        "next_event": _text(stats.next_event),
        "caught_up": stats.caught_up,
        "cursor_column": batch.cursor,
        **duplicates,
    }


def batch_from_metadata(events: DataFrame, metadata: Mapping[str, Any]) -> RunBatch:
    stats = stats_from_metadata(metadata)
    found = Found(stats.events_found, stats.batch_max, metadata.get("duplicates_dropped"))
    return RunBatch(events, stats.limits, stats.next_event, found, metadata["cursor_column"])


def stats_from_metadata(metadata: Mapping[str, Any]) -> BatchStats:
    limits = RunLimits(
        RunState(metadata["run_state"]), *(_moment(metadata[k]) for k in ("lower_limit", "upper_limit", "now"))
    )
    return BatchStats(limits, int(metadata["events_found"]), _moment(metadata["batch_max"]), _moment(metadata["next_event"]))


def _text(moment: datetime | None) -> str:
    return "" if moment is None else str(moment)


def _moment(text: str) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
