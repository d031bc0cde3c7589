"""Table maintenance: compact the small files that hourly merges and appends leave, and
vacuum the files no version within the retention still needs.

Off by default: its daily schedule (defs/operations.py) is stopped until you start it. A pass holds the run log's
lease (maintenance must not race a run's MERGE) and records each table's files before and after.
Compaction is OPTIMIZE on the partitions that gained files since the table's last OPTIMIZE,
Z-ordered by the columns `maintenance_zorder_by` names for a table (the ones its readers filter by).
Both are deltalake's, in this process: no Spark job, and no Spark session to start.
VACUUM keeps `maintenance_retention_hours` of history, never less than Delta's own default of
seven days, and leaves filtered_events alone while the daily manifest still has to read the change
feed of a commit older than that. A table an earlier release made gets the log checkpoints every
table is now made with.
"""

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from incremental_assets.lib.catalog import FILTERED_EVENTS
from incremental_assets.lib.delta.log import data_files, first_data_change
from incremental_assets.lib.delta.write import compact, keep_log_checkpoints, vacuum
from incremental_assets.lib.state.store import StateStore


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


@dataclass(frozen=True)
class UnreadChange:
    """The oldest filtered_events commit that changed data and that the daily manifest has not
    counted yet: its change feed needs the files that commit wrote."""

    version: int
    committed: datetime | None  # None: gone from the log (older than its retention, and than any vacuum's)

    def older_than(self, moment: datetime) -> bool:
        return self.committed is None or self.committed < moment

    def __str__(self) -> str:
        return f"commit {self.version} ({'gone from the log' if self.committed is None else self.committed})"


def oldest_unread_change(state: StateStore) -> UnreadChange | None:
    """None when the daily manifest has counted every commit that changed data: a compaction or a
    property change leaves no change feed to read."""
    uri = state.uri(FILTERED_EVENTS)
    table = DeltaTable(uri)
    consumed = state.consumed_version()
    first_unread = 0 if consumed is None else consumed + 1
    unread = first_data_change(uri, first_unread, table.version())
    if unread is None:
        return None
    entry = next((e for e in table.history(table.version() - unread + 1) if e["version"] == unread), None)  # back to it, not the whole log
    committed = None if entry is None else datetime.fromtimestamp(entry["timestamp"] / 1000, timezone.utc).replace(tzinfo=None)
    return UnreadChange(unread, committed)


def maintain(
    state: StateStore, table_name: str, retention_hours: float, now: datetime, zorder_by: list[str] = ()
) -> TablePass:
    uri = state.uri(table_name)
    table = DeltaTable(uri)
    before = len(table.file_uris())
    notes = ["log checkpointed every ten commits from now"] if keep_log_checkpoints(table) else []
    new_files, first_partition = new_files_since_last_optimize(table)
    compacted = None
    if new_files:  # compaction leaves a partition holding a single file as it is; Z-ordering rewrites it
        column = table.metadata().partition_columns[:1]
        if column and first_partition is not None:
            compacted = _literal(first_partition)
            partitions = [(column[0], ">=", compacted)]  # a value read from the table's own log
        else:
            compacted, partitions = "all", None
        compact(table, partitions, zorder_by)
    vacuumed = True
    if table_name == FILTERED_EVENTS:
        unread = oldest_unread_change(state)
        if unread is not None and unread.older_than(now - timedelta(hours=retention_hours)):
            vacuumed = False
            notes.append(f"not vacuumed: the daily manifest has not read the change feed of {unread} yet")
    if vacuumed:
        vacuum(uri, retention_hours, now)
    if table_name == FILTERED_EVENTS:  # this pass's commits changed no data: no run need read them
        state.read_past_unchanged()
    return TablePass(table_name, before, len(DeltaTable(uri).file_uris()), compacted, vacuumed, "; ".join(notes))


def _literal(value) -> str:
    return value.isoformat() if isinstance(value, (date, datetime)) else str(value)
