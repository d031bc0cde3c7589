"""What a run hands down its graph: its plan (limits, and what arrived in the source since the last
run looked), and its batch of events with what the batch found.

Both are stored by the Delta IO manager (the plan as one row per run in `new_event_limits`, the
batch as the `events_this_run` scratch table plus its materialization metadata) and loaded back as
Dagster inputs of the same run; these functions convert them to and from storage.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from incremental_assets.delta_log import Snapshot
from incremental_assets.logic.arrivals import NOTHING_ARRIVED, Arrival, Arrivals
from incremental_assets.logic.limits import BatchStats, RunLimits, RunState
from incremental_assets.logic.run_log import ROWS_KEPT, ROWS_READ
from incremental_assets.utc import UTC_TIMESTAMP, aware, naive

LIMITS_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("state", pa.string()), ("lower_limit", UTC_TIMESTAMP),
     ("upper_limit", UTC_TIMESTAMP), ("now", UTC_TIMESTAMP),
     # the source version this run assessed, and the rows that arrived in it since the last one
     ("source_table_id", pa.string()), ("source_version", pa.int64()), ("source_committed_at", UTC_TIMESTAMP),
     ("arrivals", pa.string()), ("behind_from", UTC_TIMESTAMP), ("behind_to", UTC_TIMESTAMP)]
)


@dataclass(frozen=True)
class RunPlan:
    """What new_event_limits decides once per run: the window, and the rows that arrived in the
    source since the version the last run assessed (`source`: the version this one assessed)."""

    limits: RunLimits
    source: Snapshot | None = None
    arrivals: Arrivals = NOTHING_ARRIVED


@dataclass(frozen=True)
class WindowRows:
    """What became of the window's eligible events in the batch: each is kept (one row per event),
    a duplicate copy dropped, or beyond its session's cap (read = kept + duplicates + beyond_cap)."""

    in_sessions: int  # of this run's sessions, within their caps, before the dedupe
    beyond_cap: int
    kept: int

    @property
    def read(self) -> int:
        return self.in_sessions + self.beyond_cap

    @property
    def duplicates(self) -> int:
        return self.in_sessions - self.kept


@dataclass(frozen=True)
class Found:
    """What a batch's events are: how many, the greatest cursor value among them, how many copies
    of them the dedupe dropped, and what became of the window's events (None: not known, for a
    batch counted from its stored rows)."""

    events: int
    batch_max: datetime | None
    duplicates: int | None
    window: WindowRows | None = None


NOTHING_FOUND = Found(0, None, 0, WindowRows(0, 0, 0))


OBSERVED_WAIT_SECONDS = 60  # for a write's observed metrics, before its rows are counted instead


@dataclass(frozen=True)
class RunBatch:
    """This run's events (every event of the sessions it touches) and what they found.

    session_batch hands its events over with their counts observed (`found` holds Observations of
    `transforms.sessions.batch_counts` and `window_counts`): the IO manager's write of the events
    fills them, so the batch is deduplicated once, by that write, not a second time to be counted
    first. Loaded back by the next steps, a batch carries the counts its materialization's metadata
    stored.
    """

    events: DataFrame
    limits: RunLimits
    next_event: datetime | None
    found: Found | Observation | tuple[Observation, ...]
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
        observations = self.found if isinstance(self.found, tuple) else (self.found,)
        found = _observed(observations, wait_seconds) if written else None
        if found is None:
            row = stored().agg(F.count(F.lit(1)).alias("n"), F.max(self.cursor).alias("batch_max")).first()
            found = Found(row["n"], row["batch_max"], None)
        return replace(self, found=found)


def _observed(observations: tuple[Observation, ...], wait_seconds: float) -> Found | None:
    """The observed counts; they reach the driver through Spark's listener bus, just after the write
    returns. Classic Spark's `get` blocks until they do, so each is asked from a thread of its own."""
    metrics: dict = {}

    def read() -> None:
        for observation in observations:
            metrics.update(observation.get)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(wait_seconds)
    if "events" not in metrics:
        return None
    micros = metrics["batch_max_micros"]
    batch_max = None if micros is None else EPOCH + timedelta(microseconds=micros)
    window = None
    if {"window_rows_in_sessions", "window_rows_kept"} <= set(metrics):
        window = WindowRows(*(int(metrics[k] or 0) for k in ("window_rows_in_sessions", "beyond_session_cap", "window_rows_kept")))
    return Found(int(metrics["events"]), batch_max, int(metrics["duplicates"] or 0), window)


