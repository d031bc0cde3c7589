"""Load a user's export of atomic events into the source Delta table: a CSV, Parquet or JSON-lines
file, a folder of such files (one format), or a Delta table.

A load is all or nothing. The export is read and checked before anything is written: records
that do not parse (CSV, JSON lines); its required columns; its times, by one rule for every
encoding (`logic.timestamps`: ISO text with any offset, timestamps of any unit, epochs whose unit
the magnitude tells); values that are not of their column's type; extra columns whose type
conflicts with the table's. A refused load names every problem and leaves the table as it was.
Its rows are then classified as a run would see them (`logic.arrivals`: behind the cursor, before
start_date, in the future) and written in one Delta commit.
"""

from __future__ import annotations

import contextlib
import csv
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.delta.log import stored_table
from incremental_assets.lib.delta.spec import WriteMode
from incremental_assets.lib.delta.write import WriteRequest, write
from incremental_assets.lib.environment import is_uri
from incremental_assets.lib.source.arrivals import Arrival, ArrivalBounds, Arrivals
from incremental_assets.lib.source.contract import LOAD_DATE, REQUIRED_COLUMNS, SAMPLE_SCHEMA
from incremental_assets.lib.source.timestamps import EpochUnit, Findings, Plausible, decide, summarise

FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "json", ".jsonl": "json", ".ndjson": "json"}
PARQUET_MAGIC = b"PAR1"  # how a Parquet file begins, suffix or not (Hive and some warehouses write none)
MALFORMED = "_malformed_record"  # where Spark puts a record it cannot parse, whole
# CSV as RFC 4180 has it: a quoted field may hold line breaks and doubled quotes (so each file is parsed
# whole, by one task). Every column is read as text and typed below.
READ_OPTIONS = {
    "csv": {"header": True, "multiLine": True, "escape": '"', "columnNameOfCorruptRecord": MALFORMED},
    "json": {"columnNameOfCorruptRecord": MALFORMED},
}
NOT_PARSED = {"csv": "are not CSV: a quote left open, or more or fewer fields than the header",
              "json": "are not JSON objects"}
WRITE_MODES = {"append": WriteMode.APPEND, "replace": WriteMode.REPLACE}
TIME_COLUMNS = [name for name, kind in REQUIRED_COLUMNS.items() if isinstance(kind, T.TimestampType)]
NUMBER_TEXT = r"^[+-]?[0-9]+([.][0-9]+)?$"
EPOCH = T.DecimalType(38, 9)  # holds any epoch number exactly: nanoseconds to 2^63, fractional seconds
NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)
INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
# Spark fails on Parquet's nanosecond timestamps (what pandas writes by default); read as longs,
# they are epochs in nanoseconds.
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"


class SourceSchemaError(ValueError):
    """An export that cannot be loaded as it is; nothing was written."""


@dataclass(frozen=True)
class LoadOptions:
    mode: str = "append"
    epoch_unit: EpochUnit | None = None  # None: inferred from magnitude, per column
    window: Plausible | None = None  # where every time must lie; default Plausible.around(today)


@dataclass
class Load:
    """A load checked and counted, written or not (a dry run)."""

    path: str
    rows: int
    units: dict[str, EpochUnit]  # how each column's epochs were read
    load_days: tuple[date | None, date | None, int]  # first, last, how many
    arrivals: Arrivals  # the rows as the next run will see them
    blank_event_ids: int = 0
    written: bool = False
    notes: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        first, last, days = self.load_days
        verb = "Loaded" if self.written else "Would load"
        lines = [f"{verb} {self.rows} rows from {self.path}: {days} load day(s) from {first} to {last}"]
        if self.units:
            lines.append("Epoch values read as " + ", ".join(f"{c} {u.noun}" for c, u in sorted(self.units.items())))
        if self.blank_event_ids:
            lines.append(f"{self.blank_event_ids} row(s) without an event_id: runs count them (null_event_id) and skip them")
        for arrival, what in ((Arrival.BEFORE_START, "before start_date: never processed"),
                              (Arrival.IN_FUTURE, "stamped after now: processed when their time comes"),
                              (Arrival.NULL_CURSOR, "without a cursor value: counted by runs, never processed")):
            if self.arrivals[arrival]:
                lines.append(f"{self.arrivals[arrival]} row(s) {what}")
        if self.arrivals[Arrival.BEHIND]:
            lines.append(
                f"{self.arrivals[Arrival.BEHIND]} row(s) behind the incremental cursor "
                f"({self.arrivals.behind_from} .. {self.arrivals.behind_to})"
            )
        return lines + self.notes


