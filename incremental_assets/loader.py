"""Load a user's export of atomic events (CSV, Parquet or JSON lines) into the source Delta table.

The file is checked against the source contract (SPEC §2) before anything is written, so a
wrong export fails with the list of what it lacks instead of leaving a half-usable table.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.atomic_events import LOAD_DATE, REQUIRED_COLUMNS, SAMPLE_SCHEMA
from incremental_assets.delta_tables import WriteMode, write
from incremental_assets.environment import is_uri

FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "json", ".jsonl": "json", ".ndjson": "json"}
WRITE_MODES = {"append": WriteMode.APPEND, "replace": WriteMode.REPLACE}


class SourceSchemaError(ValueError):
    """An export that lacks required atomic columns; nothing was written."""


def load_file(spark: SparkSession, path: str | Path, table_uri: str, mode: str = "append") -> int:
    """Load one export into the source table (`append`, or `replace` its content); returns rows written."""
    path = str(path)
    _write_mode(mode)  # a wrong mode fails before the file is read
    frame = _read(spark, path)
    missing = [column for column in REQUIRED_COLUMNS if column not in frame.columns]
    if missing:
        raise SourceSchemaError(
            f"{path} lacks required column(s) {', '.join(missing)}; it has {', '.join(frame.columns)}"
        )
    unreadable = _unreadable_values(frame)
    if unreadable:
        found = "; ".join(f"{column} holds {value!r}" for column, value in unreadable.items())
        raise SourceSchemaError(f"{path} has values that are not of their column's type: {found}")
    return write_events(spark, _cast(frame), table_uri, mode)


def write_events(
    spark: SparkSession, frame: DataFrame, table_uri: str, mode: str = "append", user_metadata: str | None = None
) -> int:
    """Write atomic events to a source table, partitioned by load_date; returns rows written.

    Appends may add new extra columns (schema merge); a replace also replaces the schema.
    """
    return write(
        spark, frame, table_uri, _write_mode(mode), partition_by=[LOAD_DATE], user_metadata=user_metadata
    ).rows_inserted


def _write_mode(mode: str) -> WriteMode:
    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {', '.join(WRITE_MODES)}, got {mode!r}")
    return WRITE_MODES[mode]


def _read(spark: SparkSession, path: str) -> DataFrame:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"Cannot tell the format of {path}: use one of {', '.join(FORMATS)}")
    if not is_uri(path) and not Path(path).exists():
        raise FileNotFoundError(f"No such file: {path}")
    reader = spark.read
    if FORMATS[suffix] == "csv":
        # Every column is read as text and cast below; quotes are escaped by doubling (RFC 4180).
        reader = reader.option("header", True).option("escape", '"')
    frame = reader.format(FORMATS[suffix]).load(path)
    return _canonical_names(frame)


def _canonical_names(frame: DataFrame) -> DataFrame:
    """Accept known columns in any letter case (warehouse exports often upper-case them)."""
    known = {name.lower(): name for name in SAMPLE_SCHEMA.fieldNames()}
    return frame.toDF(*(known.get(column.lower(), column) for column in frame.columns))


def _cast(frame: DataFrame) -> DataFrame:
    """Known columns to their contract types, known ones first; extra columns kept as they are.

    Timestamp text with an offset is converted to UTC; without one it is read as UTC (the
    session time zone), as are Parquet timestamps without a time zone. Blank text in a typed
    column is null (exports write nulls that way); any other unreadable value fails the load
    (Spark's ANSI mode, the default) and, the write being one transaction, writes nothing.
    """
    known = [field for field in SAMPLE_SCHEMA.fields if field.name in frame.columns]
    extra = [column for column in frame.columns if column not in SAMPLE_SCHEMA.fieldNames() and column != LOAD_DATE]
    return frame.select(
        *(_typed(frame, field).alias(field.name) for field in known),
        *(F.col(_quoted(column)) for column in extra),
    ).withColumn(LOAD_DATE, F.to_date("load_tstamp"))


def _unreadable_values(frame: DataFrame) -> dict[str, str]:
    """For each known column read as text whose non-blank values do not all cast to its contract
    type: the first such value. One pass over the file, before anything is written."""
    text = [
        field for field in SAMPLE_SCHEMA.fields
        if field.name in frame.columns and not isinstance(field.dataType, T.StringType)
        and isinstance(frame.schema[field.name].dataType, T.StringType)
    ]
    if not text:
        return {}
    bad = {field.name: (F.trim(F.col(field.name)) != "") & F.col(field.name).try_cast(field.dataType).isNull() for field in text}
    row = frame.select(*(F.first(F.when(bad[name], F.col(name)), ignorenulls=True).alias(name) for name in bad)).first()
    return {name: row[name] for name in bad if row[name] is not None}


def _typed(frame: DataFrame, field: T.StructField) -> Column:
    column = F.col(field.name)
    if isinstance(frame.schema[field.name].dataType, T.StringType) and not isinstance(field.dataType, T.StringType):
        column = F.when(F.trim(column) != "", column)
    return column.cast(field.dataType)


def _quoted(column: str) -> str:
    """A column reference that takes dots and spaces in the name literally."""
    return "`" + column.replace("`", "``") + "`"
