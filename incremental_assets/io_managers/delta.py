"""Delta IO manager: the one writer of every asset table, in the write mode each asset declares.

Declare it with `delta_table(...)` in the asset's metadata:

    @asset(metadata=delta_table("upsert", keys=["session_identifier"]))
    @asset(partitions_def=daily, metadata=delta_table("replace_partition", partition_column="event_date"))

Modes: `replace` (whole table), `append`, `merge_insert` (insert rows whose keys are new; never
overwrite), `upsert` (update or insert on keys), `replace_partition` (a `replaceWhere` on the
run's partition time window; a multi-day backfill writes once).

Besides DataFrames it stores a run's state, which later steps of the same run receive as inputs:
`RunPlan` (a row per run) and `RunBatch` (the scratch table, its stats in the materialization
metadata). Such an input is loaded only from this run, or the run it re-executes; otherwise the
step is refused with the job to use. Writes of a run are keyed by a Delta transaction identifier
of the run that decided its limits, so re-executing a step whose write committed changes nothing.

After a write commits, the state that depends on it moves, through the manifest resource: an
incremental asset's manifest row (`progress=incremental`), or the days a daily run recomputed
(`progress=daily`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from enum import Enum
from typing import Any, Mapping

from dagster import (
    AssetKey,
    ConfigurableIOManager,
    Failure,
    InputContext,
    MetadataValue,
    OutputContext,
    TableColumn,
    TableSchema,
    TimeWindowPartitionsDefinition,
)
from dagster._core.events.log import EventLogEntry
from pydantic import Field
from pyspark.sql import DataFrame

from incremental_assets import delta_tables, previews
from incremental_assets.delta_tables import DeltaWriteError, Txn, Window, WriteMode
from incremental_assets.environment import table_uri, warehouse_root
from incremental_assets.logic.limits import Cursor
from incremental_assets.names import EVENTS_THIS_RUN, INCREMENTAL_JOB, NEW_EVENT_LIMITS
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.run_log import as_markdown
from incremental_assets.run_state import (
    RunBatch,
    RunPlan,
    arrivals_metadata,
    batch_from_metadata,
    batch_metadata,
    limits_metadata,
    materialization_metadata,
    plan_from_row,
    plan_table,
    stats_from_metadata,
)

METADATA_KEY = "delta_table"
# Output metadata an asset may attach to steer its write (shown in the UI as well):
MERGE_TARGET_FLOOR = "merge_target_floor"  # ISO date: a MERGE reads only target rows with partition >= it
EVENTS_PER_DAY = "events_per_day"  # {day: events} of a progress=daily write, recorded as processed
ROWS_AT_MOST = "rows_at_most"  # a bound on the rows returned: a small MERGE runs in deltalake, no Spark job


class Progress(str, Enum):
    INCREMENTAL = "incremental"  # the asset's incremental_manifest row advances after each commit
    DAILY = "daily"  # the days a partition run wrote are marked processed in the daily manifest


def delta_table(
    write_mode: str,
    keys: list[str] | None = None,
    partition_by: list[str] | None = None,
    partition_column: str | None = None,
    progress: str | None = None,
    change_feed: bool = False,
    stats_columns: list[str] | None = None,
    one_row_per_key: bool = False,
) -> dict[str, Any]:
    """Asset metadata that tells the Delta IO manager how to write the asset.

    `stats_columns`: the columns Delta keeps min/max statistics of, for data skipping; [] for none
    (a table always read whole); None keeps Delta's default (the first 32). Collecting them costs
    about a third of a write here, so a table gets the ones its readers filter by. Set when the
    table is created. `one_row_per_key`: the asset's rows are unique on `keys` by construction (a
    dedupe or a group-by on them), so a MERGE does not shuffle them again to check; its asset check
    still does, on what was stored.
    """
    spec = TableSpec(
        WriteMode(write_mode), tuple(keys or ()), tuple(partition_by or ()), partition_column,
        Progress(progress) if progress else None, change_feed,
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
    progress: Progress | None = None
    change_feed: bool = False  # record the change data feed (the rows each MERGE inserted)
    stats_columns: tuple[str, ...] | None = None  # min/max statistics kept for data skipping
    one_row_per_key: bool = False  # rows unique on keys by construction: a MERGE does not check

    def table_properties(self, columns: list[str]) -> dict[str, str]:
        """Delta table properties for a table of `columns` (a stats column the data lacks is left out)."""
        if self.stats_columns is None:
            return {}
        kept = [column for column in self.stats_columns if column in columns]
        if not kept:
            return {"delta.dataSkippingNumIndexedCols": "0"}
        return {"delta.dataSkippingStatsColumns": ",".join(kept)}

    def validate(self) -> None:
        if self.write_mode in (WriteMode.MERGE_INSERT, WriteMode.UPSERT) and not self.keys:
            raise DeltaWriteError(f"write mode {self.write_mode.value} needs key columns")
        if self.write_mode is WriteMode.REPLACE_PARTITION and not self.partition_column:
            raise DeltaWriteError("write mode replace_partition needs partition_column")
        if self.progress is Progress.DAILY and self.write_mode is not WriteMode.REPLACE_PARTITION:
            raise DeltaWriteError("progress=daily needs write mode replace_partition")

    def as_metadata(self) -> dict[str, Any]:
        return {
            "write_mode": self.write_mode.value,
            "keys": list(self.keys),
            "partition_by": list(self.partition_by),
            "partition_column": self.partition_column,
            "progress": self.progress.value if self.progress else None,
            "change_feed": self.change_feed,
            "stats_columns": list(self.stats_columns) if self.stats_columns is not None else None,
            "one_row_per_key": self.one_row_per_key,
        }

    @classmethod
    def of(cls, definition_metadata: Mapping[str, Any], asset: str) -> "TableSpec":
        raw = definition_metadata.get(METADATA_KEY)
        if raw is None:
            raise DeltaWriteError(f"Asset {asset} has no '{METADATA_KEY}' metadata: declare it with delta_table(...)")
        raw = raw.value if isinstance(raw, MetadataValue) else raw
        return cls(
            WriteMode(raw["write_mode"]),
            tuple(raw.get("keys") or ()),
            tuple(raw.get("partition_by") or ()),
            raw.get("partition_column"),
            Progress(raw["progress"]) if raw.get("progress") else None,
            bool(raw.get("change_feed")),
            tuple(raw["stats_columns"]) if raw.get("stats_columns") is not None else None,
            bool(raw.get("one_row_per_key")),
        )


class DeltaIOManager(ConfigurableIOManager):
    """Stores each asset as the Delta table `<warehouse_root>/<asset name>`."""

    spark: SparkResource
    manifest: ManifestResource
    warehouse_root: str | None = Field(
        default=None, description="Warehouse root; default INCREMENTAL_ASSETS_WAREHOUSE or ./warehouse"
    )

    def uri(self, asset_name: str) -> str:
        return table_uri(asset_name, self.warehouse_root or warehouse_root())

    # -- writing --------------------------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: DataFrame | RunPlan | RunBatch | None) -> None:
        name = context.asset_key.path[-1]
        uri = self.uri(name)
        spec = TableSpec.of(context.definition_metadata, name)
        cursor = self._cursor(context, name) if spec.progress is Progress.INCREMENTAL else None
        if cursor is not None and cursor.ahead:
            context.log.info(f"{name} is already at {cursor.entry.position}, past this run's upper limit: nothing to do")
            context.add_output_metadata({"skipped": "already ahead of this run's window"})
            return
        if isinstance(obj, RunPlan):
            self._write_run_record(context, spec, obj, uri)
            return
        if isinstance(obj, RunBatch):
            self._write_batch(context, spec, obj, uri)
        elif obj is None:
            context.add_output_metadata({"written": False, "table_uri": MetadataValue.path(uri)})
        else:
            self._write(context, spec, obj, uri)
        if cursor is not None:
            self._advance(context, cursor)
        if spec.progress is Progress.DAILY:
            per_day = _value(context.output_metadata.get(EVENTS_PER_DAY)) or {}
            days = [date.fromisoformat(key) for key in context.asset_partition_keys]
            self.manifest.mark_processed(days, {date.fromisoformat(d): n for d, n in per_day.items()}, context.run_id)
        context.add_output_metadata({
            "run_log": as_markdown(self.manifest.appended_here(context.run_id)), **self._fingerprint(name),
        })

    def _fingerprint(self, table: str) -> dict[str, Any]:
        """What the table was built under (its fingerprint's digest, since when): for people."""
        stored = self.manifest.fingerprints().get(table)
        if stored is None:
            return {}
        shown = {"fingerprint": stored.fingerprint.digest, "fingerprint_since": str(stored.since)}
        if stored.effective_from is not None:
            shown["fingerprint_effective_from"] = str(stored.effective_from)
        return shown

    def _write_run_record(self, context: OutputContext, spec: TableSpec, plan: RunPlan, uri: str) -> None:
        """The run's plan, one row appended with deltalake: no Spark job for a row per run."""
        if spec.write_mode is not WriteMode.APPEND:
            raise DeltaWriteError(f"{uri} keeps one row per run: declare write mode append")
        rows = plan_table(plan, context.run_id)
        result = delta_tables.append_rows(uri, rows, Txn(f"run-{context.run_id}"))
        columns = [TableColumn(f.name, str(f.type)) for f in rows.schema]
        context.add_output_metadata({
            **limits_metadata(plan.limits), **arrivals_metadata(plan), **write_metadata(columns, uri, result),
            "dagster/row_count": previews.row_count(uri),
        })

    def _write_batch(self, context: OutputContext, spec: TableSpec, batch: RunBatch, uri: str) -> None:
        """The scratch table, then what the batch found, as its write counted it (see RunBatch)."""
        result = self._write(context, spec, batch.events, uri, known_empty=batch.known_empty)
        spark = batch.events.sparkSession
        counted = batch.counted(written=not result.skipped, stored=lambda: delta_tables.read_table(spark, uri))
        context.add_output_metadata(batch_metadata(counted))

    def _write(
        self, context: OutputContext, spec: TableSpec, frame: DataFrame, uri: str, known_empty: bool = False
    ) -> delta_tables.WriteResult:
        spark = frame.sparkSession
        window = self._output_window(context, spec, uri)
        properties = spec.table_properties(frame.columns)
        if spec.change_feed:
            delta_tables.create_with_change_feed(spark, uri, frame.schema, spec.partition_by, properties)
        floor = _value(context.output_metadata.get(MERGE_TARGET_FLOOR))
        merge_floor = (spec.partition_by[0], date.fromisoformat(floor)) if floor and spec.partition_by else None
        txn = self._txn(context)
        result = delta_tables.write(
            spark, frame, uri, spec.write_mode, spec.keys, spec.partition_by, window, merge_floor, txn=txn,
            known_empty=known_empty, properties=properties, rows_at_most=_value(context.output_metadata.get(ROWS_AT_MOST)),
            one_row_per_key=spec.one_row_per_key,
        )
        if frame.is_cached:  # cached by its asset for the stats it computed; written now
            frame.unpersist()
        if result.skipped:
            context.log.info(f"{uri}: this run's write is already committed (Delta transaction {txn.app_id})")
        columns = [TableColumn(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
        context.add_output_metadata(write_metadata(columns, uri, result))
        if window is not None:
            self._record_partition_counts(context, spark, uri, window)
        elif not context.has_asset_partitions:
            context.add_output_metadata({"dagster/row_count": previews.row_count(uri)})
        return result

    def _txn(self, context: OutputContext) -> Txn | None:
        """Writes of the incremental job are keyed by the run that decided the window, so a re-executed
        step does not write again; other writes (daily partitions) are idempotent by their mode."""
        limits = self._materialized_in_this_run(context, NEW_EVENT_LIMITS)
        return Txn(f"run-{limits.run_id}") if limits is not None else None

    def _cursor(self, context: OutputContext, name: str) -> Cursor:
        batch = stats_from_metadata(materialization_metadata(self._required_from_this_run(context, EVENTS_THIS_RUN).asset_materialization))
        return Cursor(name, self.manifest.entries().get(name), batch)

    def _advance(self, context: OutputContext, cursor: Cursor) -> None:
        """Right after the write committed: Snowplow's end-of-run manifest update, one asset at a time."""
        entry = self.manifest.advance(cursor, context.run_id)
        if entry is None:
            context.add_output_metadata({"manifest": "not moved: explicit window (keyhole backfill)"})
            return
        context.add_output_metadata({"manifest_position": str(entry.position)})
        if entry.last_upper is not None and entry.last_upper != (cursor.entry and cursor.entry.last_upper):
            limits = cursor.batch.limits
            context.log.warning(
                f"No new eligible event between {limits.lower} and {limits.upper}: "
                f"{cursor.model} resumes from {entry.last_upper} next run"
            )
            context.add_output_metadata({"resumes_past_gap_from": str(entry.last_upper)})

    # -- reading --------------------------------------------------------------------------
    def load_input(self, context: InputContext) -> DataFrame | RunPlan | RunBatch:
        name = context.asset_key.path[-1]
        uri = self.uri(name)
        kind = context.dagster_type.typing_type
        if kind is RunPlan:
            run_id = self._required_from_this_run(context, name).run_id
            [row] = previews.read_rows(uri, filters=[("run_id", "=", run_id)])
            return plan_from_row(row)
        spark = self.spark.spark_session
        if kind is RunBatch:
            metadata = materialization_metadata(self._required_from_this_run(context, name).asset_materialization)
            return batch_from_metadata(delta_tables.read_table(spark, uri), metadata)
        df = delta_tables.read_table(spark, uri)
        if not context.has_asset_partitions:
            return df
        upstream = context.upstream_output
        spec = TableSpec.of(upstream.definition_metadata if upstream else {}, name)
        if spec.partition_column is None:
            return df
        window = partition_window(spec.partition_column, context.asset_partitions_time_window)
        return df.where(window.condition(_partition_kind(df, spec.partition_column, uri)))

    # -- run state belongs to its run ---------------------------------------------------------
    def _materialized_in_this_run(self, context: InputContext | OutputContext, asset: str) -> EventLogEntry | None:
        """The materialization of `asset` by this run, or by a run this one re-executes."""
        instance = context.step_context.instance
        event = instance.get_latest_materialization_event(AssetKey(asset))
        return event if event is not None and event.run_id in _lineage(instance, context.step_context.run_id) else None

    def _required_from_this_run(self, context: InputContext | OutputContext, asset: str) -> EventLogEntry:
        event = self._materialized_in_this_run(context, asset)
        if event is None:
            raise Failure(
                f"{context.step_context.step.key} consumes the {asset} of its own run, and this run has none: "
                f"materialize it with the job '{INCREMENTAL_JOB}' (or select it together with the whole base "
                f"chain: new_event_limits, sessions_lifecycle_manifest, quarantined_sessions, events_this_run)."
            )
        return event

    # -- partitions --------------------------------------------------------------------------
    def _output_window(self, context: OutputContext, spec: TableSpec, uri: str) -> Window | None:
        partitioned = context.has_asset_partitions
        if spec.write_mode is WriteMode.REPLACE_PARTITION:
            if not partitioned:
                raise DeltaWriteError(f"replace_partition into {uri} needs a partitioned asset")
            return partition_window(spec.partition_column, context.asset_partitions_time_window)
        if spec.write_mode is WriteMode.REPLACE and partitioned:
            raise DeltaWriteError(
                f"Refusing to overwrite all of {uri} from a partitioned run: declare write mode "
                "replace_partition with a partition_column so only the run's window is replaced"
            )
        return None

    def _record_partition_counts(self, context: OutputContext, spark, uri: str, window: Window) -> None:
        """Each partition of a range write gets its own row count, not the range total."""
        counts = partition_row_counts(spark, uri, window, context.asset_partitions_def, context.asset_partition_keys)
        for key, rows in counts.items():
            if len(counts) == 1:
                context.add_output_metadata({"dagster/row_count": rows})
            else:
                context.step_context.add_asset_metadata(
                    {"dagster/row_count": rows}, asset_key=context.asset_key, partition_key=key
                )
        context.add_output_metadata({"partitions_written": len(counts)})


def _lineage(instance, run_id: str) -> set[str]:
    """This run and the runs it re-executes (whose step outputs it reuses)."""
    lineage: set[str] = set()
    while run_id and run_id not in lineage:
        lineage.add(run_id)
        run = instance.get_run_by_id(run_id)
        run_id = run.parent_run_id if run else None
    return lineage


def _value(metadata_value: Any) -> Any:
    return metadata_value.value if isinstance(metadata_value, MetadataValue) else metadata_value


def partition_row_counts(spark, uri: str, window: Window, partitions_def, keys) -> dict[str, int]:
    """Rows of the table in each time partition `keys` of `window`, from one grouped read."""
    if not isinstance(partitions_def, TimeWindowPartitionsDefinition):
        raise DeltaWriteError(f"replace_partition into {uri} needs time-window partitions")
    counts = delta_tables.count_by(spark, uri, window.column, window)
    per_key = {}
    for key in keys:
        key_window = partition_window(window.column, partitions_def.time_window_for_partition_key(key))
        per_key[key] = sum(n for value, n in counts.items() if key_window.contains(value))
    return per_key


def write_metadata(columns: list[TableColumn], uri: str, result: delta_tables.WriteResult) -> dict[str, Any]:
    """What a write did: Delta operation metrics, version, table path, schema."""
    return {
        "write_mode_operation": result.operation,
        "rows_inserted": result.rows_inserted,
        "rows_updated": result.rows_updated,
        "rows_deleted": result.rows_deleted,
        "delta_version": result.version,
        "table_uri": MetadataValue.path(uri),
        "dagster/uri": uri,
        "dagster/column_schema": TableSchema(columns=columns),
    }


def partition_window(column: str, time_window) -> Window:
    return Window(column=column, start=time_window.start, end=time_window.end)


def _partition_kind(df: DataFrame, column: str, uri: str):
    if column not in df.columns:
        raise DeltaWriteError(f"{uri} has no partition column '{column}'")
    return delta_tables.partition_kind(df, column, uri)
