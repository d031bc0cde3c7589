"""The Delta IO manager: every asset's table, as the asset's definition metadata declares it.

As Dagster's DbIOManager does, it builds a table slice (which table, which partition window, which
write mode, from `delta_table(...)` in the asset's metadata) and hands it, with the value, to the
handler of the value's type: rows (`DataFrame`, or `Rows` with how to write them this run) here,
and a run's plan and batch (lib/incremental), given by the project's subclass. It decides nothing
else: whether a step has anything to write, the lease, the manifests' progress are the assets'
(and `@incremental_asset`'s). A value a later step of the same run loads (a plan, a batch, a note)
is loaded as the producing run left it: `context.upstream_output.run_id` says which run that is,
re-executions included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from dagster import (
    ConfigurableIOManagerFactory,
    InputContext,
    IOManager,
    MetadataValue,
    OutputContext,
    TableColumn,
    TableSchema,
    TimeWindowPartitionsDefinition,
)
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession

from incremental_assets.lib.delta.log import noted, row_count
from incremental_assets.lib.delta.read import count_by, partition_kind, read_table
from incremental_assets.lib.delta.spec import (
    MERGE_FLOOR,
    DeltaWriteError,
    Rows,
    Stored,
    TableSpec,
    Window,
    WriteMode,
    partition_window,
)
from incremental_assets.lib.delta.write import Txn, WriteRequest, WriteResult, create_with_change_feed, note, write
from incremental_assets.lib.environment import table_uri, warehouse_root
from incremental_assets.lib.spark import SparkResource


@dataclass(frozen=True)
class TableSlice:
    """Where an output goes, or an input comes from: the asset's table, how it is written, the
    partition window of a partitioned run (None: the whole table), and the run that produces (an
    output) or produced (an input) the value."""

    name: str
    uri: str
    spec: TableSpec
    window: Window | None
    run_id: str


class TypeHandler(Protocol):
    """Stores values of some types into their table slice, and loads them back."""

    stores: tuple[type, ...]  # the output values it stores
    loads: tuple[type, ...]  # the input annotations it loads

    def store(self, context: OutputContext, table: TableSlice, value: Any, spark: Callable[[], SparkSession]) -> dict: ...

    def load(self, context: InputContext, table: TableSlice, spark: Callable[[], SparkSession]) -> Any: ...


class RowsHandler:
    """DataFrames and `Rows`: written in the table's mode (a partitioned asset's window replaced);
    loaded back whole, or the input's partition window, or `Stored` with the producing step's note."""

    stores = (DataFrame, Rows, type(None))
    loads = (DataFrame, Stored)

    def store(self, context: OutputContext, table: TableSlice, value, spark) -> dict[str, Any]:
        rows = value if isinstance(value, Rows) else Rows(value)
        metadata: dict[str, Any] = {}
        if rows.frame is not None:
            result = self.write(table, rows)
            metadata.update(write_metadata(frame_columns(rows.frame), table.uri, result))
            if rows.merge_floor is not None:
                metadata[MERGE_FLOOR] = rows.merge_floor.isoformat()
            metadata.update(partition_counts(context, rows.frame.sparkSession, table))
        else:
            metadata["written"] = False
        if rows.note is not None:
            note(table.uri, table.run_id, rows.note)
        return metadata

    def write(self, table: TableSlice, rows: Rows, known_empty: bool = False) -> WriteResult:
        frame, spec = rows.frame, table.spec
        properties = spec.table_properties(frame.columns)
        if spec.change_feed:
            create_with_change_feed(frame.sparkSession, table.uri, frame.schema, spec.partition_by, properties)
        floor = (spec.partition_by[0], rows.merge_floor) if rows.merge_floor and spec.partition_by else None
        request = WriteRequest(
            table.uri, spec.write_mode, spec.keys, spec.partition_by, table.window, floor,
            Txn(f"run-{rows.decided_by}") if rows.decided_by else None, rows.rows_at_most, spec.one_row_per_key,
            known_empty, properties,
        )
        result = write(frame.sparkSession, frame, request)
        if frame.is_cached:  # cached by its asset for the counts it took; written now
            frame.unpersist()
        return result

    def load(self, context: InputContext, table: TableSlice, spark) -> DataFrame | Stored:
        frame = read_table(spark(), table.uri)
        if table.window is not None:
            frame = frame.where(table.window.condition(partition_kind(frame, table.window.column, table.uri)))
        if context.dagster_type.typing_type is Stored:
            return Stored(frame, noted(table.uri, table.run_id))
        return frame


class DeltaIOManager(ConfigurableIOManagerFactory):
    """Stores each asset as the Delta table `<warehouse_root>/<asset name>`. A project adds the
    handlers of its own value types (`type_handlers`) and what the UI shows of each table it
    stores (`shown`: for people, never read back)."""

    spark: SparkResource
    warehouse_root: str | None = Field(
        default=None, description="Warehouse root; default INCREMENTAL_ASSETS_WAREHOUSE or ./warehouse"
    )

    def type_handlers(self) -> list[TypeHandler]:
        return [RowsHandler()]

    def shown(self, table: str, run_id: str) -> dict[str, Any]:
        return {}

    def create_io_manager(self, context) -> IOManager:
        return _DeltaIOManager(self)


class _DeltaIOManager(IOManager):
    def __init__(self, config: DeltaIOManager):
        self.config = config
        self.handlers = config.type_handlers()

    def _spark(self) -> SparkSession:
        return self.config.spark.spark_session

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        table = self._slice(context, context.definition_metadata, context.run_id, output=True)
        handler = next((h for h in self.handlers if isinstance(obj, h.stores)), None)
        if handler is None:
            raise DeltaWriteError(f"{table.name}: no handler stores a {type(obj).__name__}")
        stored = handler.store(context, table, obj, self._spark)
        context.add_output_metadata({"table_uri": MetadataValue.path(table.uri), **stored, **self.config.shown(table.name, context.run_id)})

    def load_input(self, context: InputContext) -> Any:
        upstream = context.upstream_output
        metadata = upstream.definition_metadata if upstream else {}
        table = self._slice(context, metadata, upstream.run_id if upstream else None, output=False)
        kind = context.dagster_type.typing_type
        untyped = self.handlers[0] if kind in (Any, object) else None  # an input without annotation: rows
        handler = next((h for h in self.handlers if kind in h.loads), untyped)
        if handler is None:
            raise DeltaWriteError(f"{table.name}: no handler loads a {getattr(kind, '__name__', kind)}")
        return handler.load(context, table, self._spark)

    def _slice(self, context, definition_metadata, run_id: str | None, output: bool) -> TableSlice:
        name = context.asset_key.path[-1]
        uri = table_uri(name, self.config.warehouse_root or warehouse_root())
        spec = TableSpec.of(definition_metadata, name)
        window = None
        if context.has_asset_partitions and spec.partition_column:
            window = partition_window(spec.partition_column, context.asset_partitions_time_window)
        if output:
            if spec.write_mode is WriteMode.REPLACE_PARTITION and window is None:
                raise DeltaWriteError(f"replace_partition into {uri} needs a partitioned asset")
            if spec.write_mode is WriteMode.REPLACE and context.has_asset_partitions:
                raise DeltaWriteError(
                    f"Refusing to overwrite all of {uri} from a partitioned run: declare write mode "
                    "replace_partition with a partition_column so only the run's window is replaced"
                )
        return TableSlice(name, uri, spec, window, run_id)


def write_metadata(columns: list[TableColumn], uri: str, result: WriteResult) -> dict[str, Any]:
    """What a write did, for people: Delta's operation metrics, version, table path, schema."""
    return {
        "write_mode_operation": result.operation,
        "rows_inserted": result.rows_inserted,
        "rows_updated": result.rows_updated,
        "rows_deleted": result.rows_deleted,
        "delta_version": result.version,
        "dagster/uri": uri,
        "dagster/column_schema": TableSchema(columns=columns),
        **({"skipped_write": "this run's write was already committed (a re-executed step)"} if result.skipped else {}),
    }


