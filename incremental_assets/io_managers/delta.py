"""Delta IO manager: each asset declares how its Spark DataFrame is written (its write mode).

Declare it with `delta_table(...)` in the asset's metadata:

    @asset(metadata=delta_table("upsert", keys=["session_identifier"]))
    @asset(partitions_def=daily, metadata=delta_table("replace_partition", partition_column="event_date"))

Modes: `replace` (whole table), `append`, `merge_insert` (insert rows whose keys are new; never
overwrite), `upsert` (update or insert on keys), `replace_partition` (a `replaceWhere` on the
run's partition time window; a multi-day backfill writes once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dagster import (
    ConfigurableIOManager,
    InputContext,
    MetadataValue,
    OutputContext,
    TableColumn,
    TableSchema,
    TimeWindowPartitionsDefinition,
)
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession

from incremental_assets import delta_tables
from incremental_assets.delta_tables import DeltaWriteError, Window, WriteMode
from incremental_assets.environment import table_uri, warehouse_root
from incremental_assets.resources.spark import build_spark_session

METADATA_KEY = "delta_table"


def delta_table(
    write_mode: str,
    keys: list[str] | None = None,
    partition_by: list[str] | None = None,
    partition_column: str | None = None,
) -> dict[str, Any]:
    """Asset metadata that tells the Delta IO manager how to write the asset."""
    spec = TableSpec(WriteMode(write_mode), tuple(keys or ()), tuple(partition_by or ()), partition_column)
    spec.validate()
    return {METADATA_KEY: spec.as_metadata()}


@dataclass(frozen=True)
class TableSpec:
    write_mode: WriteMode
    keys: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    partition_column: str | None = None

    def validate(self) -> None:
        if self.write_mode in (WriteMode.MERGE_INSERT, WriteMode.UPSERT) and not self.keys:
            raise DeltaWriteError(f"write mode {self.write_mode.value} needs key columns")
        if self.write_mode is WriteMode.REPLACE_PARTITION and not self.partition_column:
            raise DeltaWriteError("write mode replace_partition needs partition_column")

    def as_metadata(self) -> dict[str, Any]:
        return {
            "write_mode": self.write_mode.value,
            "keys": list(self.keys),
            "partition_by": list(self.partition_by),
            "partition_column": self.partition_column,
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
        )


class DeltaIOManager(ConfigurableIOManager):
    """Stores each asset as the Delta table `<warehouse_root>/<asset name>`."""

    warehouse_root: str | None = Field(
        default=None, description="Warehouse root; default INCREMENTAL_ASSETS_WAREHOUSE or ./warehouse"
    )

    def uri(self, asset_name: str) -> str:
        return table_uri(asset_name, self.warehouse_root or warehouse_root())

    def handle_output(self, context: OutputContext, obj: DataFrame | None) -> None:
        name = context.asset_key.path[-1]
        uri = self.uri(name)
        if obj is None:
            context.log.info(f"{name}: nothing to write this run; {uri} left as it was")
            context.add_output_metadata({"written": False, "table_uri": MetadataValue.path(uri)})
            return
        spec = TableSpec.of(context.definition_metadata, name)
        window = self._output_window(context, spec, uri)
        result = delta_tables.write(
            obj.sparkSession, obj, uri, spec.write_mode, spec.keys, spec.partition_by, window
        )
        context.add_output_metadata(write_metadata(obj, uri, result))
        if window is not None:
            self._record_partition_counts(context, obj.sparkSession, uri, window)
        elif not context.has_asset_partitions:
            context.add_output_metadata({"dagster/row_count": delta_tables.row_count(obj.sparkSession, uri)})

    def load_input(self, context: InputContext) -> DataFrame:
        name = context.asset_key.path[-1]
        uri = self.uri(name)
        spark = SparkSession.getActiveSession() or build_spark_session()
        df = delta_tables.read_table(spark, uri)
        if not context.has_asset_partitions:
            return df
        upstream = context.upstream_output
        spec = TableSpec.of(upstream.definition_metadata if upstream else {}, name)
        if spec.partition_column is None:
            return df
        window = partition_window(spec.partition_column, context.asset_partitions_time_window)
        return df.where(window.condition(_partition_kind(df, spec.partition_column, uri)))

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

    def _record_partition_counts(self, context: OutputContext, spark: SparkSession, uri: str, window: Window) -> None:
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


def partition_row_counts(spark: SparkSession, uri: str, window: Window, partitions_def, keys) -> dict[str, int]:
    """Rows of the table in each time partition `keys` of `window`, from one grouped read."""
    if not isinstance(partitions_def, TimeWindowPartitionsDefinition):
        raise DeltaWriteError(f"replace_partition into {uri} needs time-window partitions")
    counts = delta_tables.count_by(spark, uri, window.column, window)
    per_key = {}
    for key in keys:
        key_window = partition_window(window.column, partitions_def.time_window_for_partition_key(key))
        per_key[key] = sum(n for value, n in counts.items() if key_window.contains(value))
    return per_key


def write_metadata(df: DataFrame, uri: str, result: delta_tables.WriteResult, with_row_count: bool = False) -> dict[str, Any]:
    """What a write did (Delta operation metrics, version, schema); optionally the table's row count."""
    counted = {"dagster/row_count": delta_tables.row_count(df.sparkSession, uri)} if with_row_count else {}
    return {
        **counted,
        "write_mode_operation": result.operation,
        "rows_inserted": result.rows_inserted,
        "rows_updated": result.rows_updated,
        "rows_deleted": result.rows_deleted,
        "delta_version": result.version,
        "table_uri": MetadataValue.path(uri),
        "dagster/uri": uri,
        "dagster/column_schema": TableSchema(
            columns=[TableColumn(f.name, f.dataType.simpleString()) for f in df.schema.fields]
        ),
    }


def partition_window(column: str, time_window) -> Window:
    return Window(column=column, start=time_window.start, end=time_window.end)


def _partition_kind(df: DataFrame, column: str, uri: str):
    if column not in df.columns:
        raise DeltaWriteError(f"{uri} has no partition column '{column}'")
    return delta_tables.partition_kind(df, column, uri)
