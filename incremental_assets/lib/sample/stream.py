"""The sample stream as a Delta table, written in hourly load batches and continued on demand.

Each commit that writes the stream carries, in its Delta `userMetadata`, the stream's parameters
and how far it is loaded: the marker commits atomically with the rows, so a crash can never
leave rows without their marker (or the reverse), and the next batch is exactly the
continuation of what is there. The generator is consistent across windows, so a stream written
in many batches holds the same rows as one written at once.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from incremental_assets.lib.delta.log import latest_marker
from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.source.contract import LOAD_DATE, SAMPLE_SCHEMA
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.utc import aware_row

MARKER_KEY = "sample_stream"
STREAM_SCHEMA = T.StructType([*SAMPLE_SCHEMA.fields, T.StructField(LOAD_DATE, T.DateType(), nullable=True)])
# A DataFrame made from an Arrow table has a partition, and so a Delta file per load day, for every
# 10k rows (spark.sql.execution.arrow.maxRecordsPerBatch): coalesced to one per this many rows, a
# day's rows (in load order) land in one or two files.
_ROWS_PER_PARTITION = 500_000
_ROWS_PER_WRITE = 500_000  # at most about this many rows per commit of a new stream


def generate_stream(spark: SparkSession, table_uri: str, params: SampleParams, hours: int | None = None) -> int:
    """Start a new stream: the first `hours` (default: all its days) hourly load batches; replaces the table.

    Written a few hundred thousand rows at a time: the rows of a DataFrame made from local Arrow
    data travel inside its tasks, and millions at once exhaust the driver's heap. The stream is the
    same whatever the cut points (its window-consistency property)."""
    total = _checked_hours(params.days * 24 if hours is None else hours)
    step = max(1, _ROWS_PER_WRITE * 24 // max(1, params.events_per_day))
    written = 0
    for first in range(0, total, step):
        frame, loaded_until = _batch(spark, params, params.start + timedelta(hours=first), min(step, total - first))
        mode = "replace" if first == 0 else "append"
        written += write_events(spark, frame, table_uri, mode, user_metadata=_marker(params, loaded_until))
    return written


def append_hours(spark: SparkSession, table_uri: str, hours: int) -> int:
    """Continue the stream with its next `hours` hourly load batches, in one Delta commit."""
    state = read_stream_state(table_uri)
    if state is None:
        raise FileNotFoundError(f"No sample stream at {table_uri}: generate one first (incremental-assets generate)")
    params, _ = state
    frame, loaded_until = next_batch(spark, table_uri, hours)
    return write_events(spark, frame, table_uri, "append", user_metadata=_marker(params, loaded_until))


def next_batch(
    spark: SparkSession, table_uri: str, hours: int = 1, params: SampleParams | None = None
) -> tuple[DataFrame, datetime]:
    """The next `hours` of the stream and the new loaded-until marker; writes nothing.

    An existing stream continues with its own stored parameters (`params` is then ignored: the
    rows must continue what is there). Without one, a new stream starts from `params` (default:
    SampleParams()).
    """
    state = read_stream_state(table_uri)
    if state is None:
        params = params or SampleParams()
        return _batch(spark, params, params.start, hours)
    stored_params, loaded_until = state
    return _batch(spark, stored_params, loaded_until, hours)


def read_stream_state(table_uri: str) -> tuple[SampleParams, datetime] | None:
    """The (params, loaded_until) of the newest commit that wrote the stream, or None.

    A user's `load` into the same table carries no marker and is passed over."""
    marker = latest_marker(table_uri, MARKER_KEY)
    if marker is None:
        return None
    return SampleParams.from_dict(marker["params"]), datetime.fromisoformat(marker["loaded_until"])


def events_frame(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    """Rows in STREAM_SCHEMA order as a DataFrame; for a few rows (tests), the generator's go by Arrow.

    PySpark reads naive datetimes in the Python process's local zone, so they are marked UTC first.
    """
    utc_rows = [aware_row(row) for row in rows]
    return spark.createDataFrame(utc_rows, STREAM_SCHEMA)


def _checked_hours(hours: int) -> int:
    if isinstance(hours, bool) or not isinstance(hours, int) or hours < 1:
        raise ValueError(f"hours must be an integer >= 1, got {hours!r}")
    return hours


def _batch(spark: SparkSession, params: SampleParams, start: datetime, hours: int) -> tuple[DataFrame, datetime]:
    until = start + timedelta(hours=_checked_hours(hours))
    # From Arrow columns, not Python rows; unlike a temporary Parquet file (as fast), it needs no
    # clean-up after the lazy DataFrame is used, and it works over Spark Connect.
    table = generate_table(params, start, until)
    partitions = max(1, -(-table.num_rows // _ROWS_PER_PARTITION))
    return spark.createDataFrame(table, STREAM_SCHEMA).coalesce(partitions), until


def _marker(params: SampleParams, loaded_until: datetime) -> str:
    return json.dumps({MARKER_KEY: {"params": params.to_dict(), "loaded_until": loaded_until.isoformat()}})
