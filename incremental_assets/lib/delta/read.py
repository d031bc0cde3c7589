"""Reading Delta tables with Spark: a table whole, the rows commits inserted (its change data
feed), row counts by a column inside a window, and what a check reads of a table just written."""

from __future__ import annotations

import json
from collections.abc import Callable

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow.parquet import filters_to_expression
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.delta.arrow import from_rows, held, to_spark
from incremental_assets.lib.delta.log import _partition_counts, counted_rows, data_files, dataset_of, reading, scan, split_filters, stored_table
from incremental_assets.lib.delta.spec import DeltaWriteError, Window
from incremental_assets.lib.spark import is_small


def read_table(spark: SparkSession, uri: str) -> DataFrame:
    require_table(uri)
    return spark.read.format("delta").load(uri)


# Keys up to which a step's read names them (`naming`): a run's few hundred of a table's thousands.
KEYS_NAMED = 20_000


def naming(keys: DataFrame, column: str, count: int) -> list[tuple]:
    """A read filter naming the `count` values of `column` in `keys`, when they are few; none above
    KEYS_NAMED. Read whole, the other keys' rows went to Spark only to be joined away, a cost that
    grew with the history."""
    if count > KEYS_NAMED:
        return []
    return [(column, "in", [row[column] for row in keys.select(column).collect()])]


def read_just_written(spark: SparkSession, uri: str, columns: list[str] | None = None, filters: list[tuple] | None = None) -> DataFrame:
    """`columns` (None: every column, in the log's order) of the table's rows that `filters` keeps,
    as a Spark DataFrame: read_to_check's rows, handed to Spark when deltalake read them."""
    table, rows = _read(spark, uri, columns, filters)
    return rows if isinstance(rows, DataFrame) else to_spark(spark, rows, _spark_schema(table, rows.column_names))


def read_to_check(spark: SparkSession, uri: str, columns: list[str], filters: list[tuple] | None = None) -> pa.Table | DataFrame:
    """`columns` of the table's rows that `filters` keeps, as they were read: in Arrow when
    deltalake read them (a check then looks at them with no Spark job: lib/transforms/violations),
    else Spark's DataFrame."""
    return _read(spark, uri, columns, filters)[1]


def _read(spark: SparkSession, uri: str, columns: list[str] | None, filters: list[tuple] | None) -> tuple[deltalake.DeltaTable, pa.Table | DataFrame]:
    """What a check, or a later step of the run, reads of a table a step has just committed
    ((column, op, value) filters with in, >= or <: on a partition column they skip files, on
    another they keep rows). A small read (by the log's record counts, in rows and in cells:
    arrow.held) goes through deltalake: Spark's Delta reader would first build its snapshot of the
    version deltalake has just committed, skip files by their statistics and plan the scan, which
    cost a warm run more than the check's own jobs (benchmarks/comparisons.md).
    A larger read that names keys (`in` on a column other than a partition's) is scanned in Arrow
    batch by batch, keeping the rows named, while they stay few. Any other read, or one the log
    cannot count, is Spark's."""
    filters = filters or []
    unknown = sorted({op for _, op, _ in filters} - _SPARK_FILTERS.keys())
    if unknown:  # refused whichever path the read's size takes
        raise ValueError(f"read_just_written: no filter {unknown}; it takes {sorted(_SPARK_FILTERS)}")
    table = require_table(uri)
    columns = columns or [field.name for field in table.schema().fields]
    files = data_files(table)
    partitioned = set(table.metadata().partition_columns)
    pruning = [(f"partition.{column}", op, value) for column, op, value in filters if column in partitioned]
    if pruning:  # the other filters keep rows of the files counted
        files = files.filter(filters_to_expression(pruning))
    read = columns + [column for column, _, _ in filters if column not in columns]
    rows = None
    counted = counted_rows(files)
    if is_small(counted) and held(counted, len(read)):
        rows = _read_small(uri, table, read, filters, partitioned)
    elif any(op == "in" and column not in partitioned for column, op, _ in filters):
        rows = _named_rows(uri, table, read, filters, partitioned)
    if rows is not None:
        return table, rows.select(columns)
    rows = spark.read.format("delta").load(uri)  # the table is there: opened above
    for column, op, value in filters:
        if op == "in" and column not in partitioned:  # thousands of literals took Spark seconds to plan; a join does not
            values = from_rows(spark, [(v,) for v in _matching(value)], T.StructType([rows.schema[column]]))
            rows = rows.join(F.broadcast(values), column, "left_semi")
        else:
            rows = rows.where(_SPARK_FILTERS[op](F.col(column), value))
    return table, rows.select(*columns)


def _read_small(uri: str, table: deltalake.DeltaTable, read: list[str], filters: list[tuple], partitioned: set) -> pa.Table:
    """`read` of the rows `filters` keeps, read by deltalake: partition filters prune its scan, the
    others keep rows of what it read (pyarrow compares no string_view in deltalake's scan)."""
    on_partitions, kept = _split(filters, partitioned)
    with reading(uri):
        rows = _without_views(scan(table, read, on_partitions))
    return rows.filter(filters_to_expression(kept)) if kept else rows


