"""The Delta IO manager: every asset's table, as the asset's definition metadata declares it.

As Dagster's DbIOManager does, it builds a table slice (which table, which partition window, which
write mode, from `delta_table(...)` in the asset's metadata) and hands it, with the value, to the
handler of the value's type: rows (`DataFrame`, or `Rows` with how to write them this run) and
pandas or Arrow tables here, and a run's plan and batch (lib/incremental), given by the project's
subclass. It decides nothing else: whether a step has anything to write, the lease, the manifests'
progress are the assets' (and `@incremental_asset`'s). A value a later step of the same run loads
(a plan, a batch, a note) is loaded as the producing run left it: `context.upstream_output.run_id`
says which run that is, re-executions included.

An ordinary Dagster asset, one that declares no Delta table, is stored as Dagster users expect: a
table value replaces the table `<warehouse_root>/<asset name>` whole, any other value is pickled
by Dagster's own filesystem IO manager under `<warehouse_root>/_objects/` (one file per partition),
and None stores nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import pandas as pd
import pyarrow as pa
from dagster import (
    ConfigurableIOManagerFactory,
    DagsterInstance,
    Failure,
    FilesystemIOManager,
    InputContext,
    IOManager,
    MetadataValue,
    OutputContext,
    TableColumn,
    TableSchema,
    TimeWindowPartitionsDefinition,
)
from dagster._core.errors import DagsterInvariantViolationError
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession

from incremental_assets.lib.delta.arrow import collect
from incremental_assets.lib.delta.log import noted, reading, row_count, stored_table, table_exists
from incremental_assets.lib.delta.read import count_by, partition_kind, read_table, require_table
from incremental_assets.lib.delta.spec import (
    MERGE_FLOOR,
    METADATA_KEY,
    DeltaWriteError,
    Rows,
    Stored,
    TableSpec,
    Window,
    WriteMode,
    partition_window,
)
from incremental_assets.lib.delta.write import (
    Txn,
    WriteRequest,
    WriteResult,
    create_with_change_feed,
    note,
    replace_with,
    write,
)
from incremental_assets.lib.environment import table_uri, warehouse_root
from incremental_assets.lib.errors import INTERRUPTED, TableWriteError, terminated
from incremental_assets.lib.metadata import schema_columns, stored_columns
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
    loaded back whole, or the input's partition window, or `Stored` with the producing step's note.
    Nothing to write (None) leaves the table, and its columns and rows on the asset's page, as they are."""

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
            metadata.update(partition_counts(context, spark, table))
        else:
            metadata.update(written=False, **stored_metadata(context, table.uri))
        if rows.note is not None:
            note(table.uri, table.run_id, rows.note)
        return metadata

    def write(self, table: TableSlice, rows: Rows) -> WriteResult:
        frame, spec = rows.frame, table.spec
        properties = spec.table_properties(frame.columns)
        if spec.change_feed:
            create_with_change_feed(frame.sparkSession, table.uri, frame.schema, spec.partition_by, properties)
        floor = (spec.partition_by[0], rows.merge_floor) if rows.merge_floor and spec.partition_by else None
        request = WriteRequest(
            table.uri, spec.write_mode, spec.keys, spec.partition_by, table.window, floor,
            txn_of(rows.decided_by), rows.rows_at_most, spec.one_row_per_key, properties,
            json.dumps(rows.marker, default=str) if rows.marker is not None else None,
        )
        result = write(frame.sparkSession, frame, request)
        if frame.is_cached:  # cached by its asset for the counts it took; written now
            frame.unpersist()
        return result

    def load(self, context: InputContext, table: TableSlice, spark) -> DataFrame | Stored:
        def rows() -> DataFrame:
            frame = read_table(spark(), table.uri)
            if table.window is not None:
                frame = frame.where(table.window.condition(partition_kind(frame, table.window.column, table.uri)))
            return frame

        if context.dagster_type.typing_type is Stored:
            opened = require_table(table.uri)  # its rows are read later: a missing one is refused now, before the step writes
            return Stored(rows, noted(table.uri, table.run_id, table=opened))
        return rows()


def txn_of(decided_by: str | None) -> Txn | None:
    """The transaction a step's write is keyed by: the run that decided it (repeated, a no-op)."""
    return Txn(f"run-{decided_by}") if decided_by else None