def load(
    spark: SparkSession, path: str | Path, table_uri: str, options: LoadOptions,
    bounds: ArrivalBounds | None = None, cursor: str = "load_tstamp", dry_run: bool = False,
) -> Load:
    """Check the export at `path`, count its rows as the next run will see them (by `bounds` on the
    `cursor` column; None: not counted), and (unless a dry run) write them to the source table at
    `table_uri` in one commit."""
    path = str(path)
    _write_mode(options.mode)  # a wrong mode fails before the file is read
    window = options.window or Plausible.around(date.today(), 0)
    with _session_conf(spark, {NANOS_AS_LONG: "true"}):
        kind, frame, units = _read(spark, path)
        missing = [column for column in REQUIRED_COLUMNS if column not in frame.columns]
        if missing:
            raise SourceSchemaError(f"{path} lacks required column(s) {', '.join(missing)}; it has {', '.join(frame.columns)}")
        stored = _stored_schema(spark, table_uri) if options.mode == "append" else None
        typed, units, blank_ids = _checked(frame, kind, path, units, options.epoch_unit, window, stored)
        counted = _counted(typed, bounds, cursor)
        result = Load(path, counted["rows"], units, (counted["first_day"], counted["last_day"], counted["days"]),
                      _arrivals(counted), blank_ids)
        if not dry_run and result.rows:
            write_events(spark, typed, table_uri, options.mode)
            result.written = True
    return result


def load_file(spark: SparkSession, path: str | Path, table_uri: str, mode: str = "append") -> int:
    """Load one export, its times read by the default rule; returns the rows written."""
    return load(spark, path, table_uri, LoadOptions(mode)).rows


def write_events(
    spark: SparkSession, frame: DataFrame, table_uri: str, mode: str = "append", user_metadata: str | None = None
) -> int:
    """Write atomic events to a source table, partitioned by load_date; returns rows written.

    Appends may add new extra columns (schema merge); a replace also replaces the schema.
    """
    return write(spark, frame, WriteRequest(table_uri, _write_mode(mode), partition_by=[LOAD_DATE], user_metadata=user_metadata)).rows_inserted


def _write_mode(mode: str) -> WriteMode:
    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {', '.join(WRITE_MODES)}, got {mode!r}")
    return WRITE_MODES[mode]


# -- reading ----------------------------------------------------------------------------------------


def _read(spark: SparkSession, path: str) -> tuple[str, DataFrame, dict[str, EpochUnit]]:
    """The export's format, the export as Spark reads it (known columns by their canonical names),
    and the columns whose epoch unit its format states (Parquet's nanosecond timestamps, read as longs)."""
    kind, files = _export(path)
    reader = spark.read.format(kind).options(**READ_OPTIONS.get(kind, {}))
    if files:  # a folder's files: partition folders (key=value) still give their columns
        reader = reader.option("basePath", path)
    source = files or path
    if kind == "csv":  # the header's columns, and the one a record lands in when it cannot be split into them
        reader = reader.schema(T.StructType([*reader.load(source).schema, T.StructField(MALFORMED, T.StringType())]))
    frame = _canonical_names(reader.load(source))
    known = {k.lower(): k for k in frame.columns}
    units = {known[name.lower()]: EpochUnit.NANOS for name in _parquet_nanos(source)} if kind == "parquet" else {}
    return kind, frame, {name: unit for name, unit in units.items() if name in TIME_COLUMNS}


def export_format(path: str) -> str:
    """The export's format (csv, parquet, json, delta), or an error naming why it has none."""
    return _export(path)[0]