def _split(filters: list[tuple], partitioned: set) -> tuple[list[tuple], list[tuple]]:
    """`filters` as an Arrow read takes them: those on partition columns, which prune files, and the
    others, which keep rows (an `in` list without the values that match none, as in Spark)."""
    on_partitions, rest = split_filters(filters, partitioned)
    return on_partitions, [(column, op, _matching(value) if op == "in" else value) for column, op, value in rest]


def _named_rows(uri: str, table: deltalake.DeltaTable, read: list[str], filters: list[tuple], partitioned: set) -> pa.Table | None:
    """`read` of the rows `filters` keeps, scanned as a pyarrow dataset a batch at a time: partition
    filters prune its files, the others keep rows of each batch (as in `_read_small`). What it holds
    follows the rows kept, not the rows scanned. None as soon as they are not few: Spark reads them
    then. A run names a few hundred sessions of millions."""
    on_partitions, kept = _split(filters, partitioned)
    batches, held = [], 0
    with reading(uri):
        dataset = dataset_of(table, on_partitions)
        schema = _without_views(pa.schema([dataset.schema.field(column) for column in read]).empty_table()).schema
        for batch in dataset.to_batches(columns=read, filter=filters_to_expression(on_partitions) if on_partitions else None):
            rows = _without_views(pa.Table.from_batches([batch])).filter(filters_to_expression(kept))
            batches.extend(rows.to_batches())
            held += rows.num_rows
            if not is_small(held):
                return None
    return pa.Table.from_batches(batches, schema)


# The filters read_just_written takes, as Spark's conditions: the operators its callers use.
_SPARK_FILTERS: dict[str, Callable[[Column, object], Column]] = {
    "in": lambda column, value: column.isin(list(value)),
    ">=": lambda column, value: column >= value,
    "<": lambda column, value: column < value,
}


def _matching(values: list) -> list:
    """The values of an `in` list that can match a row: in Spark a null matches none (in pyarrow it
    would), and a frame of a non-nullable column's values could not hold one."""
    return [value for value in values if value is not None]


def _without_views(rows: pa.Table) -> pa.Table:
    """Files deltalake's MERGE wrote read as string_view columns, which Spark cannot take from Arrow."""
    fields = [pa.field(f.name, pa.string(), f.nullable) if pa.types.is_string_view(f.type) else f for f in rows.schema]
    return rows.cast(pa.schema(fields))


def _spark_schema(table: deltalake.DeltaTable, columns: list[str]) -> T.StructType:
    """The Spark schema of `columns` as the table's log declares it (what Spark's own read would give)."""
    declared = T.StructType.fromJson(json.loads(table.schema().to_json()))
    return T.StructType([declared[name] for name in columns])


def require_table(uri: str) -> deltalake.DeltaTable:
    """The table at `uri`, opened from its log; raise when there is none: what a step reading it
    would meet, said before the step writes anything when it reads its input only later (`Stored`)."""
    table = stored_table(uri)
    if table is None:
        raise FileNotFoundError(f"No Delta table at {uri}: materialize the asset that writes it first")
    return table


def inserted_rows(spark: SparkSession, uri: str, version: int, last_version: int | None = None) -> DataFrame:
    """The rows that commits `version`..`last_version` (default: just `version`) inserted."""
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", version).option("endingVersion", last_version or version).load(uri)
    )
    return changes.where(F.col("_change_type") == "insert").drop("_change_type", "_commit_version", "_commit_timestamp")


def inserted_as_read(
    spark: SparkSession, uri: str, version: int, columns: list[str], rows: int | None, last_version: int | None = None
) -> pa.Table | DataFrame:
    """`columns` of the rows commits `version`..`last_version` (default: just `version`) inserted,
    as read_to_check hands rows: when they are few (`rows`, at most: the write's own count, or
    log.rows_added) deltalake reads its change feed and they stay in Arrow; otherwise Spark's
    (inserted_rows)."""
    last_version = last_version or version
    if not is_small(rows):
        return inserted_rows(spark, uri, version, last_version).select(*columns)
    table = require_table(uri)
    with reading(uri):
        changes = _without_views(pa.table(table.load_cdf(starting_version=version, ending_version=last_version)))
    return changes.filter(pc.field("_change_type") == "insert").select(columns)


def count_by(spark: Callable[[], SparkSession], uri: str, column: str, window: Window,
             table: deltalake.DeltaTable | None = None) -> dict:
    """Row counts per value of `column` inside `window`: from the log's file statistics when the
    table is partitioned by `column` (no session asked for), otherwise by a read with partition
    pruning. `table`: the table at `uri` as the caller opened it (its log is not read again)."""
    counts = _partition_counts(table or stored_table(uri), column, window)
    if counts is not None:
        return counts
    df = read_table(spark(), uri)
    rows = df.where(window.condition(df.schema[window.column].dataType)).groupBy(column).count().collect()
    return {row[column]: row["count"] for row in rows}


def partition_kind(df: DataFrame, column: str, uri: str) -> T.DataType:
    kind = df.schema[column].dataType
    if not isinstance(kind, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        raise DeltaWriteError(
            f"Cannot write {uri}: partition column '{column}' must be a date or timestamp, not {kind.simpleString()}"
        )
    return kind
