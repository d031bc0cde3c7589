"""What arrived in the source events table, per load day: the rows no run can process included."""

from dagster import AssetExecutionContext, MetadataValue
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.assets import spark_delta_asset
from incremental_assets import delta_tables
from incremental_assets.atomic_events import LOAD_DATE
from incremental_assets.environment import source_table_uri
from incremental_assets.io_managers.delta import delta_table
from incremental_assets.resources.spark import SparkResource


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
    deps=["atomic_events"],
    group_name="source",
    metadata=delta_table("replace"),
    description="Per load day of the source events table: rows, rows with a null event_id or load_tstamp "
    "(which no incremental run can process), duplicate event_ids, sessions and users.",
)
def source_load_summary(context: AssetExecutionContext, spark: SparkResource) -> DataFrame:
    source = source_table_uri()
    summary = summarize_loads(delta_tables.read_table(spark.spark_session, source)).cache()
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
