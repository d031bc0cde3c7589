"""A run's batch: every event of the sessions its window touches, deduplicated, and what the batch
found (how many, the greatest cursor value, the next source event after the window, and what
became of the window's events). Stored by the Delta IO manager as the `events_this_run` scratch
table with its counts in a note beside it (BatchHandler), loaded back by the incremental assets of
the run that produced it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from incremental_assets.lib.delta.io_manager import RowsHandler, frame_columns, txn_of, write_metadata
from incremental_assets.lib.delta.log import noted, row_count, stored_table
from incremental_assets.lib.delta.read import read_just_written, read_table
from incremental_assets.lib.delta.spec import Rows
from incremental_assets.lib.delta.write import empty, note
from incremental_assets.lib.incremental.limits import BatchStats, RunLimits, RunState
from incremental_assets.lib.incremental.run_plan import limits_metadata, not_in_this_run
from incremental_assets.lib.metadata import stored_columns
from incremental_assets.lib.state.run_log import ROWS_KEPT, ROWS_READ


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
    first. Loaded back by the next steps, a batch carries the counts noted beside its rows.
    """

    events: DataFrame | None  # None: known to hold no event, so neither written nor read back (no JVM)
    limits: RunLimits
    next_event: datetime | None
    found: Found | Observation | tuple[Observation, ...]
    cursor: str  # the session timestamp column (what batch_max is the greatest of)
    decided_by: str = ""  # the run whose plan this batch is of (its write is keyed by it)
    rows_at_most: int | None = None  # a bound on its events (None: not known): a small batch is written by deltalake

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


def batch_metadata(batch: RunBatch) -> dict[str, Any]:
    """A counted batch's stats, for people (the UI, and the run log's account of the window)."""
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


def batch_note(batch: RunBatch) -> dict[str, Any]:
    """What the next steps of the run need of a counted batch besides its rows: stored beside them."""
    limits, found = batch.limits, batch.found
    return {
        "state": limits.state.value, "lower": str(limits.lower), "upper": str(limits.upper), "now": str(limits.now),
        "events": found.events, "batch_max": _text(found.batch_max), "duplicates": found.duplicates,
        "window": None if found.window is None else [found.window.in_sessions, found.window.beyond_cap, found.window.kept],
        "next_event": _text(batch.next_event), "cursor": batch.cursor, "decided_by": batch.decided_by,
    }


def batch_from_note(events: DataFrame | None, note: Mapping[str, Any]) -> RunBatch:
    limits = RunLimits(RunState(note["state"]), *(_moment(note[k]) for k in ("lower", "upper", "now")))
    window = WindowRows(*note["window"]) if note.get("window") else None
    found = Found(note["events"], _moment(note["batch_max"]), note.get("duplicates"), window)
    return RunBatch(events, limits, _moment(note["next_event"]), found, note["cursor"], note.get("decided_by", ""))


class BatchHandler:
    """The IO manager's handler of a run's batch: its events replace the scratch table (keyed by
    the run that decided the window), then what the write counted is noted beside them. A batch
    known to hold no event empties the table and is loaded back without its rows: a quiet run's
    session layer starts no JVM."""

    stores = loads = (RunBatch,)

    def store(self, context, table, batch: RunBatch, spark) -> dict[str, Any]:
        result = empty(table.uri, txn_of(batch.decided_by)) if batch.known_empty else None  # None: no table yet
        if result is not None:
            columns = stored_columns(stored_table(table.uri))
        elif batch.events is None:
            raise ValueError(f"{table.name}: a batch without its events needs the table it empties")
        else:
            result = RowsHandler().write(table, Rows(batch.events, rows_at_most=batch.rows_at_most, decided_by=batch.decided_by))
            columns = frame_columns(batch.events)
        counted = batch.counted(written=not result.skipped, stored=lambda: read_table(spark(), table.uri))
        note(table.uri, table.run_id, batch_note(counted))
        return {**write_metadata(columns, table.uri, result), "dagster/row_count": row_count(table.uri),
                **batch_metadata(counted)}

    def load(self, context, table, spark) -> RunBatch:
        noted_batch = noted(table.uri, table.run_id)
        if noted_batch is None:
            not_in_this_run(context, table.name)
        # Read as a table just written is read (read._read says why): a small batch by deltalake.
        events = read_just_written(spark(), table.uri) if noted_batch["events"] else None
        return batch_from_note(events, noted_batch)


def _text(moment: datetime | None) -> str:
    return "" if moment is None else str(moment)


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
