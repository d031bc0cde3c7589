"""Reading Delta tables with Spark: a table whole, the rows commits inserted (its change data
feed), and row counts by a column inside a window."""

from __future__ import annotations

from collections.abc import Callable

import deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.delta.log import _partition_counts, stored_table
from incremental_assets.lib.delta.spec import DeltaWriteError, Window


def read_table(spark: SparkSession, uri: str) -> DataFrame:
    require_table(uri)
    return spark.read.format("delta").load(uri)


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