def _export(path: str) -> tuple[str, list[str]]:
    """The export's format, and the files Spark reads when it is a folder of files (none: the path)."""
    local = None if is_uri(path) else Path(path)
    if local is not None and local.is_dir():
        return ("delta", []) if (local / "_delta_log").is_dir() else _folder(local)
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"Cannot tell the format of {path}: use one of {', '.join(FORMATS)}, a folder of such files, or a Delta table"
        )
    if local is not None and not local.exists():
        raise FileNotFoundError(f"No such file: {path}")
    return FORMATS[suffix], []


def _folder(folder: Path) -> tuple[str, list[str]]:
    """The one format of a folder's files (partition folders included) and the files; hidden files,
    markers (_SUCCESS) and checksums (.crc) that tools write beside an export are no part of it."""
    files = sorted(f for f in folder.rglob("*") if f.is_file() and not _beside_export(f.relative_to(folder)))
    if not files:
        raise ValueError(f"Nothing to load in {folder}: it holds no data file (hidden, _SUCCESS and .crc files are not read)")
    by_format: dict[str | None, list[Path]] = {}
    for file in files:
        by_format.setdefault(_file_format(file), []).append(file)
    if len(by_format) > 1 or None in by_format:
        found = "; ".join(f"{kind or 'no known format'}: {len(group)} file(s), e.g. {group[0].relative_to(folder)}"
                          for kind, group in by_format.items())
        raise ValueError(f"Cannot load {folder}: its files must be all CSV, all JSON lines or all Parquet; it holds {found}")
    [kind] = by_format
    if kind == "csv":
        _one_header(folder, files)
    return kind, [str(file) for file in files]


def _beside_export(relative: Path) -> bool:
    return relative.suffix == ".crc" or any(part.startswith((".", "_")) for part in relative.parts)


def _file_format(file: Path) -> str | None:
    if file.suffix.lower() in FORMATS:
        return FORMATS[file.suffix.lower()]
    with file.open("rb") as handle:
        return "parquet" if handle.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC else None


def _one_header(folder: Path, files: list[Path]) -> None:
    """Spark splits every CSV file of a folder by the first one's header: refuse a folder whose
    files have different ones (an empty file has none)."""
    headers: dict[tuple[str, ...], Path] = {}
    for file in files:
        with file.open(newline="", encoding="utf-8-sig", errors="replace") as handle:
            header = next(csv.reader(handle), None)
        if header is not None:
            headers.setdefault(tuple(name.lower() for name in header), file)
    if len(headers) > 1:
        (first, one), (second, other) = list(headers.items())[:2]
        raise ValueError(f"Cannot load {folder}: its CSV files must share one header, but {one.relative_to(folder)} "
                         f"has {','.join(first)} and {other.relative_to(folder)} has {','.join(second)}")


def _parquet_nanos(path: str | list[str]) -> list[str]:
    """The columns a Parquet export stores as nanosecond timestamps, from its footer (none when
    Arrow cannot open the path: the magnitude then tells the unit all the same)."""
    try:
        schema = ds.dataset(path, format="parquet").schema
    except (OSError, ValueError, pa.ArrowException):
        return []
    return [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.unit == "ns"]


def _canonical_names(frame: DataFrame) -> DataFrame:
    """Accept known columns in any letter case (warehouse exports often upper-case them)."""
    known = {name.lower(): name for name in SAMPLE_SCHEMA.fieldNames()}
    return frame.toDF(*(known.get(column.lower(), column) for column in frame.columns))


def _stored_schema(spark: SparkSession, table_uri: str) -> T.StructType | None:
    """The source table's schema, read from its log (None: no table yet)."""
    return spark.read.format("delta").load(table_uri).schema if stored_table(table_uri) is not None else None


@contextlib.contextmanager
def _session_conf(spark: SparkSession, values: dict[str, str]) -> Iterator[None]:
    saved = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)


# -- checking and typing: one pass over the export, before anything is written ------------------------