EPOCH = datetime(1970, 1, 1)


def materialization_metadata(materialization) -> dict[str, Any]:
    """The plain values of an AssetMaterialization's metadata (what steps of a run read back)."""
    return {key: value.value for key, value in materialization.metadata.items()}


def plan_table(plan: RunPlan, run_id: str) -> pa.Table:
    """The run's row of `new_event_limits`."""
    limits, source, arrivals = plan.limits, plan.source, plan.arrivals
    row = {
        "run_id": run_id, "state": limits.state.value, "lower_limit": aware(limits.lower),
        "upper_limit": aware(limits.upper), "now": aware(limits.now),
        "source_table_id": source and source.table_id, "source_version": source and source.version,
        "source_committed_at": source and aware(source.committed_at),
        "arrivals": json.dumps({arrival.value: n for arrival, n in arrivals.counts.items()}),
        "behind_from": aware(arrivals.behind_from), "behind_to": aware(arrivals.behind_to),
    }
    return pa.Table.from_pylist([row], LIMITS_SCHEMA)


def plan_from_row(row: Mapping[str, Any]) -> RunPlan:
    limits = RunLimits(RunState(row["state"]), *(naive(row[c]) for c in ("lower_limit", "upper_limit", "now")))
    source = None
    if row.get("source_table_id"):
        source = Snapshot(row["source_table_id"], row["source_version"], naive(row["source_committed_at"]))
    counts = {Arrival(k): v for k, v in json.loads(row.get("arrivals") or "{}").items()}
    return RunPlan(limits, source, Arrivals(counts, naive(row.get("behind_from")), naive(row.get("behind_to"))))


def last_assessed(rows: list[Mapping[str, Any]] | None, table_id: str) -> Snapshot | None:
    """The latest version of the source table `table_id` that a run's plan assessed, among the
    rows of `new_event_limits` (None: no run has)."""
    plans = [plan_from_row(row).source for row in rows or []]
    known = [source for source in plans if source is not None and source.table_id == table_id]
    return max(known, key=lambda source: source.version, default=None)


def limits_metadata(limits: RunLimits) -> dict[str, str]:
    return {
        "run_state": limits.state.value,
        "lower_limit": str(limits.lower),
        "upper_limit": str(limits.upper),
        "now": str(limits.now),
    }


def arrivals_metadata(plan: RunPlan) -> dict[str, Any]:
    """What arrived in the source since the last run looked, for people (the UI, the run log)."""
    arrivals = plan.arrivals
    unread = sum(arrivals.skipped().values())
    metadata = {
        "source_version": plan.source.version if plan.source else None, "rows_arrived": arrivals.rows,
        ROWS_READ: arrivals.rows, ROWS_KEPT: arrivals.rows - unread,  # kept: left for a window to read
    }
    metadata.update({f"arrived_{arrival.value}": arrivals[arrival] for arrival in Arrival if arrivals[arrival]})
    if arrivals.behind_from is not None:
        metadata["behind_cursor_range"] = f"{arrivals.behind_from} .. {arrivals.behind_to}"
    return metadata


def batch_metadata(batch: RunBatch) -> dict[str, Any]:
    """A counted batch's stats as materialization metadata: shown in the UI, read back by the next
    steps. What became of the window's events (when known) is its account in the run log."""
    stats, window = batch.stats, batch.found.window
    account = {}
    if window is not None:
        account = {
            ROWS_READ: window.read, ROWS_KEPT: window.kept, "duplicates_dropped": window.duplicates,
            "beyond_session_cap": window.beyond_cap,
        }
    return {
        **limits_metadata(stats.limits),
        "events_found": stats.events_found,
        "batch_max": _text(stats.batch_max),
        "next_event": _text(stats.next_event),
        "caught_up": stats.caught_up,
        "cursor_column": batch.cursor,
        **account,
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
