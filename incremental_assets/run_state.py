"""What a run hands down its graph: its limits, and its batch of events with what the batch found.

Both are stored by the Delta IO manager (the limits as one row per run in `new_event_limits`,
the batch as the `events_this_run` scratch table plus its materialization metadata) and loaded
back as Dagster inputs of the same run; these functions convert them to and from storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame

from incremental_assets.logic.limits import BatchStats, RunLimits, RunState
from incremental_assets.utc import UTC_TIMESTAMP, aware, naive

LIMITS_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("state", pa.string()), ("lower_limit", UTC_TIMESTAMP),
     ("upper_limit", UTC_TIMESTAMP), ("now", UTC_TIMESTAMP)]
)


@dataclass(frozen=True)
class RunBatch:
    """This run's events (every event of the sessions it touches) and what they are."""

    events: DataFrame
    stats: BatchStats

    @property
    def limits(self) -> RunLimits:
        return self.stats.limits


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


def batch_metadata(stats: BatchStats) -> dict[str, Any]:
    """The batch's stats as materialization metadata: shown in the UI, and read back by the next steps."""
    return {
        **limits_metadata(stats.limits),
        "events_found": stats.events_found,
        "batch_max": _text(stats.batch_max),
        "next_event": _text(stats.next_event),
        "caught_up": stats.caught_up,
    }


def stats_from_metadata(metadata: Mapping[str, Any]) -> BatchStats:
    limits = RunLimits(
        RunState(metadata["run_state"]), *(_moment(metadata[k]) for k in ("lower_limit", "upper_limit", "now"))
    )
    return BatchStats(limits, int(metadata["events_found"]), _moment(metadata["batch_max"]), _moment(metadata["next_event"]))


def _text(moment: datetime | None) -> str:
    return "" if moment is None else str(moment)


def _moment(text: str) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