def _checked(
    frame: DataFrame, kind: str, path: str, units: dict[str, EpochUnit], unit: EpochUnit | None, window: Plausible,
    stored: T.StructType | None,
) -> tuple[DataFrame, dict[str, EpochUnit], int]:
    """The export typed as the contract (and the stored table) says, the epoch unit of each time
    column, and the rows without an event_id; or SourceSchemaError naming every problem. Records
    that do not parse are the one problem named when there are any: the others follow from them."""
    survey = _Survey(frame, window, stored)
    row = frame.agg(*survey.aggregates).first()
    malformed = survey.malformed(row, kind)
    if malformed:
        raise SourceSchemaError(f"nothing was loaded from {path}: {malformed}")
    decisions = [decide(survey.findings(column, row), window, units.get(column, unit)) for column in TIME_COLUMNS]
    chosen = {d.column: d.unit for d in decisions if d.unit is not None}
    problems = summarise(decisions) + survey.problems(row)
    if problems:
        raise SourceSchemaError(f"nothing was loaded from {path}: " + "; ".join(problems))
    return survey.typed(chosen), chosen, row["_blank_event_ids"]


class _Survey:
    """The aggregates of the one pass over an export, and what they mean."""

    def __init__(self, frame: DataFrame, window: Plausible, stored: T.StructType | None):
        self.frame, self.window = frame, window
        self.extras = [c for c in frame.columns if c not in SAMPLE_SCHEMA.fieldNames() and c not in (LOAD_DATE, MALFORMED)]
        self.typed_text = [  # known non-text, non-time columns that arrive as text
            f for f in SAMPLE_SCHEMA.fields if f.name in frame.columns and f.name not in TIME_COLUMNS
            and not isinstance(f.dataType, T.StringType) and self._kind(f.name) is T.StringType
        ]
        self.conflicts = {  # extra columns of another type than the stored table's: name -> stored type
            c: stored[c].dataType for c in self.extras
            if stored is not None and c in stored.fieldNames() and not _same_kind(stored[c].dataType, frame.schema[c].dataType)
        }
        low, high = window.seconds()
        self.low, self.high = (F.lit(int(b * 1_000_000)) for b in (low, high))  # the window in microseconds
        self.aggregates = [F.count_if(_blank(F.col("event_id"))).alias("_blank_event_ids"), *self._malformed_aggregates()]
        for column in TIME_COLUMNS:
            self.aggregates += self._time_aggregates(column)
        for f in self.typed_text:
            self.aggregates += _unreadable_aggregates(f.name, _text(f.name), f.dataType)
        for name, kind in self.conflicts.items():
            self.aggregates.append(F.count(_quoted(name)).alias(f"{name}__present"))
            if self._kind(name) is T.StringType:
                self.aggregates += _unreadable_aggregates(name, _text(name), kind)

    def _malformed_aggregates(self) -> list[Column]:
        if MALFORMED not in self.frame.columns:
            return []
        bad = F.col(MALFORMED).isNotNull()
        return [F.count_if(bad).alias("_malformed"),
                F.first(F.when(bad, F.col(MALFORMED)), ignorenulls=True).alias("_malformed_eg"),
                F.first(F.when(bad, F.col("_metadata.file_path")), ignorenulls=True).alias("_malformed_file")]

    def malformed(self, row, kind: str) -> str | None:
        """The records that do not parse: how many, where the first is, and how it begins."""
        if not row.asDict().get("_malformed"):
            return None
        record, uri = row["_malformed_eg"], row["_malformed_file"]
        file = unquote(urlsplit(uri).path) if uri.startswith("file:") else uri
        example = repr(record[:80]) + ("..." if len(record) > 80 else "")
        return f"{row['_malformed']} record(s) {NOT_PARSED[kind]}; the first in {file}: {example}"

    def _kind(self, column: str) -> type:
        return type(self.frame.schema[column].dataType)

    def _parts(self, column: str) -> tuple[Column | None, Column | None, Column | None]:
        """A time column as (epoch number, timestamp, unreadable text) expressions; None: none such."""
        kind, value = self.frame.schema[column].dataType, F.col(column)
        if isinstance(kind, T.StringType):
            text = F.trim(value)
            numeric = text.rlike(NUMBER_TEXT)
            stamp = F.when(~numeric, text.try_cast(T.TimestampType()))
            return F.when(numeric, text.try_cast(EPOCH)), stamp, ~_blank(value) & ~numeric & stamp.isNull()
        if isinstance(kind, NUMERIC):
            return value.cast(EPOCH), None, None
        if isinstance(kind, (T.TimestampType, T.TimestampNTZType, T.DateType)):
            return None, value.cast(T.TimestampType()), None  # naive values are UTC: the session's zone
        if isinstance(kind, T.NullType):
            return None, None, None
        return None, None, value.isNotNull()  # a struct, a boolean...: not a time

    def _time_aggregates(self, column: str) -> list[Column]:
        number, stamp, unreadable = self._parts(column)
        aggregates = []
        if number is not None:
            aggregates += [F.count(number).alias(f"{column}__numbers"), F.min(number).alias(f"{column}__low"),
                           F.max(number).alias(f"{column}__high")]
            for unit in EpochUnit:
                low, high = self.window.bounds(unit)
                outside = (number < F.lit(low)) | (number >= F.lit(high))
                aggregates += [F.count_if(outside).alias(f"{column}__out_{unit.value}"),
                               F.first(F.when(outside, number), ignorenulls=True).alias(f"{column}__eg_{unit.value}")]
        if stamp is not None:
            micros = F.unix_micros(stamp)
            outside = (micros < self.low) | (micros >= self.high)
            aggregates += [F.count(stamp).alias(f"{column}__stamps"), F.count_if(outside).alias(f"{column}__stamps_out"),
                           F.first(F.when(outside, micros), ignorenulls=True).alias(f"{column}__stamp_eg")]
        if unreadable is not None:
            aggregates += [F.count_if(unreadable).alias(f"{column}__unreadable"),
                           F.first(F.when(unreadable, F.col(column).cast("string")), ignorenulls=True).alias(f"{column}__bad")]
        return aggregates

    def findings(self, column: str, row) -> Findings:
        values = row.asDict()
        get = lambda key, default=None: values.get(f"{column}__{key}", default)  # noqa: E731
        example = get("stamp_eg")
        return Findings(
            column,
            numbers=get("numbers", 0), low=get("low"), high=get("high"),
            outside={unit: (get(f"out_{unit.value}", 0), get(f"eg_{unit.value}")) for unit in EpochUnit},
            stamps=get("stamps", 0), stamps_outside=get("stamps_out", 0),
            stamp_example=None if example is None else Decimal(example) / 1_000_000,
            unreadable=get("unreadable", 0), unreadable_example=get("bad"),
        )

    def problems(self, row) -> list[str]:
        """Known columns that do not read as their type, and extra columns that conflict with the table's."""
        found = [
            f"{f.name} holds {row[f'{f.name}__bad']!r}" for f in self.typed_text if row[f"{f.name}__unreadable"]
        ]
        for name, kind in self.conflicts.items():
            if not row[f"{name}__present"] or self._widens(name, kind):
                continue
            if self._kind(name) is T.StringType and not row[f"{name}__unreadable"]:
                continue
            found.append(
                f"column {name} is {self.frame.schema[name].dataType.simpleString()} here but {kind.simpleString()} in "
                "the source table: cast it in the export, rename it, or load with --mode replace"
            )
        return [f"values not of their column's type: {'; '.join(found)}"] if found else []

    def _widens(self, name: str, stored: T.DataType) -> bool:
        """A lossless cast to the stored type: a wider number, or any value as text."""
        kind = self.frame.schema[name].dataType
        if isinstance(stored, T.StringType):
            return not isinstance(kind, (T.StructType, T.ArrayType, T.MapType))
        if isinstance(kind, INTEGRAL) and isinstance(stored, (T.LongType, T.DecimalType, T.DoubleType)):
            return True
        return isinstance(kind, T.FloatType) and isinstance(stored, T.DoubleType)

    def typed(self, units: dict[str, EpochUnit]) -> DataFrame:
        """Known columns as the contract types them (known ones first), extras as they are or as the
        stored table has them; load_date from load_tstamp."""
        known = [f for f in SAMPLE_SCHEMA.fields if f.name in self.frame.columns]
        columns = []
        for f in known:
            if f.name in TIME_COLUMNS:
                columns.append(self._time(f.name, units.get(f.name)).alias(f.name))
            else:
                columns.append(_typed(self.frame, f.name, f.dataType).alias(f.name))
        for name in self.extras:
            kind = self.conflicts.get(name)
            columns.append(F.col(_quoted(name)) if kind is None else _typed(self.frame, name, kind).alias(name))
        return self.frame.select(*columns).withColumn(LOAD_DATE, F.to_date("load_tstamp"))

    def _time(self, column: str, unit: EpochUnit | None) -> Column:
        number, stamp, _ = self._parts(column)
        epoch = None if number is None or unit is None else F.timestamp_micros(F.floor(number * F.lit(unit.micros)).cast("long"))
        if epoch is not None and stamp is not None:
            return F.coalesce(epoch, stamp)
        return epoch if epoch is not None else stamp if stamp is not None else F.lit(None).cast(T.TimestampType())


