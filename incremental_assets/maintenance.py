"""Table maintenance (SPEC §8): compact the small files that hourly merges and appends leave, and
vacuum the files no version within the retention still needs.

Off by default: its daily schedule (schedules.py) is stopped until you start it. A pass holds the run log's
lease (maintenance must not race a run's MERGE) and records each table's files before and after.
Compaction is OPTIMIZE on the partitions that gained files since the table's last OPTIMIZE,
Z-ordered by the columns `maintenance_zorder_by` names for a table (the ones its readers filter by).
Both are deltalake's, in this process: no Spark job, and no Spark session to start.
VACUUM keeps `maintenance_retention_hours` of history, never less than Delta's own default of
seven days, and leaves filtered_events alone while the daily manifest still has to read the change
feed of a version older than that.
"""

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
from dagster import Failure, Nothing, OpExecutionContext, Out, Output, job, op
from deltalake import CommitProperties, DeltaTable

from incremental_assets.delta_tables import data_files, table_exists
from incremental_assets.jobs import WAREHOUSE_WRITER_TAGS
from incremental_assets.logic.run_log import PROCESSED
from incremental_assets.names import FILTERED_EVENTS, NEW_EVENT_LIMITS
from incremental_assets.refresh import derived_tables
from incremental_assets.resources.manifests import RUN_LOG, ManifestResource
from incremental_assets.previews import markdown_table
from incremental_assets.run_log import alive_in, record_failed
from incremental_assets.settings import IncrementalSettings



@dataclass(frozen=True)
class TablePass:
    table: str
    files_before: int
    files_after: int
    compacted_from: str | None  # "all", a partition value, or None (nothing new to compact)
    vacuumed: bool
    note: str = ""


def new_files_since_last_optimize(table: DeltaTable) -> tuple[int, object]:
    """How many files were added since the table's last OPTIMIZE, and the least partition value among
    them (None for an unpartitioned table)."""
    last = next((entry for entry in table.history() if entry.get("operation") == "OPTIMIZE"), None)
    files = data_files(table)
    if last is not None:
        files = files.filter(pc.greater(files["modification_time"], pa.scalar(last["timestamp"], files["modification_time"].type)))
    columns = table.metadata().partition_columns
    if not columns or files.num_rows == 0:
        return files.num_rows, None
    values = [value for value in files.column(f"partition.{columns[0]}").to_pylist() if value is not None]
    return files.num_rows, min(values) if values else None


def oldest_unread_change(manifest: ManifestResource) -> datetime | None:
    """When the oldest filtered_events version the daily manifest has not counted yet was committed."""
    table = DeltaTable(manifest.uri(FILTERED_EVENTS))
    consumed = manifest.consumed_version()
    first_unread = 0 if consumed is None else consumed + 1
    if first_unread > table.version():
        return None
    entry = next(e for e in table.history() if e["version"] == first_unread)
    return datetime.fromtimestamp(entry["timestamp"] / 1000, timezone.utc).replace(tzinfo=None)


def maintain(
    manifest: ManifestResource, table_name: str, retention_hours: float, now: datetime, zorder_by: list[str] = ()
) -> TablePass:
    uri = manifest.uri(table_name)
    table = DeltaTable(uri)
    before = len(table.file_uris())
    new_files, first_partition = new_files_since_last_optimize(table)
    compacted = None
    if new_files:  # compaction leaves a partition holding a single file as it is; Z-ordering rewrites it
        column = table.metadata().partition_columns[:1]
        if column and first_partition is not None:
            compacted = _literal(first_partition)
            partitions = [(column[0], ">=", compacted)]  # a value read from the table's own log
        else:
            compacted, partitions = "all", None
        if zorder_by:  # the columns recorded in the commit, as Spark's OPTIMIZE records them
            columns = CommitProperties(custom_metadata={"zOrderBy": json.dumps(list(zorder_by))})
            table.optimize.z_order(zorder_by, partition_filters=partitions, commit_properties=columns)
        else:
            table.optimize.compact(partition_filters=partitions)
    note, vacuumed = "", True
    if table_name == FILTERED_EVENTS:
        unread = oldest_unread_change(manifest)
        if unread is not None and unread < now - timedelta(hours=retention_hours):
            vacuumed = False
            note = f"not vacuumed: the daily manifest has not read the change feed of {unread} yet"
    if vacuumed:
        # deltalake's VACUUM: Spark's lists files with 10,000 tasks by default (40 s for a tiny table here).
        DeltaTable(uri).vacuum(retention_hours=int(retention_hours), dry_run=False, enforce_retention_duration=True)
    return TablePass(table_name, before, len(DeltaTable(uri).file_uris()), compacted, vacuumed, note)


def _literal(value) -> str:
    return value.isoformat() if isinstance(value, (date, datetime)) else str(value)


def maintained_tables(settings: IncrementalSettings) -> list[str]:
    return [*derived_tables(settings), NEW_EVENT_LIMITS, RUN_LOG]


@op(out=Out(Nothing), description="Compact and vacuum every warehouse table (see incremental_assets/maintenance.py).")
def maintain_tables(context: OpExecutionContext, manifest: ManifestResource, settings: IncrementalSettings) -> Output:
    retention = settings.maintenance_retention_hours
    known = maintained_tables(settings)
    unknown = sorted(set(settings.maintenance_zorder_by) - set(known))
    if unknown:
        raise Failure(f"maintenance_zorder_by names {unknown}, which are not warehouse tables; known: {known}")
    tables = [name for name in known if table_exists(manifest.uri(name))]
    run_id = context.run_id
    manifest.acquire(run_id, tables, None, alive_in(context.instance))
    passes = []
    for name in tables:  # a failure closes what is still open: the job's failure hook
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        result = maintain(manifest, name, retention, now, settings.maintenance_zorder_by.get(name, []))
        passes.append(result)
        manifest.record(run_id, name, PROCESSED, {}, message=f"files {result.files_before} -> {result.files_after} {result.note}".strip())
    columns = ["table", "files before", "files after", "compacted from", "vacuumed", "note"]
    rows = [[p.table, p.files_before, p.files_after, p.compacted_from, p.vacuumed, p.note] for p in passes]
    return Output(None, metadata={
        "tables": markdown_table(columns, rows),
        "files_before": sum(p.files_before for p in passes),
        "files_after": sum(p.files_after for p in passes),
        "retention_hours": retention,
    })


@job(tags=WAREHOUSE_WRITER_TAGS, hooks={record_failed}, description="Compact small files and vacuum old ones in every warehouse table.")
def maintenance_job():
    maintain_tables()
