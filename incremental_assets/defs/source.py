"""The source: atomic_events (the embedded sample stream, advanced one load batch at a time from the
UI, never past the current hour; a user's own source table is the same asset, pointed at by INCREMENTAL_ASSETS_SOURCE), and what
arrived in it per load day, the rows no run can process included."""

from datetime import datetime, timedelta

from dagster import (
    AssetExecutionContext,
    AssetSelection,
    Config,
    Definitions,
    MaterializeResult,
    MetadataValue,
    TableSchema,
    define_asset_job,
)
from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.catalog import ATOMIC_EVENTS, SAMPLE_LOAD_JOB, SOURCE_GROUP
from incremental_assets.lib.delta.log import row_count, stored_table
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.delta.spec import delta_table
from incremental_assets.lib.delta.write import last_commit
from incremental_assets.lib.environment import source_table_uri, table_uri
from incremental_assets.lib.metadata import stored_columns
from incremental_assets.lib.assets import spark_delta_asset
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import append_hours, generate_stream, read_stream_state
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import LOAD_DATE
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.utc import utcnow


def summarize_loads(events: DataFrame) -> DataFrame:
    """Per load day: rows, the unprocessable ones (null event_id or cursor), duplicates, sessions."""
    load_date = F.col(LOAD_DATE) if LOAD_DATE in events.columns else F.to_date("load_tstamp")
    return (
        events.groupBy(load_date.alias(LOAD_DATE))
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count_if(F.col("event_id").isNull()).alias("null_event_id"),
            F.count_if(F.col("load_tstamp").isNull()).alias("null_load_tstamp"),
            (F.count("event_id") - F.count_distinct("event_id")).alias("duplicate_event_ids"),
            F.count_distinct("domain_sessionid").alias("sessions"),
            F.count_distinct("domain_userid").alias("users"),
            F.min("load_tstamp").alias("first_load_tstamp"),
            F.max("load_tstamp").alias("last_load_tstamp"),
        )
        .orderBy(LOAD_DATE)
    )


@spark_delta_asset(
    deps=[ATOMIC_EVENTS],
    group_name=SOURCE_GROUP,
    metadata=delta_table("replace"),
    description="Per load day of the source events table: rows, rows with a null event_id or load_tstamp "
    "(which no incremental run can process), duplicate event_ids, sessions and users.",
)
def source_load_summary(context: AssetExecutionContext, spark: SparkResource) -> DataFrame:
    source = source_table_uri()
    summary = summarize_loads(read_table(spark.spark_session, source)).cache()
    totals = summary.agg(*[F.sum(c).alias(c) for c in ("rows", "null_event_id", "null_load_tstamp")]).first()
    context.add_output_metadata(
        {
            "source_table": MetadataValue.path(source),
            "source_rows": int(totals["rows"] or 0),
            "unprocessable_rows": int((totals["null_event_id"] or 0) + (totals["null_load_tstamp"] or 0)),
            "load_days": summary.count(),
        }
    )
    return summary


class SampleBatchConfig(Config):
    hours: int = Field(default=1, description="How many hourly load batches to append (at most those due by now)")


def hours_due(loaded_until: datetime, now: datetime) -> int:
    """Whole load hours between the stream's end and now: an hour's batch is due once it has passed
    (a loader never delivers rows stamped ahead of the clock)."""
    return max(0, int((now - loaded_until).total_seconds() // 3600))


@spark_delta_asset(
    name=ATOMIC_EVENTS,
    group_name=SOURCE_GROUP,
    description="The source events table (Snowplow atomic columns, partitioned by load_date): the sample "
    "stream here, or your own table (INCREMENTAL_ASSETS_SOURCE). Each materialization appends the sample "
    "stream's next hourly load batch(es) that are due by now, as a loader would; the first one starts the stream. "
    "On your own events it writes nothing and records the version your loader left.",
)
def atomic_events(context: AssetExecutionContext, config: SampleBatchConfig, spark: SparkResource) -> MaterializeResult:
    uri = table_uri(ATOMIC_EVENTS)
    state = read_stream_state(uri)
    if state is None and stored_table(uri) is not None:  # a user's own events (a loader's, an export) at this path
        context.log.warning(f"Nothing appended: {uri} holds events that are not the embedded sample stream (your "
                            "loader's), which the sample would replace; their version is recorded as they are")
        return MaterializeResult(metadata=_source_metadata(uri, rows=0, hours=0, loaded_until=None))
    hours = min(config.hours, hours_due(state[1] if state else SampleParams().start, utcnow()))
    rows = 0
    if hours and state is None:
        rows = generate_stream(spark.spark_session, uri, SampleParams(), hours=hours)
    elif hours:
        rows = append_hours(spark.spark_session, uri, hours)
    stream = read_stream_state(uri)
    loaded_until = stream[1] if stream else None
    if hours < config.hours:
        context.log.info(f"{hours} of the {config.hours} hour(s) asked for were due: the stream is loaded up to "
                         f"{loaded_until}, and its next hour comes due at {loaded_until + timedelta(hours=1) if loaded_until else '?'}")
    return MaterializeResult(metadata=_source_metadata(uri, rows, hours, loaded_until))


def _source_metadata(uri: str, rows: int, hours: int, loaded_until: datetime | None) -> dict:
    stored = stored_table(uri)
    return {
        "rows_appended": rows,
        "hours_appended": hours,
        "loaded_until": str(loaded_until),
        "delta_version": last_commit(uri).version if stored else None,
        "table_uri": MetadataValue.path(uri),
        **({"dagster/row_count": row_count(uri), "dagster/column_schema": TableSchema(columns=stored_columns(stored))}
           if stored else {}),
    }


sample_load_job = define_asset_job(
    SAMPLE_LOAD_JOB,
    selection=AssetSelection.assets(atomic_events),
    description="Append the next hourly load batch(es) of the sample stream to atomic_events.",
)


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(assets=[atomic_events, source_load_summary], jobs=[sample_load_job])
