"""How an asset's table is written: its write mode, keys, partitioning and statistics, declared in
the asset's definition metadata (`delta_table(...)`); the time window a partitioned write
replaces; and the values an asset hands over and a step loads back (`Rows`, `Stored`). The
contract between assets and the IO manager: no asset imports the IO manager."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time
from enum import Enum
from functools import cached_property
from typing import Any, Callable, Mapping

from dagster import MetadataValue
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.utc import naive


class WriteMode(str, Enum):
    REPLACE = "replace"
    APPEND = "append"
    MERGE_INSERT = "merge_insert"
    UPSERT = "upsert"
    REPLACE_PARTITION = "replace_partition"
    APPLY_CHANGES = "apply_changes"


# The column of an apply_changes write that says a row deletes the stored row with its keys.
DELETED = "_deleted"

# Every table the project creates checkpoints its log every ten commits. Most commits here are
# deltalake's, whose default is a hundred: each open of a table (a run opens its tables about 120
# times, benchmarks/log_opens.py) read up to 99 commit files after the last checkpoint, a cost that
# grew with history and was one request each on an object store.
LOG_CHECKPOINTS = {"delta.checkpointInterval": "10"}


class DeltaWriteError(ValueError):
    """A write that would lose or corrupt data, refused before anything is written."""


@dataclass(frozen=True)
class Window:
    """A half-open time range [start, end) over one date or timestamp column."""

    column: str
    start: datetime
    end: datetime

    def condition(self, kind: T.DataType) -> Column:
        start, end = self.bounds(kind)
        return (F.col(self.column) >= F.lit(start)) & (F.col(self.column) < F.lit(end))

    def predicate(self, kind: T.DataType, quote: str = "`") -> str:
        """The same range as SQL text for `replaceWhere` (deltalake's predicate quotes its names
        with `"`); the values are ours, never user input."""
        start, end = (value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat() for value in self.bounds(kind))
        name = f"{quote}{self.column}{quote}"
        return f"{name} >= '{start}' AND {name} < '{end}'"

    def contains(self, value: date | datetime) -> bool:
        moment = value if isinstance(value, datetime) else datetime.combine(value, time.min)
        return naive(self.start) <= moment < naive(self.end)

    def bounds(self, kind: T.DataType) -> tuple[date | datetime, date | datetime]:
        start, end = naive(self.start), naive(self.end)
        if isinstance(kind, T.DateType):
            return start.date(), end.date()
        return start, end


METADATA_KEY = "delta_table"


def delta_table(
    write_mode: str,
    keys: list[str] | None = None,
    partition_by: list[str] | None = None,
    partition_column: str | None = None,
    change_feed: bool = False,
    stats_columns: list[str] | None = None,
    one_row_per_key: bool = False,
) -> dict[str, Any]:
    """Asset metadata that tells the Delta IO manager how to write the asset.

    Modes: `replace` (whole table), `append`, `merge_insert` (insert rows whose keys are new; never
    overwrite), `upsert` (update or insert on keys), `replace_partition` (a `replaceWhere` on the
    run's partition time window of `partition_column`; a multi-day backfill writes once),
    `apply_changes` (rows that change the table on keys: one whose `DELETED` column is true deletes
    the stored row with its keys, the others are upserted; the rows are the changes, not the table).
    `stats_columns`: the columns Delta keeps min/max statistics of, for data skipping; [] for none
    (a table always read whole); None keeps Delta's default (the first 32). Collecting them costs
    about a third of a write here, so a table gets the ones its readers filter by. Set when the
    table is created. `one_row_per_key`: the asset's rows are unique on `keys` by construction (a
    dedupe or a group-by on them), so a MERGE does not shuffle them again to check; its asset check
    still does, on what was stored. `change_feed`: the table records the rows each commit inserted.
    """
    spec = TableSpec(
        WriteMode(write_mode), tuple(keys or ()), tuple(partition_by or ()), partition_column, change_feed,
        tuple(stats_columns) if stats_columns is not None else None, one_row_per_key,
    )
    spec.validate()
    return {METADATA_KEY: spec.as_metadata()}


@dataclass(frozen=True)
class TableSpec:
    write_mode: WriteMode
    keys: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    partition_column: str | None = None
    change_feed: bool = False  # record the change data feed (the rows each MERGE inserted)
    stats_columns: tuple[str, ...] | None = None  # min/max statistics kept for data skipping
    one_row_per_key: bool = False  # rows unique on keys by construction: a MERGE does not check

    def table_properties(self, columns: list[str]) -> dict[str, str]:
        """Delta table properties for a table of `columns` (a stats column the data lacks is left out)."""
        if self.stats_columns is None:
            return dict(LOG_CHECKPOINTS)
        kept = [column for column in self.stats_columns if column in columns]
        if not kept:
            return {**LOG_CHECKPOINTS, "delta.dataSkippingNumIndexedCols": "0"}
        return {**LOG_CHECKPOINTS, "delta.dataSkippingStatsColumns": ",".join(kept)}

    def validate(self) -> None:
        if self.write_mode in (WriteMode.MERGE_INSERT, WriteMode.UPSERT, WriteMode.APPLY_CHANGES) and not self.keys:
            raise DeltaWriteError(f"write mode {self.write_mode.value} needs key columns")
        if self.write_mode is WriteMode.REPLACE_PARTITION and not self.partition_column:
            raise DeltaWriteError("write mode replace_partition needs partition_column")

    def as_metadata(self) -> dict[str, Any]:
        return {
            "write_mode": self.write_mode.value,
            "keys": list(self.keys),
            "partition_by": list(self.partition_by),
            "partition_column": self.partition_column,
            "change_feed": self.change_feed,
            "stats_columns": list(self.stats_columns) if self.stats_columns is not None else None,
            "one_row_per_key": self.one_row_per_key,
        }

    @classmethod
    def of(cls, definition_metadata: Mapping[str, Any]) -> "TableSpec":
        """The declared spec; an ordinary asset, which declares none, has a table replaced whole."""
        raw = definition_metadata.get(METADATA_KEY)
        if raw is None:
            return cls(WriteMode.REPLACE)
        raw = raw.value if isinstance(raw, MetadataValue) else raw
        return cls(
            WriteMode(raw["write_mode"]),
            tuple(raw.get("keys") or ()),
            tuple(raw.get("partition_by") or ()),
            raw.get("partition_column"),
            bool(raw.get("change_feed")),
            tuple(raw["stats_columns"]) if raw.get("stats_columns") is not None else None,
            bool(raw.get("one_row_per_key")),
        )


def partition_window(column: str, time_window) -> Window:
    return Window(column=column, start=time_window.start, end=time_window.end)


# Shown with a write that read the target from a partition on (and read by the checks that
# follow it, which look no further back than it did).
MERGE_FLOOR = "merge_target_floor"


@dataclass(frozen=True)
class Rows:
    """What an asset hands the IO manager for its table this run: its rows (None: nothing to write,
    the table stays as it is), and how to write them this run: the first partition a MERGE must
    read, a bound on their number (a small MERGE runs in deltalake), the run whose window they
    belong to (a re-run of it writes them once: a Delta transaction identifier), a note for
    this run's next steps, stored with the table (they load it as `Stored`), and a marker kept in
    the write's own commit (its userMetadata: lib/delta/log.latest_marker reads it back), which
    says what the rows were computed from."""

    frame: DataFrame | None
    merge_floor: date | None = None
    rows_at_most: int | None = None
    decided_by: str | None = None
    note: Mapping[str, Any] | None = None
    marker: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Stored:
    """A table as a step of this run left it, with the note that step stored with it (None: none).
    Its rows are read when the step first asks for them: a step with nothing to do starts no JVM."""

    read: Callable[[], DataFrame]
    note: Mapping[str, Any] | None = None

    @cached_property
    def frame(self) -> DataFrame:
        return self.read()
