"""The state store: the one writer of `incremental_manifest`, `daily_aggregation_manifest`,
`run_log` (and its lease) and `table_fingerprints`.

The tables are small (a row per incremental asset, per event day, per asset of a run, per table),
so they are read and written with deltalake: milliseconds, no JVM, and the same code for runs,
previews, sensors and the command line. It stores records (lib/state/records.py); the rules that
compute them are the callers' (lib/incremental).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import fields, replace
from datetime import date, datetime, timedelta
from typing import Any, Callable, Mapping

import pyarrow as pa
from dagster import ConfigurableResource, InitResourceContext
from dagster._core.errors import DagsterInvalidPropertyError
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from pydantic import Field

from incremental_assets.lib.catalog import (
    DAILY_MANIFEST, ERASURE_LOG, FILTERED_EVENTS, FINGERPRINTS, INCREMENTAL_MANIFEST, PROCESS_TAG, RUN_LOG,
)
from incremental_assets.lib.delta.conditional import ensure_conditional_writes
from incremental_assets.lib.delta.log import data_files, first_data_change, read_rows, rows_deleted_by, stored_table, table_version
from incremental_assets.lib.delta.spec import LOG_CHECKPOINTS
from incremental_assets.lib.environment import table_uri, warehouse_root
from incremental_assets.lib.state.fingerprints import Fingerprint, Stored
from incremental_assets.lib.state.records import TO_PROCESS, DayStatus, ManifestEntry
from incremental_assets.lib.state.run_log import (
    FAILED,
    PROCESSED,
    PROCESSING,
    RESOLVED,
    ROWS_KEPT,
    ROWS_READ,
    Record,
    lease_holder,
    open_leases,
    skip_reasons,
)
from incremental_assets.lib.utc import UTC_TIMESTAMP, aware, naive, utcnow

LEASE_DAYS = 7  # a lease is looked for among this many days of records: no run lives longer
COMPACT_FILES = 100  # run_log files in its recent days beyond which a run's lease compacts them
LEASE_ATTEMPTS = 5  # reads and tries to take the lease, while other writers append meanwhile
# The run-log rows this process appended, per (table, run): what a run's assets show in their
# metadata without reading the table back (runs execute in one process: the in-process executor).
_APPENDED: dict[tuple[str, str], list[dict]] = {}
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
FINGERPRINT_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        ("digest", pa.string()),
        ("fingerprint", pa.string()),  # JSON: logic.fingerprints.Fingerprint
        ("since", UTC_TIMESTAMP),
        ("effective_from", pa.date32()),  # a forward-only change: the day it applies from
        ("run_id", pa.string()),
    ]
)
# One row per erasure request (lib/upkeep/erasure.py): no key in clear, only salted hashes.
ERASURE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        ("requested_at", UTC_TIMESTAMP),
        ("requested_by", pa.string()),  # the OS user, or the Dagster run's user
        ("identifier", pa.string()),  # the column the request named keys by
        ("key_hashes", pa.list_(pa.string())),  # the request's keys
        ("user_hashes", pa.list_(pa.string())),  # the user identifiers they resolved to
        ("attribute_key_hashes", pa.list_(pa.string())),  # ... and the attribute keys
        ("status", pa.string()),  # Processing, then Processed
        ("rows", pa.string()),  # JSON {table: rows erased}
        ("completed_at", UTC_TIMESTAMP),
        ("physically_gone_at", UTC_TIMESTAMP),  # when no file readable through time travel holds them
    ]
)
RUN_LOG_SCHEMA = pa.schema(
    [
        ("day", pa.date32()),  # of recorded_at: the partition, so lease checks read recent days only
        ("recorded_at", UTC_TIMESTAMP),
        ("run_id", pa.string()),
        ("asset", pa.string()),
        ("partition", pa.string()),  # a partitioned asset's records: one per partition, with its own rows
        ("status", pa.string()),
        ("lower_limit", UTC_TIMESTAMP),
        ("upper_limit", UTC_TIMESTAMP),
        ("rows", pa.int64()),  # stored: inserted and updated (a replace: the rows it holds)
        ("rows_read", pa.int64()),  # what the step read, when it accounts for every row ...
        ("rows_kept", pa.int64()),  # ... and carried forward: rows_read = rows_kept + the skipped counts
        ("skipped", pa.string()),  # JSON {reason: count}
        ("pid", pa.int64()),
        ("host", pa.string()),
        ("message", pa.string()),
    ]
)


def run_of(context) -> str | None:
    """The id of the run a step runs in; None for an asset called directly (a test): its IO manager
    stores nothing of what it returns, so it writes no state either."""
    try:
        return context.run.run_id
    except DagsterInvalidPropertyError:
        return None


class LeaseHeld(RuntimeError):
    """Another run holds the run log's lease: this one must not write."""