class ArrowHandler:
    """pandas DataFrames and Arrow tables, an ordinary asset's: they replace the whole table, by
    deltalake (no JVM); loaded back as the input's annotation says (a partition window through Spark,
    which filters it)."""

    stores = loads = (pd.DataFrame, pa.Table)

    def store(self, context: OutputContext, table: TableSlice, value, spark) -> dict[str, Any]:
        spec = table.spec
        if spec.write_mode is not WriteMode.REPLACE:
            raise DeltaWriteError(f"{table.name}: a {type(value).__name__} replaces the whole table; "
                                  f"return a Spark DataFrame to write it as {spec.write_mode.value}")
        rows = pa.table(value)
        result = replace_with(table.uri, rows, spec.partition_by, spec.table_properties(rows.column_names))
        columns = stored_columns(stored_table(table.uri))
        return {**write_metadata(columns, table.uri, result), "dagster/row_count": rows.num_rows}

    def load(self, context: InputContext, table: TableSlice, spark) -> pd.DataFrame | pa.Table:
        if table.window is None:
            with reading(table.uri):
                rows = stored_table(table.uri).to_pyarrow_table()
        else:
            rows = collect(RowsHandler().load(context, table, spark))
        return rows if context.dagster_type.typing_type is pa.Table else rows.to_pandas()


class DeltaIOManager(ConfigurableIOManagerFactory):
    """Stores each asset as the Delta table `<warehouse_root>/<asset name>` (an ordinary asset's
    value that is no table: pickled under `<warehouse_root>/_objects/`). A project adds the
    handlers of its own value types (`type_handlers`) and what the UI shows of each table it
    stores (`shown`: for people, never read back)."""

    spark: SparkResource
    warehouse_root: str | None = Field(
        default=None, description="Warehouse root; default INCREMENTAL_ASSETS_WAREHOUSE or ./warehouse"
    )

    def type_handlers(self) -> list[TypeHandler]:
        return [RowsHandler(), ArrowHandler()]

    def shown(self, table: str, run_id: str) -> dict[str, Any]:
        return {}

    def root(self) -> str:
        return self.warehouse_root or warehouse_root()

    def create_io_manager(self, context) -> IOManager:
        objects = FilesystemIOManager(base_dir=table_uri("_objects", self.root())).create_io_manager(context)
        return _DeltaIOManager(self, objects)


class _DeltaIOManager(IOManager):
    def __init__(self, config: DeltaIOManager, objects: IOManager):
        self.config = config
        self.handlers = config.type_handlers()
        self.objects = objects  # Dagster's own pickling IO manager, for an ordinary asset's values

    def _spark(self) -> SparkSession:
        return self.config.spark.spark_session

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        declared = METADATA_KEY in context.definition_metadata
        if obj is None and not declared:
            return  # an ordinary asset that returned nothing to store
        handler = next((h for h in self.handlers if isinstance(obj, h.stores)), None)
        if handler is None and not declared:
            self.objects.handle_output(context, obj)  # no table: pickled, as Dagster's own IO manager does
            return
        table = self._slice(context, context.definition_metadata, context.run_id, output=True)
        if handler is None:
            raise DeltaWriteError(f"{table.name}: no handler stores a {type(obj).__name__}")
        try:
            stored = handler.store(context, table, obj, self._spark)
        except (DeltaWriteError, Failure):
            raise  # the project's own refusals name their table already
        except INTERRUPTED as error:  # deltalake's, the JVM's: named by the table they were writing
            told = terminated(error, _instance_of(context), table.run_id, table.name)
            if told is not None:
                raise told from None
            if not isinstance(error, Exception):
                raise
            raise TableWriteError(table.uri, error) from error
        context.add_output_metadata({"table_uri": MetadataValue.path(table.uri), **stored, **self.config.shown(table.name, context.run_id)})

    def load_input(self, context: InputContext) -> Any:
        upstream = context.upstream_output
        metadata = upstream.definition_metadata if upstream else {}
        table = self._slice(context, metadata, upstream.run_id if upstream else None, output=False)
        kind = context.dagster_type.typing_type
        handler = next((h for h in self.handlers if kind in h.loads), None)
        if handler is None and METADATA_KEY not in metadata and not table_exists(table.uri):
            return self.objects.load_input(context)  # an ordinary asset's value, pickled
        # an input of no type a handler loads (most often none at all): the table's rows
        return (handler or self.handlers[0]).load(context, table, self._spark)

    def _slice(self, context, definition_metadata, run_id: str | None, output: bool) -> TableSlice:
        name = context.asset_key.path[-1]
        uri = table_uri(name, self.config.root())
        spec = TableSpec.of(definition_metadata)
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


def _instance_of(context: OutputContext) -> DagsterInstance | None:
    """The run's instance; None for an output context built without a step (a test)."""
    try:
        return context.step_context.instance
    except DagsterInvariantViolationError:
        return None


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
    return schema_columns(frame.schema)


def stored_metadata(context: OutputContext, uri: str) -> dict[str, Any]:
    """The stored table's columns, and its rows unless the asset is partitioned (its page counts
    each partition's own), from its log: a run that writes nothing keeps them on the asset's page."""
    table = stored_table(uri)
    if table is None:
        return {}
    rows = {} if context.has_asset_partitions else {"dagster/row_count": table.count()}
    return {"dagster/column_schema": TableSchema(columns=stored_columns(table)), **rows}


def partition_counts(context: OutputContext, spark: Callable[[], SparkSession], table: TableSlice) -> dict[str, Any]:
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