def _same_kind(stored: T.DataType, kind: T.DataType) -> bool:
    """Types an append merges without a conflict (Delta adds a struct's new fields itself)."""
    return stored == kind or (isinstance(stored, T.StructType) and isinstance(kind, T.StructType))


def _blank(value: Column) -> Column:
    return value.isNull() | (F.trim(value.cast("string")) == "")


def _text(column: str) -> Column:
    return F.col(_quoted(column))


def _unreadable_aggregates(name: str, value: Column, kind: T.DataType) -> list[Column]:
    bad = ~_blank(value) & value.try_cast(kind).isNull()
    return [F.count_if(bad).alias(f"{name}__unreadable"), F.first(F.when(bad, value), ignorenulls=True).alias(f"{name}__bad")]


def _typed(frame: DataFrame, column: str, kind: T.DataType) -> Column:
    """A column cast to `kind`; blank text in a typed column is null (exports write nulls that way)."""
    value = F.col(_quoted(column))
    if isinstance(frame.schema[column].dataType, T.StringType) and not isinstance(kind, T.StringType):
        value = F.when(F.trim(value) != "", value)
    return value.cast(kind)


def _quoted(column: str) -> str:
    """A column reference that takes dots and spaces in the name literally."""
    return "`" + column.replace("`", "``") + "`"


