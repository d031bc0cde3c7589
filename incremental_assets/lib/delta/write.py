"""Delta Lake writes and reads shared by the IO manager, the manifests and the assets.

Every write is a single Delta transaction, and every mode is idempotent when repeated with the
same input (append excepted, by definition), which is what makes a crashed run safe to re-run.
Appends and MERGEs add the columns the data gains (a source that gains a column between loads
passes it on to filtered_events; earlier rows hold null there).

Spark reads and writes through the DataFrame API only (no `delta.tables` client), so the same code
runs over Spark Connect against a server that has Delta's jars but not Delta's Connect plugin. The
table's log is read by deltalake, in the calling process: it must reach the warehouse's storage too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from functools import reduce
from typing import Any, Iterable, Mapping, Sequence

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.delta.arrow import collect, held, no_rows, nullable, whole_offsets
from incremental_assets.lib.delta.log import (
    NOTE_PROPERTY, data_files, filesystem_of, rows_deleted_by, stored_schema, stored_table, table_exists,
)
from incremental_assets.lib.delta.read import count_by, partition_kind
from incremental_assets.lib.delta.spec import DELETED, LOG_CHECKPOINTS, DeltaWriteError, Window, WriteMode
from incremental_assets.lib.environment import small_writes_by_deltalake

# A MERGE takes its transaction identifier from the session, not from writer options.
TXN_CONF = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")
# ...and its schema evolution too: DataFrame.mergeInto's own flag is not read by Delta 4.0.
SCHEMA_EVOLUTION_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
# ...and its commit's userMetadata.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
# Up to this many rows, a MERGE into an existing table is collected and done by deltalake: an hourly
# run's few changed sessions merge in milliseconds, where Spark's MERGE costs several jobs and seconds.
SMALL_MERGE_ROWS = 20_000


# The operation of a write that committed nothing: the table is at the version it was.
NO_COMMIT = "none: no row to write"


@dataclass(frozen=True)
class Txn:
    """A Delta transaction identifier. Delta skips a write whose identifier the table already
    holds, and keeps identifiers in checkpoints, so they outlive log cleanup."""

    app_id: str
    version: int = 0


@dataclass
class WriteResult:
    version: int
    operation: str
    metrics: dict[str, int] = field(default_factory=dict)
    skipped: bool = False

    @property
    def rows_inserted(self) -> int:
        return self.metrics.get("numTargetRowsInserted", self.metrics.get("numOutputRows", 0))

    @property
    def rows_updated(self) -> int:
        return self.metrics.get("numTargetRowsUpdated", 0)

    @property
    def rows_deleted(self) -> int:
        return self.metrics.get("numTargetRowsDeleted", self.metrics.get("numDeletedRows", 0))


@dataclass(frozen=True)
class WriteRequest:
    """One write of rows into the Delta table at `uri`, as `mode` says.

    `merge_floor` (column, value) prunes a merge's target scan to rows with column >= value (and
    those without a value: a floor prunes by date, and an undated row may match any run);
    `txn` makes a repeated write (a re-run step) a no-op; `rows_at_most` (the caller's bound on the
    rows) lets a small MERGE into an existing table run in deltalake (see `_merge_small`);
    `one_row_per_key` (the rows are unique on `keys` by construction, as a dedupe or a group-by on
    them makes them) spares a big MERGE the shuffle that checks it; `properties` are the table
    properties of a table this write creates; `user_metadata` annotates the commit. A replace by
    rows known to be none is `empty`'s.
    """

    uri: str
    mode: WriteMode
    keys: Sequence[str] = ()
    partition_by: Sequence[str] = ()
    window: Window | None = None
    merge_floor: tuple[str, date] | None = None
    txn: Txn | None = None
    rows_at_most: int | None = None
    one_row_per_key: bool = False
    properties: Mapping[str, str] | None = None
    user_metadata: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))


def write(spark: SparkSession, df: DataFrame, request: WriteRequest) -> WriteResult:
    """Write `df` as `request` says, in one Delta transaction."""
    uri, mode, keys, partition_by, window = request.uri, request.mode, request.keys, request.partition_by, request.window
    merge_floor, txn = request.merge_floor, request.txn
    rows_at_most = request.rows_at_most if small_writes_by_deltalake() else None  # None: Spark writes it
    one_row_per_key, properties, user_metadata = request.one_row_per_key, request.properties, request.user_metadata

    changes = [DELETED] if mode is WriteMode.APPLY_CHANGES else []
    _require_columns(df, [*keys, *partition_by, *([window.column] if window else []), *changes], uri)
    stored = stored_table(uri)  # its log read once: every choice below is made on this version

    def save(mode: str, **options) -> WriteResult:  # of `df` as it is when called
        result = _save(df, uri, mode, partition_by, user_metadata=user_metadata, txn=txn, properties=properties, **options)
        if stored is None or result.version != stored.version():
            return result
        return _nothing_appended(uri, result.version, user_metadata)

    if txn is not None and committed(stored, txn):
        return _already_committed(stored)
    # A table that holds no row (emptied by a refresh or a plan) takes the schema of what is written
    # into it, whatever columns it had: a rebuild always has the current definitions' columns.
    emptied = stored is not None and not data_files(stored).num_rows

    def in_hand() -> pa.Table:  # `df`'s rows, for deltalake
        return _typed_for(None if emptied else stored, collect(df))

    if mode in (WriteMode.MERGE_INSERT, WriteMode.UPSERT):
        if not keys:
            raise DeltaWriteError(f"{mode.value} into {uri} needs key columns")
        if merge_floor is not None and stored is not None and merge_floor[0] not in stored.metadata().partition_columns:
            # Created before its asset was partitioned by the floor's column: its rows may hold no
            # value there, and a floor would match none of them. The MERGE reads the whole table.
            merge_floor = None
        if rows_at_most is not None and rows_at_most <= SMALL_MERGE_ROWS and stored is not None and not emptied:
            return _merge_small(in_hand(), stored, uri, keys, mode is WriteMode.UPSERT, merge_floor, txn)
        duplicate = None if one_row_per_key else _duplicate_key(df, keys)
        if duplicate is not None:
            if mode is WriteMode.UPSERT:
                raise DeltaWriteError(f"Cannot upsert into {uri}: several rows share the key {duplicate}")
            # A row per key, as an insert-only MERGE needs; only then, as this shuffles whole rows.
            df = df.dropDuplicates(list(keys))
        if stored is None or emptied:
            return save("overwrite", overwrite_schema=emptied)
        if _nothing_stored_from(stored, merge_floor):
            # No stored row can match a key: the MERGE would insert every row; an append skips its join.
            return save("append")
        return _merge(spark, df, stored, uri, keys, mode is WriteMode.UPSERT, merge_floor, txn)
    if mode is WriteMode.APPLY_CHANGES:
        if stored is None or emptied:  # nothing stored to change: the rows are the table
            df = df.where(~F.col(DELETED)).drop(DELETED)
            return save("overwrite", overwrite_schema=emptied)
        if rows_at_most is not None and rows_at_most <= SMALL_MERGE_ROWS:
            return _apply_changes_small(in_hand(), stored, uri, keys, user_metadata)
        return _apply_changes(spark, df, stored, uri, keys, user_metadata)
    replaced = None  # the partition window a replace_partition overwrites (None: the whole table)
    if mode is WriteMode.REPLACE_PARTITION:
        if window is None:
            raise DeltaWriteError(f"replace_partition into {uri} needs a partition window")
        kind = partition_kind(df, window.column, uri)
        replaced = None if stored is None or emptied else (window, kind)  # no stored row: the rows are the table
    appends = mode is WriteMode.APPEND and not emptied

    def replaced_rows() -> int:  # the stored rows in the window a replace overwrites
        return sum(count_by(lambda: spark, uri, window.column, window, table=stored).values())

    if held(rows_at_most, len(df.columns)):
        # Collected and committed by deltalake: Spark's Delta write costs a job, a commit and a
        # snapshot update, where the rows held in Python take milliseconds. The rows a window's
        # replace deletes are counted as Spark's replaceWhere counts them.
        return _write_small(in_hand(), stored, request, appends, replaced, 0 if replaced is None else replaced_rows())
    if replaced is not None:
        result = save("overwrite", replace_where=replaced[0].predicate(replaced[1]), merge_schema=True)  # columns a definition adds
        if result.metrics.get("numRemovedFiles") and "numDeletedRows" not in result.metrics:
            # Delta counts the rows a replace deletes only when it writes some: a window replaced
            # by no row deleted every row it held.
            result.metrics["numDeletedRows"] = replaced_rows()
        return result
    if appends:
        return save("append")
    return save("overwrite", overwrite_schema=True)


def _write_small(
    rows: pa.Table, stored: deltalake.DeltaTable | None, request: WriteRequest, appends: bool,
    replaced: tuple[Window, T.DataType] | None, deleted: int = 0,
) -> WriteResult:
    """The same append or replace as Spark's in `write`, of rows in hand, by deltalake (no Spark
    job): a window replaced keeps the columns it lacks (as mergeSchema), a whole table takes the
    rows' columns (as overwriteSchema), and an append of no row commits nothing but its marker.
    `deleted`: the stored rows the window held, reported as Spark reports them."""
    commit = _commit_properties(request.txn, request.user_metadata)
    if appends and rows.num_rows == 0 and stored is not None:
        return _nothing_appended(request.uri, stored.version(), request.user_metadata)
    predicate = replaced[0].predicate(replaced[1], quote='"') if replaced is not None else None
    deltalake.write_deltalake(
        request.uri, rows, mode="append" if appends else "overwrite", predicate=predicate,
        schema_mode="merge" if appends or predicate else "overwrite", partition_by=list(request.partition_by) or None,
        configuration=request.properties, commit_properties=commit,
    )
    metrics = {"numOutputRows": rows.num_rows, **({"numDeletedRows": deleted} if replaced is not None else {})}
    return WriteResult(last_commit(request.uri).version, "WRITE", metrics)


def _nothing_appended(uri: str, version: int, user_metadata: str | None) -> WriteResult:
    """An append of no row commits nothing (as Delta's own); a marker says how far the table's
    writer got, and lands all the same."""
    return mark(uri, user_metadata) if user_metadata else WriteResult(version, NO_COMMIT)


def empty(uri: str, txn: Txn | None = None) -> WriteResult | None:
    """Delete every row of the table at `uri` (None: there is none) in one deltalake commit, no JVM:
    a batch known to hold no row (where a Spark overwrite with no rows costs a job and a second), a
    refresh, a plan's rebuild. Its schema, properties and history stay, and its next write sets its
    columns (see `write`); `txn` as a write's."""
    stored = stored_table(uri)
    if stored is None:
        return None
    if txn is not None and committed(stored, txn):
        return _already_committed(stored)
    deleted = stored.delete(commit_properties=_commit_properties(txn))
    return WriteResult(stored.version(), "DELETE", {"numDeletedRows": int(deleted.get("num_deleted_rows", 0))})


def delete_rows(
    spark: SparkSession, uri: str, matching: DataFrame, on: Sequence[str], user_metadata: str,
    derived: Mapping[str, Column] | None = None,
) -> int:
    """Delete the rows that share `on` with `matching` (an erasure), as a MERGE that rewrites the
    files that held them: its commit records the join on column names alone, never a value (a
    DELETE records its whole predicate). `derived`: keys the target computes from its columns
    (a source's user identifier), recorded as their expressions. `user_metadata` names the commit.
    The rows deleted."""
    target = path_identifier(uri)
    merge = matching.select(*on).distinct().alias("s").mergeInto(target, _on_keys(target, on, derived)).whenMatched().delete()
    for attempt in range(1, DELETE_ATTEMPTS + 1):
        since = datetime.now(timezone.utc)
        try:
            _merged(spark, merge, deltalake.DeltaTable(uri), uri, {USER_METADATA_CONF: user_metadata})
            break
        except Exception as error:  # noqa: BLE001 - Delta's conflicts reach Python as Spark's captured exceptions
            if attempt == DELETE_ATTEMPTS or not any(conflict in str(error) for conflict in DELTA_CONFLICTS):
                raise
            time.sleep(attempt)
    # from its own commit: a writer outside the lease (a source's loader) may have committed after it
    return rows_deleted_by(uri, user_metadata, since) or 0


# A delete from a table another writer appends to (a source's loader) conflicts with its appends
# (Delta's optimistic concurrency): being idempotent, it is tried again, up to this many times.
DELETE_ATTEMPTS = 5
DELTA_CONFLICTS = ("DELTA_CONCURRENT_APPEND", "DELTA_CONCURRENT_DELETE_READ", "DELTA_CONCURRENT_TRANSACTION")


def truncate(uri: str) -> int:
    """`empty` for a refresh or a plan's rebuild: the rows deleted (0: no table)."""
    result = empty(uri)
    return 0 if result is None else result.rows_deleted


def compact(table: deltalake.DeltaTable, partitions: list[tuple] | None, zorder_by: Sequence[str] = ()) -> None:
    """OPTIMIZE (deltalake, no JVM) of `partitions` (None: all): small files compacted, or rewritten
    Z-ordered by `zorder_by`, whose columns the commit records as Spark's OPTIMIZE does."""
    if zorder_by:
        columns = deltalake.CommitProperties(custom_metadata={"zOrderBy": json.dumps(list(zorder_by))})
        table.optimize.z_order(list(zorder_by), partition_filters=partitions, commit_properties=columns)
    else:
        table.optimize.compact(partition_filters=partitions)


def keep_log_checkpoints(table: deltalake.DeltaTable) -> bool:
    """Give a table an earlier release made the log checkpoints every table is now made with
    (LOG_CHECKPOINTS): one commit that changes no data, once. Whether it was needed."""
    configuration = table.metadata().configuration
    if all(configuration.get(key) == value for key, value in LOG_CHECKPOINTS.items()):
        return False
    table.alter.set_table_properties(LOG_CHECKPOINTS)
    return True


def vacuum(uri: str, retention_hours: float, now: datetime) -> None:
    """VACUUM with deltalake (Spark's lists files with 10,000 tasks by default, slow even for a
    tiny table), never within Delta's own default retention but at 0 (an erasure's purge: every
    file the current version does not read). Full: every file the log does not reference, as
    Spark's, not only those its checkpoint still lists as removed (a removal older than
    `delta.deletedFileRetentionDuration` drops out of it). deltalake leaves the change data files
    (`_change_data/`, which no version's snapshot holds) where Spark's VACUUM deletes those older
    than the retention (before `now`, naive UTC): an erasure's hold the rows it deleted, so they are
    deleted here alike."""
    deltalake.DeltaTable(uri).vacuum(retention_hours=int(retention_hours), dry_run=False,
                                     enforce_retention_duration=retention_hours > 0, full=True)
    filesystem, root = filesystem_of(uri)
    found = filesystem.get_file_info(pafs.FileSelector(f"{root}/_change_data", recursive=True, allow_not_found=True))
    cutoff = now.replace(tzinfo=timezone.utc) - timedelta(hours=retention_hours)
    for info in found:
        if info.type == pafs.FileType.File and info.mtime is not None and info.mtime < cutoff:
            filesystem.delete_file(info.path)


def cut_log(uri: str) -> int:
    """Checkpoint the table at its current version and delete every log file before that version
    (commits, checkpoints, checksums): what Delta's log cleanup does once `logRetentionDuration`
    has passed (30 days by default), now. Older commits keep each file they added with its
    statistics, a string column's minimum and maximum, which can be an erased key. Time travel
    starts at the current version after it. The log files deleted."""
    table = deltalake.DeltaTable(uri)
    table.create_checkpoint()
    version = table.version()
    filesystem, root = filesystem_of(uri)
    deleted = 0
    for info in filesystem.get_file_info(pafs.FileSelector(f"{root}/_delta_log")):
        number = info.base_name.lstrip(".").split(".")[0]  # `.N.json.crc`: a local file system's checksum of one
        if info.type == pafs.FileType.File and number.isdigit() and int(number) < version:
            filesystem.delete_file(info.path)
            deleted += 1
    return deleted


def append_rows(uri: str, rows: pa.Table, txn: Txn) -> WriteResult:
    """Append a few rows (a run's record) with deltalake: milliseconds, where a Spark write of one
    row costs a job and a second. Same transaction identifier rule as `write`."""
    stored = stored_table(uri)
    if committed(stored, txn):
        return _already_committed(stored)
    # "merge": a record gains the columns a newer release adds to it
    deltalake.write_deltalake(uri, rows, mode="append", schema_mode="merge", configuration=LOG_CHECKPOINTS,
                              commit_properties=_commit_properties(txn))
    return last_commit(uri)


def mark(uri: str, user_metadata: str) -> WriteResult:
    """A commit that adds no row and carries `user_metadata` (deltalake, no JVM), where Spark
    commits nothing: a sample stream's quiet hour still moves its marker on."""
    schema = pa.schema(deltalake.DeltaTable(uri).schema().to_arrow())
    deltalake.write_deltalake(uri, schema.empty_table(), mode="append", commit_properties=_commit_properties(user_metadata=user_metadata))
    return last_commit(uri)


def replace_with(uri: str, rows: pa.Table, partition_by: Sequence[str], properties: Mapping[str, str] | None) -> WriteResult:
    """Replace the whole table at `uri` with `rows` (an ordinary asset's pandas or Arrow value) by
    deltalake, no JVM; the table takes their columns, as a Spark replace's does."""
    request = WriteRequest(uri, WriteMode.REPLACE, partition_by=partition_by, properties=properties)
    return _write_small(nullable(whole_offsets(rows)), None, request, appends=False, replaced=None)  # a whole replace reads no stored table


def _typed_for(stored: deltalake.DeltaTable | None, rows: pa.Table) -> pa.Table:
    """`rows` typed as Spark's Delta writer stores any frame, every field nullable: a table deltalake
    creates or widens holds the types Spark's would, and takes a column that a later run computes
    another way (a frame types a count, a struct of values or a set's elements as non-null; Spark's
    MERGE casts no nullable field into a non-null one). Into a table that an earlier release's
    small write stored with non-null fields, they keep the frame's types, as those writes did:
    deltalake casts no nullable struct field into a non-null one (docs/operations.md)."""
    return rows if stored is not None and _stores_non_null(stored_schema(stored)) else nullable(rows)


def _stores_non_null(kind: T.DataType) -> bool:
    if isinstance(kind, T.StructType):
        return any(not field.nullable or _stores_non_null(field.dataType) for field in kind.fields)
    if isinstance(kind, T.ArrayType):
        return not kind.containsNull or _stores_non_null(kind.elementType)
    if isinstance(kind, T.MapType):
        return not kind.valueContainsNull or _stores_non_null(kind.valueType)
    return False


def _nothing_stored_from(table: deltalake.DeltaTable, floor: tuple[str, date] | None) -> bool:
    """Whether the table has no file a MERGE pruned at `floor` would read (the whole table without
    one), from the log's file list: no Spark job."""
    files = data_files(table)
    if floor is None or files.num_rows == 0:
        return files.num_rows == 0
    column, value = f"partition.{floor[0]}", floor[1]
    return column in files.column_names and all(day is not None and day < value for day in files.column(column).to_pylist())


def _commit_properties(txn: Txn | None = None, user_metadata: str | None = None) -> deltalake.CommitProperties:
    """A deltalake commit that records `txn` and `user_metadata`, as Spark's txnAppId/txnVersion
    and userMetadata do."""
    return deltalake.CommitProperties(
        app_transactions=[deltalake.Transaction(txn.app_id, txn.version)] if txn else None,
        custom_metadata={"userMetadata": user_metadata} if user_metadata else None,
    )


def _already_committed(table: deltalake.DeltaTable) -> WriteResult:
    return WriteResult(table.version(), "none: this transaction is already committed", skipped=True)


def committed(table: deltalake.DeltaTable | None, txn: Txn) -> bool:
    """Whether the table (None: no table yet) already holds `txn`, from its log: no Spark job."""
    version = None if table is None else table.transaction_version(txn.app_id)
    return version is not None and version >= txn.version


def last_commit(uri: str) -> WriteResult:
    """The table's latest commit, read from the log by deltalake (milliseconds, no Spark job)."""
    return _latest_commit(deltalake.DeltaTable(uri))


def _latest_commit(table: deltalake.DeltaTable) -> WriteResult:
    """The latest commit of a table already open (deltalake's own writes keep it current)."""
    return _result(table.history(1)[0])


def _result(entry: dict) -> WriteResult:
    """A WriteResult from a commit's history entry."""
    metrics = {key: int(value) for key, value in (entry.get("operationMetrics") or {}).items() if str(value).isdigit()}
    return WriteResult(entry["version"], entry["operation"], metrics)


def create_with_change_feed(
    spark: SparkSession, uri: str, schema: T.StructType, partition_by: Sequence[str], properties: Mapping[str, str] | None = None
) -> None:
    """Create an empty table that records its change data feed (idempotent), so the rows a
    MERGE inserted can be read back exactly by version."""
    if table_exists(uri):
        return  # cheaper than Delta's own existence check, which runs on every write
    writer = no_rows(spark, schema).write.format("delta").mode("ignore")  # "ignore": a table there wins
    writer.options(**{**(properties or {}), "delta.enableChangeDataFeed": "true"}).partitionBy(*partition_by).save(uri)


def _save(
    df: DataFrame,
    uri: str,
    mode: str,
    partition_by: Sequence[str],
    replace_where: str | None = None,
    overwrite_schema: bool = False,
    user_metadata: str | None = None,
    txn: Txn | None = None,
    properties: Mapping[str, str] | None = None,
    merge_schema: bool = False,
) -> WriteResult:
    writer = df.write.format("delta").mode(mode).options(**(properties or {}))  # taken when it creates the table
    if user_metadata:
        writer = writer.option("userMetadata", user_metadata)
    if txn is not None:
        writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if replace_where:
        writer = writer.option("replaceWhere", replace_where)
    if overwrite_schema:
        writer = writer.option("overwriteSchema", "true")
    if mode == "append" or merge_schema:
        writer = writer.option("mergeSchema", "true")
    writer.save(uri)
    return last_commit(uri)


def _merge(
    spark: SparkSession,
    df: DataFrame,
    table: deltalake.DeltaTable,
    uri: str,
    keys: Sequence[str],
    update: bool,
    floor: tuple[str, date] | None,
    txn: Txn | None,
) -> WriteResult:
    schema = stored_schema(table)
    _require_castable(df, schema, uri)
    target = path_identifier(uri)
    condition = _on_keys(target, keys)
    if floor is not None:
        stored = F.col(f"{target}.`{floor[0]}`")
        condition = condition & (stored.isNull() | (stored >= F.lit(floor[1])))
    merge = df.alias("s").mergeInto(target, condition)  # target: path_identifier, a quoted name
    if update:
        merge = merge.whenMatched().updateAll()
    # As appends' mergeSchema, but only when the rows bring a column the table lacks: with schema
    # evolution on, Delta's UPDATE * writes a null struct as a struct of nulls.
    session_conf = {SCHEMA_EVOLUTION_CONF: "true"} if _brings_columns(df, schema) else {}
    if txn is not None:
        session_conf.update({TXN_CONF[0]: txn.app_id, TXN_CONF[1]: str(txn.version)})
    return _merged(spark, merge.whenNotMatched().insertAll(), table, uri, session_conf)


def _brings_columns(df: DataFrame, stored: T.StructType) -> bool:
    """Whether `df` holds a column, or a column of another type (a struct that gained a field),
    that the stored table does not."""
    types = {f.name: f.dataType.simpleString() for f in stored.fields}
    return any(types.get(f.name) != f.dataType.simpleString() for f in df.schema.fields)


def _apply_changes(
    spark: SparkSession, df: DataFrame, table: deltalake.DeltaTable, uri: str, keys: Sequence[str], user_metadata: str | None
) -> WriteResult:
    """One MERGE of change rows on `keys`: a row marked DELETED deletes its stored row, the others
    update or insert theirs (the table's columns only)."""
    schema = stored_schema(table)
    _require_castable(df, schema, uri)
    target = path_identifier(uri)
    deleted = F.col(f"s.`{DELETED}`")
    values = {column: F.col(f"s.`{column}`") for column in df.columns if column != DELETED}
    merge = df.alias("s").mergeInto(target, _on_keys(target, keys)).whenMatched(deleted).delete()
    merge = merge.whenMatched().update(values).whenNotMatched(~deleted).insert(values)
    return _merged(spark, merge, table, uri, {USER_METADATA_CONF: user_metadata} if user_metadata else {})


def _require_castable(df: DataFrame, schema: T.StructType, uri: str) -> None:
    """Spark's MERGE casts no nested field or list element that may hold a null into one the table
    declares non-null (only an earlier release's small writes stored such types, see `_typed_for`):
    refused here by name, not by Spark's `cannot cast "ARRAY<STRING>" to "ARRAY<STRING>"`."""
    stored = {field.name: field.dataType for field in schema.fields}
    for field in df.schema.fields:
        path = _looser(field.dataType, stored.get(field.name), field.name)
        if path is not None:
            raise DeltaWriteError(
                f"Cannot merge into {uri}: {path} may hold a null in these rows, where the table (written by an "
                "earlier release) declares none; a full refresh gives the table nullable columns (docs/operations.md)"
            )


def _looser(kind: T.DataType, stored: T.DataType | None, path: str) -> str | None:
    """The first field, list element or map value below `path` (named as Delta names it: `a.b`,
    `a.element`, `a.value`) that `kind` lets be null and `stored` does not."""
    if isinstance(kind, T.StructType) and isinstance(stored, T.StructType):
        fields = {field.name: field for field in stored.fields}
        for field in kind.fields:
            kept = fields.get(field.name)
            if kept is not None and field.nullable and not kept.nullable:
                return f"{path}.{field.name}"
            found = _looser(field.dataType, kept.dataType if kept else None, f"{path}.{field.name}")
            if found is not None:
                return found
    if isinstance(kind, T.ArrayType) and isinstance(stored, T.ArrayType):
        if kind.containsNull and not stored.containsNull:
            return f"{path}.element"
        return _looser(kind.elementType, stored.elementType, f"{path}.element")
    if isinstance(kind, T.MapType) and isinstance(stored, T.MapType):
        if kind.valueContainsNull and not stored.valueContainsNull:
            return f"{path}.value"
        return _looser(kind.valueType, stored.valueType, f"{path}.value")
    return None


def _on_keys(target: str, keys: Sequence[str], derived: Mapping[str, Column] | None = None) -> Column:
    """The target's rows (named through its table) and the source's `s` that share `keys`; a key
    in `derived` is the target's expression, not its column."""
    return reduce(Column.__and__, [(derived or {}).get(key, F.col(f"{target}.`{key}`")).eqNullSafe(F.col(f"s.`{key}`"))
                                   for key in keys])


def _merged(spark: SparkSession, merge, table: deltalake.DeltaTable, uri: str, session_conf: Mapping[str, str]) -> WriteResult:
    """Run a MERGE (Delta reads these of its settings from the session, not from the writer), and
    what it committed."""
    before = table.version()  # as `write` opened it
    for key, value in session_conf.items():
        spark.conf.set(key, value)
    try:
        merge.merge()
    finally:
        for key in session_conf:
            spark.conf.unset(key)
    after = last_commit(uri)
    # A merge that changes nothing commits nothing: report zeros, not the previous commit's metrics.
    return after if after.version != before else WriteResult(version=before, operation="MERGE (no change)")


def _apply_changes_small(
    rows: pa.Table, stored: deltalake.DeltaTable, uri: str, keys: Sequence[str], user_metadata: str | None
) -> WriteResult:
    """The same MERGE as `_apply_changes`, of rows in hand, by deltalake (no Spark job)."""
    if rows.num_rows == 0:
        return WriteResult(stored.version(), "MERGE (no change)")
    condition = " AND ".join(f't."{key}" = s."{key}"' for key in keys)
    values = {f'"{column}"': f's."{column}"' for column in rows.column_names if column != DELETED}
    commit = _commit_properties(user_metadata=user_metadata)
    merge = stored.merge(rows, condition, source_alias="s", target_alias="t", commit_properties=commit)
    merge = merge.when_matched_delete(predicate=f's."{DELETED}"').when_matched_update(updates=values)
    metrics = merge.when_not_matched_insert(updates=values, predicate=f'NOT s."{DELETED}"').execute()
    return _small_merge_result(stored, metrics)


def path_identifier(uri: str) -> str:
    """The table at `uri` as a Spark identifier (delta.`path`), its backticks escaped: a name, not SQL."""
    return "delta.`" + uri.replace("`", "``") + "`"


def _merge_small(
    rows: pa.Table,
    stored: deltalake.DeltaTable,
    uri: str,
    keys: Sequence[str],
    update: bool,
    floor: tuple[str, date] | None,
    txn: Txn | None,
) -> WriteResult:
    """The same MERGE as `_merge`, of rows in hand, by deltalake (no Spark job; the key check in Arrow)."""
    rows = _one_row_per_key(rows, keys, uri, update)
    if rows.num_rows == 0:
        return WriteResult(stored.version(), "MERGE (no change)")
    condition = " AND ".join(f't."{key}" = s."{key}"' for key in keys)
    if floor is not None:
        # a date of ours, never user input
        condition += f""" AND (t."{floor[0]}" IS NULL OR t."{floor[0]}" >= '{floor[1].isoformat()}')"""
    merge = stored.merge(
        rows, condition, source_alias="s", target_alias="t", merge_schema=True, commit_properties=_commit_properties(txn)
    )
    if update:
        merge = merge.when_matched_update_all()
    metrics = merge.when_not_matched_insert_all().execute()
    return _small_merge_result(stored, metrics)


def _small_merge_result(stored: deltalake.DeltaTable, metrics: Mapping[str, Any]) -> WriteResult:
    """A deltalake MERGE's metrics, named as Spark's."""
    return WriteResult(
        stored.version(),
        "MERGE",
        {
            "numTargetRowsInserted": metrics.get("num_target_rows_inserted", 0),
            "numTargetRowsUpdated": metrics.get("num_target_rows_updated", 0),
            "numTargetRowsDeleted": metrics.get("num_target_rows_deleted", 0),
        },
    )


def _one_row_per_key(rows: pa.Table, keys: Sequence[str], uri: str, update: bool) -> pa.Table:
    """`rows` with one row per key, as `write` makes them for Spark: an upsert refuses a shared key,
    an insert-only MERGE keeps the first row of each."""
    first = rows.append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
    first = first.group_by(list(keys), use_threads=False).aggregate([("_row", "min"), ("_row", "count")])
    shared = first.filter(pc.greater(first["_row_count"], 1))
    if shared.num_rows == 0:
        return rows
    if update:
        raise DeltaWriteError(f"Cannot upsert into {uri}: several rows share the key {shared.select(list(keys)).to_pylist()[0]}")
    return rows.take(pc.take(first["_row_min"], pc.sort_indices(first["_row_min"])))


def _require_columns(df: DataFrame, columns: Iterable[str], uri: str) -> None:
    missing = sorted(set(columns) - set(df.columns))
    if missing:
        raise DeltaWriteError(f"Cannot write {uri}: the data lacks column(s) {missing}; it has {df.columns}")


def _duplicate_key(df: DataFrame, keys: Sequence[str]) -> dict | None:
    """A key that several rows share, or None; shuffles only the key columns."""
    duplicate = df.groupBy(*keys).count().where(F.col("count") > 1).first()
    return None if duplicate is None else {key: duplicate[key] for key in keys}



def note(uri: str, run_id: str, value: Mapping[str, Any]) -> None:
    """Store `value` with the table for the next steps of run `run_id` (a table property: one
    small commit, no JVM; it holds the latest run's note only). See log.noted."""
    stored_table(uri).alter.set_table_properties(
        {NOTE_PROPERTY: json.dumps({"run_id": run_id, "value": value}, default=str)}, raise_if_not_exists=False
    )
