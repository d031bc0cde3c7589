"""The manifest resource: the one writer of `incremental_manifest` and `daily_aggregation_manifest`.

Both tables are small (a row per incremental asset, a row per event day), so they are read and
written with deltalake: milliseconds, no JVM, and the same code for runs, previews and sensors.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import date
from typing import Mapping

import pyarrow as pa
from dagster import ConfigurableResource
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError
from pydantic import Field

from incremental_assets import previews
from incremental_assets.environment import table_uri, warehouse_root
from incremental_assets.logic.days import DayStatus, mark_processed
from incremental_assets.logic.limits import Cursor, ManifestEntry
from incremental_assets.utc import UTC_TIMESTAMP, aware, naive, utcnow

INCREMENTAL_MANIFEST = "incremental_manifest"
DAILY_MANIFEST = "daily_aggregation_manifest"
# The daily manifest records, as a Delta transaction identifier committed with its rows, the
# filtered_events version whose inserts it has counted. Identifiers live in checkpoints, so log
# cleanup cannot lose them, and the count and the version can never disagree after a crash.
CONSUMED_APP_ID = "filtered_events"

MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        ("first_success", UTC_TIMESTAMP),
        ("last_success", UTC_TIMESTAMP),
        ("last_upper", UTC_TIMESTAMP),
        ("updated_at", UTC_TIMESTAMP),
        ("last_run_id", pa.string()),
    ]
)
DAILY_SCHEMA = pa.schema(
    [
        pa.field("event_date", pa.date32(), nullable=False),
        ("processed_events", pa.int64()),
        ("pending_late_events", pa.int64()),
        ("late_events_total", pa.int64()),
        ("max_load_tstamp", UTC_TIMESTAMP),
        ("max_delay_hours", pa.float64()),
        ("status", pa.string()),
        ("last_processed_at", UTC_TIMESTAMP),
        ("last_run_id", pa.string()),
    ]
)


class ManifestResource(ConfigurableResource):
    warehouse_root: str | None = Field(default=None, description="Default INCREMENTAL_ASSETS_WAREHOUSE")

    def uri(self, table: str) -> str:
        return table_uri(table, self.warehouse_root or warehouse_root())

    # -- incremental manifest ------------------------------------------------------------
    def entries(self) -> dict[str, ManifestEntry]:
        rows = previews.read_rows(self.uri(INCREMENTAL_MANIFEST)) or []
        return {row["model"]: _entry(row) for row in rows}

    def advance(self, cursor: Cursor, run_id: str) -> ManifestEntry | None:
        """Store the cursor's new position (after its asset's write committed); None: nothing stored."""
        entry = cursor.advanced()
        if entry is not None:
            row = {**{f.name: getattr(entry, f.name) for f in fields(entry)}, "updated_at": utcnow(), "last_run_id": run_id}
            self._upsert(INCREMENTAL_MANIFEST, [row], MANIFEST_SCHEMA, key="model")
        return entry

    # -- daily aggregation manifest -------------------------------------------------------
    def days(self) -> dict[date, DayStatus]:
        rows = previews.read_rows(self.uri(DAILY_MANIFEST)) or []
        return {row["event_date"]: _day(row) for row in rows}

    def consumed_version(self) -> int | None:
        """The filtered_events version whose inserts the daily manifest has counted."""
        try:
            return DeltaTable(self.uri(DAILY_MANIFEST)).transaction_version(CONSUMED_APP_ID)
        except TableNotFoundError:
            return None

    def save_days(self, days: list[DayStatus], consumed_version: int | None = None) -> None:
        """Upsert day rows; with `consumed_version`, in the same commit as that version's identifier."""
        if not days:
            # Nothing to record: inserts that changed no day would change none when read again.
            return
        txn = None if consumed_version is None else Transaction(CONSUMED_APP_ID, consumed_version)
        rows = [{f.name: getattr(day, f.name) for f in fields(day)} for day in days]
        self._upsert(DAILY_MANIFEST, rows, DAILY_SCHEMA, key="event_date", txn=txn)

    def mark_processed(self, days: list[date], events_per_day: Mapping[date, int], run_id: str) -> None:
        """Days recomputed whole from filtered_events: their pending late events are now applied."""
        known = self.days()
        now = utcnow()
        self.save_days(
            [
                mark_processed(known.get(day) or DayStatus(day), events_per_day.get(day, 0), now, run_id)
                for day in days
                if events_per_day.get(day) or day in known
            ]
        )

    def _upsert(self, table: str, rows: list[dict], schema: pa.Schema, key: str, txn: Transaction | None = None) -> None:
        data = pa.Table.from_pylist([{name: aware(value) for name, value in row.items()} for row in rows], schema)
        properties = CommitProperties(app_transactions=[txn]) if txn else None
        uri = self.uri(table)
        try:
            target = DeltaTable(uri)
        except TableNotFoundError:
            write_deltalake(uri, data, mode="error", commit_properties=properties)
            return
        (
            target.merge(
                data, predicate=f"t.{key} = s.{key}", source_alias="s", target_alias="t", commit_properties=properties
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )


def _day(row: dict) -> DayStatus:
    values = {f.name: row[f.name] for f in fields(DayStatus)}
    values["max_load_tstamp"] = naive(values["max_load_tstamp"])
    values["last_processed_at"] = naive(values["last_processed_at"])
    return DayStatus(**values)


def _entry(row: dict) -> ManifestEntry:
    return ManifestEntry(row["model"], *(naive(row[c]) for c in ("last_success", "last_upper", "first_success")))