# -- counting: the rows as the next run will see them ----------------------------------------------------


SPARK_TESTS = {
    "null": lambda ts: ts.isNull(),
    "<": lambda ts, bound: ts < F.lit(bound),
    ">": lambda ts, bound: ts > F.lit(bound),
    "within": lambda ts, low, high: ts.between(F.lit(low), F.lit(high)),
}


def _arrival(ts: Column, bounds: ArrivalBounds) -> Column:
    """The arrival rule (logic.arrivals) over a Spark column: the first test that holds wins."""
    chosen = F.lit(Arrival.PENDING.value)
    for arrival, test, moments in reversed(bounds.rule()):
        chosen = F.when(SPARK_TESTS[test](ts, *moments), arrival.value).otherwise(chosen)
    return chosen


def _counted(typed: DataFrame, bounds: ArrivalBounds | None, cursor: str) -> dict:
    """Rows, load days, and the rows of each arrival class (one pass over the typed export)."""
    ts = F.col(cursor)
    arrival = _arrival(ts, bounds) if bounds is not None else F.lit(None)
    behind = arrival == Arrival.BEHIND.value
    return typed.agg(
        F.count(F.lit(1)).alias("rows"), F.min(LOAD_DATE).alias("first_day"), F.max(LOAD_DATE).alias("last_day"),
        F.count_distinct(LOAD_DATE).alias("days"),
        *[F.count_if(arrival == a.value).alias(a.value) for a in Arrival],
        F.min(F.when(behind, ts)).alias("behind_from"), F.max(F.when(behind, ts)).alias("behind_to"),
    ).first().asDict()


def _arrivals(counted: dict) -> Arrivals:
    return Arrivals({a: counted[a.value] for a in Arrival if counted[a.value]}, counted["behind_from"], counted["behind_to"])