class StateStore(ConfigurableResource):
    warehouse_root: str | None = Field(default=None, description="Default INCREMENTAL_ASSETS_WAREHOUSE")

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """The run names its process in the instance, as its lease records do in the run log."""
        if context.instance is not None and context.run is not None:
            context.instance.add_run_tags(context.run.run_id, {PROCESS_TAG: f"{socket.gethostname()}:{os.getpid()}"})

    def uri(self, table: str) -> str:
        return table_uri(table, self.warehouse_root or warehouse_root())

    # -- incremental manifest ------------------------------------------------------------
    def entries(self) -> dict[str, ManifestEntry]:
        rows = read_rows(self.uri(INCREMENTAL_MANIFEST)) or []
        return {row["model"]: _entry(row) for row in rows}

    def save_entry(self, entry: ManifestEntry, run_id: str) -> None:
        """Store an incremental asset's new position (after its write committed)."""
        row = {**{f.name: getattr(entry, f.name) for f in fields(entry)}, "updated_at": utcnow(), "last_run_id": run_id}
        self._upsert(INCREMENTAL_MANIFEST, [row], MANIFEST_SCHEMA, key="model")

    def forget(self, models: list[str]) -> None:
        """Delete the manifest rows of `models`: their next run backfills them from start_date (state 2).
        The manifest holds a row per asset: it is rewritten without theirs, in one commit."""
        rows = read_rows(self.uri(INCREMENTAL_MANIFEST)) or []
        kept = [row for row in rows if row["model"] not in models]
        if len(kept) < len(rows):
            write_deltalake(self.uri(INCREMENTAL_MANIFEST), pa.Table.from_pylist(kept, MANIFEST_SCHEMA), mode="overwrite")

    # -- table fingerprints -----------------------------------------------------------------------
    def fingerprints(self) -> dict[str, Stored]:
        rows = read_rows(self.uri(FINGERPRINTS)) or []
        return {row["table"]: Stored(Fingerprint.from_json(row["fingerprint"]), naive(row["since"]), row["effective_from"])
                for row in rows}

    def record_fingerprints(
        self, fingerprints: Mapping[str, Fingerprint], run_id: str, effective_from: date | None = None
    ) -> None:
        """Record what these tables are now built under (after the writes that made them so)."""
        now = utcnow()
        rows = [{"table": table, "digest": f.digest, "fingerprint": f.as_json(), "since": now,
                 "effective_from": effective_from, "run_id": run_id} for table, f in fingerprints.items()]
        if rows:
            self._upsert(FINGERPRINTS, rows, FINGERPRINT_SCHEMA, key="table")

    def reset(self) -> dict[str, int]:
        """A full refresh: both manifests and the fingerprints emptied (every table is rebuilt under
        the settings it then has); the rows deleted, per table. The daily manifest's record of the
        filtered_events version it has counted stays: the rebuild's inserts come after it."""
        deleted = {}
        for table in (INCREMENTAL_MANIFEST, DAILY_MANIFEST, FINGERPRINTS):
            stored = stored_table(self.uri(table))
            if stored is not None:
                deleted[table] = int(stored.delete().get("num_deleted_rows", 0))
        return deleted

    # -- daily aggregation manifest -------------------------------------------------------
    def days(self) -> dict[date, DayStatus]:
        rows = read_rows(self.uri(DAILY_MANIFEST)) or []
        return {row["event_date"]: _day(row) for row in rows}

    def consumed_version(self) -> int | None:
        """The filtered_events version whose inserts the daily manifest has counted."""
        table = stored_table(self.uri(DAILY_MANIFEST))
        return None if table is None else table.transaction_version(CONSUMED_APP_ID)

    def save_days(self, days: list[DayStatus], consumed_version: int | None = None, once_as: str | None = None) -> None:
        """Upsert day rows; with `consumed_version`, in the same commit as that version's identifier;
        with `once_as`, under that identifier, which `applied_once` then finds. No day: the version
        alone is recorded (`counted_through`); an adjustment of no day commits nothing (computed
        again, it is of the days as they are then)."""
        if not days:
            if consumed_version is not None:
                self.counted_through(consumed_version)
            return
        if once_as is not None:
            txn = Transaction(once_as, 1)
        else:
            txn = None if consumed_version is None else Transaction(CONSUMED_APP_ID, consumed_version)
        rows = [{f.name: getattr(day, f.name) for f in fields(day)} for day in days]
        self._upsert(DAILY_MANIFEST, rows, DAILY_SCHEMA, key="event_date", txn=txn)

    def read_past_unchanged(self) -> int | None:
        """The filtered_events version the daily manifest has counted, first moved on to the current
        one when no commit after it changed data (a compaction, a vacuum, a property change): the
        change feed's next read then starts after them and needs none of their commits, which
        Delta's log cleanup removes once delta.logRetentionDuration has passed."""
        uri = self.uri(FILTERED_EVENTS)
        consumed, version = self.consumed_version(), table_version(uri)
        if consumed is not None and version is not None and consumed < version and first_data_change(uri, consumed + 1, version) is None:
            self.counted_through(version)
            return version
        return consumed

    def counted_through(self, version: int) -> None:
        """Record that the daily manifest has counted filtered_events' inserts up to `version`, when
        the commits after the last one it counted changed no day (a compaction, an erasure's
        deletes): a commit of no row, so that no later read of the change feed reads them again
        or needs their files (`purge`)."""
        write_deltalake(self.uri(DAILY_MANIFEST), DAILY_SCHEMA.empty_table(), mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(CONSUMED_APP_ID, version)]))

    def applied_once(self, once_as: str) -> bool:
        """Whether days were saved `once_as` this identifier (a request's one-time adjustment)."""
        table = stored_table(self.uri(DAILY_MANIFEST))
        return table is not None and table.transaction_version(once_as) is not None

    def reset_days(self) -> None:
        """Forget every day (filtered_events is rebuilt: its days come back as new arrivals). The
        filtered_events version the manifest has counted stays: the rebuild's inserts come after it."""
        table = stored_table(self.uri(DAILY_MANIFEST))
        if table is not None:
            table.delete()

    def drop_days(self, days: list[date]) -> None:
        """Delete the rows of days no event counts any more (an erasure took their only events)."""
        table = stored_table(self.uri(DAILY_MANIFEST))
        if table is None or not days:
            return
        gone = pa.table({"event_date": pa.array(sorted(days), pa.date32())})
        table.merge(gone, predicate="t.event_date = s.event_date", source_alias="s", target_alias="t").when_matched_delete().execute()

    def mark_to_process(self, days: list[date], run_id: str) -> None:
        """Mark days to be recomputed whole (the daily sensor, or `run`, requests them)."""
        known = self.days()
        self.save_days([replace(known[day], status=TO_PROCESS, last_run_id=run_id) for day in days if day in known])

    # -- erasure log -------------------------------------------------------------------------
    def erasure_request(self, request_id: str) -> dict | None:
        rows = read_rows(self.uri(ERASURE_LOG), filters=[("request_id", "=", request_id)]) or []
        return rows[0] if rows else None

    def erasure_log(self) -> list[dict]:
        return sorted(read_rows(self.uri(ERASURE_LOG)) or [], key=lambda row: row["requested_at"])

    def open_erasure(self, request_id: str, identifier: str, keys: list[str], users: list[str], attribute_keys: list[str],
                     requested_by: str) -> dict:
        """Record a request before anything is erased: what it resolved to, as hashes."""
        row = {"request_id": request_id, "requested_at": utcnow(), "requested_by": requested_by, "identifier": identifier,
               "key_hashes": keys, "user_hashes": users, "attribute_key_hashes": attribute_keys, "status": PROCESSING,
               "rows": None, "completed_at": None, "physically_gone_at": None}
        self._upsert(ERASURE_LOG, [row], ERASURE_SCHEMA, key="request_id")
        return row

    def close_erasure(self, request_id: str, tables: Mapping[str, str]) -> dict:
        """The request done: the rows its commits deleted, per table (name: URI), from the commits'
        own metrics, so an attempt killed between a commit and its run-log record is counted too."""
        request = self.erasure_request(request_id)
        erased = json.dumps(dict(sorted((table, rows_deleted_by(uri, request_id, request["requested_at"])) for table, uri in tables.items())))
        # Rows erased since it was recorded gone (the same request with --source): gone once their files are
        gone = request["physically_gone_at"] if erased == request["rows"] else None
        row = {**request, "status": PROCESSED, "rows": erased, "completed_at": utcnow(), "physically_gone_at": gone}
        self._upsert(ERASURE_LOG, [row], ERASURE_SCHEMA, key="request_id")
        return row

    def erasures_gone(self, request_ids: list[str]) -> None:
        """Record that no file readable through time travel holds these requests' rows any more."""
        now = utcnow()
        rows = [{**request, "physically_gone_at": now} for request in self.erasure_log() if request["request_id"] in request_ids]
        if rows:
            self._upsert(ERASURE_LOG, rows, ERASURE_SCHEMA, key="request_id")

    # -- run log ------------------------------------------------------------------------------
    def run_log(self, run_id: str | None = None, since: date | None = None) -> list[dict]:
        filters = [("day", ">=", since)] if since else []
        if run_id:
            filters.append(("run_id", "=", run_id))
        rows = read_rows(self.uri(RUN_LOG), filters=filters or None) or []
        return sorted(rows, key=lambda row: row["recorded_at"])

    def acquire(
        self, run_id: str, assets: list[str], window: tuple[datetime, datetime] | None, alive: Callable[[Record], bool],
        adopt: Mapping[str, Fingerprint] | None = None,
    ) -> None:
        """Record Processing for every asset the run writes: the lease. Tables without a fingerprint
        yet (`adopt`: new, or built by an earlier release) are recorded under the current settings
        once it is held.

        The records commit only if the run log has not changed since this run read it (a Delta MERGE,
        which conflicts with any append made meanwhile), so of two runs taking it at the same moment
        one commits and the other reads again and finds it held. Leases of runs that are gone are
        closed as Failed first; if another live run holds the lease, LeaseHeld names the holder and
        this run writes nothing (a refused run leaves no trace but its own failure)."""
        ensure_conditional_writes(self.warehouse_root or warehouse_root())  # what makes the commit below exclusive
        since = utcnow().date() - timedelta(days=LEASE_DAYS)
        for _ in range(LEASE_ATTEMPTS):
            log = self._run_log_snapshot()
            recent = read_rows(self.uri(RUN_LOG), filters=[("day", ">=", since)], table=log)
            if len(recent) > COMPACT_FILES and self._recent_files(since) > COMPACT_FILES:
                # A file per append would make every lease check list thousands of files (deltalake: no JVM).
                log.optimize.compact(partition_filters=[("day", ">=", since.isoformat())])
                continue
            leases = open_leases(run_log_record(row) for row in recent)
            others = {run: records for run, records in leases.items() if run != run_id}
            gone = [record for records in others.values() for record in records if not alive(record)]
            if gone:
                self._log([self._row(r.run_id, r.asset, FAILED, None, message=f"recovered by run {run_id}: the run is gone") for r in gone])
                continue
            if others:
                holder = lease_holder(others)
                raise LeaseHeld(
                    f"refused: lease held by {holder}. Run {holder} is still writing this warehouse (its Processing "
                    f"records in {self.uri(RUN_LOG)} have no Processed or Failed yet). Wait for it; if it is dead on "
                    f"another machine, stop it there, then `incremental-assets resolve {holder}`."
                )
            processing = [self._row(run_id, asset, PROCESSING, window, pid=os.getpid(), host=socket.gethostname()) for asset in assets]
            if self._log(processing, unchanged_since=(log, since)):
                self.record_fingerprints(adopt or {}, run_id)
                return
        raise LeaseHeld(f"Could not take the run log's lease in {LEASE_ATTEMPTS} tries: other writers kept appending to {self.uri(RUN_LOG)}")

    def holds_lease(self, run_id: str) -> bool:
        """Whether the run has taken the lease already (an earlier step of it, in this process or,
        under a multi-process executor, another)."""
        if any(row["status"] == PROCESSING for row in self.appended_here(run_id)):
            return True
        # the days `acquire` reads next, when the run has not taken it: one read of them, not two
        since = utcnow().date() - timedelta(days=LEASE_DAYS)
        recent = read_rows(self.uri(RUN_LOG), filters=[("day", ">=", since)]) or []
        return any(row["run_id"] == run_id and row["status"] == PROCESSING for row in recent)

    def record(
        self, run_id: str, asset: str, status: str, metadata: Mapping[str, Any], message: str | None = None,
        partition: str | None = None,
    ) -> None:
        """Close an asset's Processing record with its outcome, its row counts and skip reasons; a
        partition's record carries the rows of that partition alone."""
        if partition is not None:
            rows = metadata.get("dagster/row_count")
        else:
            rows = (metadata.get("rows_inserted") or 0) + (metadata.get("rows_updated") or 0) or metadata.get("dagster/row_count")
        self._log([self._row(run_id, asset, status, None, rows=rows, skipped=skip_reasons(metadata), message=message,
                             partition=partition, rows_read=metadata.get(ROWS_READ), rows_kept=metadata.get(ROWS_KEPT))])

    def close_open(self, run_id: str, message: str) -> None:
        """Close whatever the run left open as Failed (a run that ended before its assets did)."""
        leases = open_leases(run_log_record(row) for row in self.run_log(run_id=run_id))
        self._log([self._row(run_id, r.asset, FAILED, None, message=message) for r in leases.get(run_id, [])])

    def resolve(self, run_id: str) -> int:
        """Mark a run's Failed records Resolved (an operator has looked at them); how many."""
        records = self.run_log(run_id=run_id)
        todo = sorted({r["asset"] for r in records if r["status"] == FAILED} - {r["asset"] for r in records if r["status"] == RESOLVED})
        self._log([self._row(run_id, asset, RESOLVED, None, message="resolved by an operator") for asset in todo])
        return len(todo)

    def _row(self, run_id: str, asset: str, status: str, window: tuple[datetime, datetime] | None, rows: int | None = None,
             skipped: Mapping[str, int] | None = None, pid: int | None = None, host: str | None = None,
             message: str | None = None, partition: str | None = None, rows_read: int | None = None,
             rows_kept: int | None = None) -> dict:
        now = utcnow()
        return {
            "day": now.date(), "recorded_at": now, "run_id": run_id, "asset": asset, "partition": partition,
            "status": status, "lower_limit": window[0] if window else None,
            "upper_limit": window[1] if window else None, "rows": rows, "rows_read": rows_read, "rows_kept": rows_kept,
            "skipped": json.dumps(dict(skipped)) if skipped else None, "pid": pid, "host": host, "message": message,
        }

    def _recent_files(self, since: date) -> int:
        files = data_files(DeltaTable(self.uri(RUN_LOG)))
        return sum(1 for day in files.column("partition.day").to_pylist() if day >= since)

    def appended_here(self, run_id: str) -> list[dict]:
        """The run's records this process appended, oldest first (no read)."""
        return list(_APPENDED.get((self.uri(RUN_LOG), run_id), []))

    def _run_log_snapshot(self) -> DeltaTable:
        """The run log as it is now, created (empty) if it does not exist yet."""
        table = stored_table(self.uri(RUN_LOG))
        if table is None:
            write_deltalake(self.uri(RUN_LOG), RUN_LOG_SCHEMA.empty_table(), mode="append", partition_by=["day"],
                            configuration=LOG_CHECKPOINTS)
            table = DeltaTable(self.uri(RUN_LOG))
        return table

    def _log(self, rows: list[dict], unchanged_since: tuple[DeltaTable, date] | None = None) -> bool:
        """Append `rows`; with `unchanged_since` (a snapshot, and the first day it was read from), only
        if nothing was appended to those days since that snapshot. Whether the rows were committed."""
        if not rows:
            return True
        data = pa.Table.from_pylist([{name: aware(value) for name, value in row.items()} for row in rows], RUN_LOG_SCHEMA)
        uri = self.uri(RUN_LOG)
        if unchanged_since is None:  # "merge": a run log of an earlier release gains the new columns
            write_deltalake(uri, data, mode="append", partition_by=["day"], schema_mode="merge", configuration=LOG_CHECKPOINTS)
        else:
            snapshot, since = unchanged_since
            same_row = " AND ".join(f"t.{c} = s.{c}" for c in ("run_id", "asset", "status", "recorded_at"))
            try:  # an insert that read the recent days: Delta refuses it if another writer appended there
                snapshot.merge(data, f"t.day >= '{since.isoformat()}' AND {same_row}", source_alias="s", target_alias="t",
                               merge_schema=True).when_not_matched_insert_all().execute()
            except CommitFailedError:
                return False
        for row in rows:
            _APPENDED.setdefault((uri, row["run_id"]), []).append(row)
        return True

    def _upsert(self, table: str, rows: list[dict], schema: pa.Schema, key: str, txn: Transaction | None = None) -> None:
        data = pa.Table.from_pylist([{name: aware(value) for name, value in row.items()} for row in rows], schema)
        properties = CommitProperties(app_transactions=[txn]) if txn else None
        uri = self.uri(table)
        target = stored_table(uri)
        if target is None:
            write_deltalake(uri, data, mode="error", configuration=LOG_CHECKPOINTS, commit_properties=properties)
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


def run_log_record(row: dict) -> Record:
    return Record(row["run_id"], row["asset"], row["status"], row["recorded_at"], row["pid"], row["host"])


def _entry(row: dict) -> ManifestEntry:
    return ManifestEntry(row["model"], *(naive(row[c]) for c in ("last_success", "last_upper", "first_success")))
