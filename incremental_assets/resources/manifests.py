"""The manifest resource: owns `incremental_manifest` and the per-run `new_event_limits` record.

Runs read and write through Spark (one Delta transaction per change); previews and sensors read
the same small tables without a JVM (deltalake).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from incremental_assets import delta_tables, previews
from incremental_assets.delta_tables import WriteMode
from incremental_assets.environment import table_uri, warehouse_root
from incremental_assets.logic.days import DayStatus
from incremental_assets.logic.limits import ManifestEntry, RunLimits, RunState
from incremental_assets.utc import aware_row, naive, utcnow


INCREMENTAL_MANIFEST = "incremental_manifest"
NEW_EVENT_LIMITS = "new_event_limits"
DAILY_MANIFEST = "daily_aggregation_manifest"
CONSUMED_KEY = "filtered_events_version"

DAILY_SCHEMA = T.StructType(
    [
        T.StructField("event_date", T.DateType(), False),
        T.StructField("processed_events", T.LongType()),
        T.StructField("pending_late_events", T.LongType()),
        T.StructField("late_events_total", T.LongType()),
        T.StructField("max_load_tstamp", T.TimestampType()),
        T.StructField("max_delay_hours", T.DoubleType()),
        T.StructField("status", T.StringType()),
        T.StructField("last_processed_at", T.TimestampType()),
        T.StructField("last_run_id", T.StringType()),
    ]
)

MANIFEST_SCHEMA = T.StructType(
    [
        T.StructField("model", T.StringType(), False),
        T.StructField("first_success", T.TimestampType()),
        T.StructField("last_success", T.TimestampType()),
        T.StructField("last_upper", T.TimestampType()),
        T.StructField("updated_at", T.TimestampType()),
        T.StructField("last_run_id", T.StringType()),
    ]
)

LIMITS_SCHEMA = T.StructType(
    [
        T.StructField("run_key", T.StringType(), False),
        T.StructField("run_id", T.StringType()),
        T.StructField("state", T.StringType()),
        T.StructField("lower_limit", T.TimestampType()),
        T.StructField("upper_limit", T.TimestampType()),
        T.StructField("now", T.TimestampType()),
        T.StructField("models", T.ArrayType(T.StringType())),
        T.StructField("events_found", T.LongType()),
        T.StructField("batch_max", T.TimestampType()),
        T.StructField("resume_from", T.TimestampType()),
        T.StructField("recorded_at", T.TimestampType()),
    ]
)


@dataclass(frozen=True)
class RunRecord:
    """What a run decided (limits, its incremental assets) and, once known, what it found."""

    run_key: str
    limits: RunLimits
    models: tuple[str, ...]
    events_found: int | None = None
    batch_max: datetime | None = None
    resume_from: datetime | None = None


class ManifestResource(ConfigurableResource):
    warehouse_root: str | None = Field(default=None, description="Default INCREMENTAL_ASSETS_WAREHOUSE")

    def uri(self, table: str) -> str:
        return table_uri(table, self.warehouse_root or warehouse_root())

    # -- incremental manifest ------------------------------------------------------------
    def entries(self) -> dict[str, ManifestEntry]:
        """Read without a JVM: runs, previews and sensors alike (the table is one row per asset)."""
        rows = previews.read_rows(self.uri(INCREMENTAL_MANIFEST)) or []
        return {row["model"]: _entry(row) for row in rows}

    def save(self, spark: SparkSession, entry: ManifestEntry, run_id: str) -> None:
        row = (entry.model, entry.first_success, entry.last_success, entry.last_upper, utcnow(), run_id)
        frame = spark.createDataFrame([aware_row(row)], MANIFEST_SCHEMA)
        delta_tables.write(spark, frame, self.uri(INCREMENTAL_MANIFEST), WriteMode.UPSERT, keys=["model"])

    # -- per-run limits ------------------------------------------------------------------
    def run_record(self, run_key: str) -> RunRecord | None:
        rows = previews.read_rows(self.uri(NEW_EVENT_LIMITS), filters=[("run_key", "=", run_key)]) or []
        return _record(rows[0]) if rows else None

    def record_run(self, spark: SparkSession, record: RunRecord, run_id: str) -> None:
        limits = record.limits
        row = (
            record.run_key, run_id, limits.state.value, limits.lower, limits.upper, limits.now,
            list(record.models), record.events_found, record.batch_max, record.resume_from, utcnow(),
        )
        frame = spark.createDataFrame([aware_row(row)], LIMITS_SCHEMA)
        delta_tables.write(spark, frame, self.uri(NEW_EVENT_LIMITS), WriteMode.UPSERT, keys=["run_key"])


    # -- daily aggregation manifest -------------------------------------------------------
    def days(self) -> dict[date, DayStatus]:
        rows = previews.read_rows(self.uri(DAILY_MANIFEST)) or []
        return {row["event_date"]: _day(row) for row in rows}

    def consumed_version(self) -> int | None:
        """The filtered_events version whose inserts the daily manifest has counted, kept in the
        manifest's own commits so the two can never disagree after a crash."""
        return previews.latest_marker(self.uri(DAILY_MANIFEST), CONSUMED_KEY)

    def save_days(self, spark: SparkSession, days: list[DayStatus], consumed_version: int | None = None) -> None:
        if not days:
            # Nothing to record. Inserts that changed no day (none do: every insert is on a day
            # >= start_date) could be read again next run and would again change nothing.
            return
        rows = [aware_row(tuple(getattr(d, f.name) for f in DAILY_SCHEMA.fields)) for d in days]
        marker = json.dumps({CONSUMED_KEY: consumed_version}) if consumed_version is not None else None
        frame = spark.createDataFrame(rows, DAILY_SCHEMA)
        delta_tables.write(
            spark, frame, self.uri(DAILY_MANIFEST), WriteMode.UPSERT, keys=["event_date"], user_metadata=marker
        )


def _day(row: dict) -> DayStatus:
    values = {f.name: row[f.name] for f in DAILY_SCHEMA.fields}
    values["max_load_tstamp"] = naive(values["max_load_tstamp"])
    values["last_processed_at"] = naive(values["last_processed_at"])
    return DayStatus(**values)


def _entry(row: dict) -> ManifestEntry:
    return ManifestEntry(row["model"], *(naive(row[c]) for c in ("last_success", "last_upper", "first_success")))


def _record(row: dict) -> RunRecord:
    limits = RunLimits(RunState(row["state"]), *(naive(row[c]) for c in ("lower_limit", "upper_limit", "now")))
    return RunRecord(
        row["run_key"], limits, tuple(row["models"] or ()), row["events_found"],
        naive(row["batch_max"]), naive(row["resume_from"]),
    )


