"""The sample stream as a Delta table, written in hourly load batches and continued on demand.

Beside the table, `_sample_stream.json` records the stream's parameters and how far it has been
loaded, so the next batch is exactly the continuation of what is already there: because the
generator is consistent across windows, a stream written in many batches holds the same rows as
one written at once.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from incremental_assets.atomic_events import LOAD_DATE, SAMPLE_SCHEMA
from incremental_assets.environment import is_uri
from incremental_assets.loader import write_events
from incremental_assets.sample.generator import SampleParams, generate_events

STATE_FILE = "_sample_stream.json"
STREAM_SCHEMA = T.StructType([*SAMPLE_SCHEMA.fields, T.StructField(LOAD_DATE, T.DateType(), nullable=True)])


def generate_stream(spark: SparkSession, table_uri: str, params: SampleParams, hours: int | None = None) -> int:
    """Start a new stream: the first `hours` (default: all its days) hourly load batches; replaces the table."""
    frame, loaded_until = _batch(spark, params, params.start, params.days * 24 if hours is None else hours)
    rows = write_events(spark, frame, table_uri, "replace")
    _write_state(table_uri, params, loaded_until)
    return rows


def append_hours(spark: SparkSession, table_uri: str, hours: int) -> int:
    """Continue the stream with its next `hours` hourly load batches, in one Delta commit."""
    if read_stream_state(table_uri) is None:
        raise FileNotFoundError(
            f"No sample stream at {table_uri} (no {state_path(table_uri)}): generate one first "
            "(incremental-assets generate)"
        )
    frame, loaded_until = next_batch(spark, table_uri, hours)
    rows = write_events(spark, frame, table_uri, "append")
    record_loaded_until(table_uri, None, loaded_until)
    return rows


def next_batch(
    spark: SparkSession, table_uri: str, hours: int = 1, params: SampleParams | None = None
) -> tuple[DataFrame, datetime]:
    """The next `hours` of the stream and the new loaded-until marker; writes nothing.

    An existing stream continues with its own stored parameters (`params` is then ignored: the
    rows must continue what is there). Without one, a new stream starts from `params` (default:
    SampleParams()). Persist the marker with `record_loaded_until` once the rows are written.
    """
    state = read_stream_state(table_uri)
    if state is None:
        params = params or SampleParams()
        return _batch(spark, params, params.start, hours)
    stored_params, loaded_until = state
    return _batch(spark, stored_params, loaded_until, hours)


def record_loaded_until(table_uri: str, params: SampleParams | None, loaded_until: datetime) -> None:
    """Persist how far the stream is loaded, after its rows are written.

    The parameters of an existing stream are kept; `params` (default SampleParams()) only
    records a new one, as `next_batch` started it.
    """
    state = read_stream_state(table_uri)
    _write_state(table_uri, state[0] if state is not None else (params or SampleParams()), loaded_until)


def read_stream_state(table_uri: str) -> tuple[SampleParams, datetime] | None:
    """The stored (params, loaded_until) of the stream at `table_uri`, or None when there is none."""
    path = state_path(table_uri)
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    return SampleParams.from_dict(state["params"]), datetime.fromisoformat(state["loaded_until"])


def state_path(table_uri: str) -> Path:
    """`_sample_stream.json` beside the table (local warehouses only)."""
    if is_uri(table_uri):
        raise ValueError(f"The sample stream keeps its state on a local path; {table_uri} is not one")
    return Path(table_uri).parent / STATE_FILE


def events_frame(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    """Generator rows as a DataFrame (STREAM_SCHEMA).

    PySpark reads naive datetimes in the Python process's local zone, so they are marked UTC first.
    """
    utc_rows = [tuple(_utc(value) for value in row) for row in rows]
    return spark.createDataFrame(utc_rows, STREAM_SCHEMA)


def _batch(spark: SparkSession, params: SampleParams, start: datetime, hours: int) -> tuple[DataFrame, datetime]:
    if isinstance(hours, bool) or not isinstance(hours, int) or hours < 1:
        raise ValueError(f"hours must be an integer >= 1, got {hours!r}")
    until = start + timedelta(hours=hours)
    return events_frame(spark, generate_events(params, start, until)), until


def _write_state(table_uri: str, params: SampleParams, loaded_until: datetime) -> None:
    path = state_path(table_uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"params": params.to_dict(), "loaded_until": loaded_until.isoformat()}, indent=2))
    os.replace(temporary, path)  # atomic: a crash never leaves a half-written state


def _utc(value):
    return value.replace(tzinfo=timezone.utc) if isinstance(value, datetime) else value