def frame_columns(frame: DataFrame) -> list[TableColumn]:
    return [TableColumn(f.name, f.dataType.simpleString()) for f in frame.schema.fields]


def partition_counts(context: OutputContext, spark: SparkSession, table: TableSlice) -> dict[str, Any]:
    """The table's rows (a partitioned write: each partition's own, not the range total)."""
    if table.window is None:
        return {} if context.has_asset_partitions else {"dagster/row_count": row_count(table.uri)}
    counts = partition_row_counts(spark, table.uri, table.window, context.asset_partitions_def, context.asset_partition_keys)
    for key, rows in counts.items():
        if len(counts) > 1:
            context.step_context.add_asset_metadata({"dagster/row_count": rows}, asset_key=context.asset_key, partition_key=key)
    return {"partitions_written": len(counts), **({"dagster/row_count": next(iter(counts.values()))} if len(counts) == 1 else {})}


def partition_row_counts(spark, uri: str, window: Window, partitions_def, keys) -> dict[str, int]:
    """Rows of the table in each time partition `keys` of `window`, from one grouped read."""
    if not isinstance(partitions_def, TimeWindowPartitionsDefinition):
        raise DeltaWriteError(f"replace_partition into {uri} needs time-window partitions")
    counts = count_by(spark, uri, window.column, window)
    per_key = {}
    for key in keys:
        key_window = partition_window(window.column, partitions_def.time_window_for_partition_key(key))
        per_key[key] = sum(n for value, n in counts.items() if key_window.contains(value))
    return per_key
