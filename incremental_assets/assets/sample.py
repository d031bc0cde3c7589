"""atomic_events: the embedded sample stream, advanced one load batch at a time from the UI."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue
from pydantic import Field

from incremental_assets.assets import spark_delta_asset
from incremental_assets import delta_tables
from incremental_assets.environment import SAMPLE_TABLE, table_uri
from incremental_assets.resources.spark import SparkResource
from incremental_assets.sample.generator import SampleParams
from incremental_assets.sample.stream import append_hours, generate_stream, read_stream_state


class SampleBatchConfig(Config):
    hours: int = Field(default=1, description="How many hourly load batches to append")


@spark_delta_asset(
    name=SAMPLE_TABLE,
    group_name="sample",
    description="The sample source events table (Snowplow atomic columns, partitioned by load_date). "
    "Each materialization appends the stream's next hourly load batch(es), as a loader would; the "
    "first one starts the stream.",
)
def atomic_events(context: AssetExecutionContext, config: SampleBatchConfig, spark: SparkResource) -> MaterializeResult:
    uri = table_uri(SAMPLE_TABLE)
    if read_stream_state(uri) is None:
        rows = generate_stream(spark.spark_session, uri, SampleParams(), hours=config.hours)
    else:
        rows = append_hours(spark.spark_session, uri, config.hours)
    _, loaded_until = read_stream_state(uri)
    commit = delta_tables.last_commit(uri)
    return MaterializeResult(
        metadata={
            "rows_appended": rows,
            "loaded_until": str(loaded_until),
            "delta_version": commit.version,
            "table_uri": MetadataValue.path(uri),
        }
    )
