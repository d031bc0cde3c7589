"""The session layer (SPEC §5): lifecycle manifest, quarantine, and the `sessions` table."""

from datetime import timedelta

from dagster import AssetExecutionContext, MaterializeResult
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.assets import spark_delta_asset
from incremental_assets import delta_tables
from incremental_assets.assets.limits import BASE_GROUP
from incremental_assets.delta_tables import WriteMode
from incremental_assets.environment import source_table_uri
from incremental_assets.incremental import incremental_asset, run_key
from incremental_assets.io_managers.delta import write_metadata
from incremental_assets.logic.limits import RunLimits
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms import sessions as T

LIFECYCLE = "sessions_lifecycle_manifest"
QUARANTINE = "quarantined_sessions"


def read_or_empty(spark, uri: str, schema: str) -> DataFrame:
    if delta_tables.table_exists(spark, uri):
        return delta_tables.read_table(spark, uri)
    return spark.createDataFrame([], schema)


LIFECYCLE_SCHEMA = "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp, start_date date"
QUARANTINE_SCHEMA = "session_identifier string, quarantined_at timestamp"


def this_run(context: AssetExecutionContext, manifest: ManifestResource) -> RunLimits:
    record = manifest.run_record(run_key(context))
    if record is None:
        raise ValueError("This run has no limits: new_event_limits must run first in the same run")
    return record.limits


@spark_delta_asset(
    deps=["new_event_limits", "atomic_events"],
    group_name=BASE_GROUP,
    description="Start and end of every session (first user sticks, end capped at start + max_session_days), "
    "so a new event for an old session re-processes the whole session without scanning all history.",
)
def sessions_lifecycle_manifest(
    context: AssetExecutionContext, settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource
) -> MaterializeResult:
    session = spark.session
    limits = this_run(context, manifest)
    source = delta_tables.read_table(session, source_table_uri())
    quarantined = read_or_empty(session, manifest.uri(QUARANTINE), QUARANTINE_SCHEMA)
    window = T.in_cursor_range(source, settings.session_timestamp, limits.lower, limits.upper)
    classified = T.classify_window(window, quarantined, settings).cache()
    drops = {r["drop_reason"]: r["count"] for r in classified.groupBy("drop_reason").count().collect()}
    candidates = T.new_session_candidates(classified, settings.session_timestamp)

    uri = manifest.uri(LIFECYCLE)
    floor = (limits.lower - timedelta(days=settings.session_lookback_days)).date()
    stored = read_or_empty(session, uri, LIFECYCLE_SCHEMA).where(F.col("start_date") >= F.lit(floor))
    changes = T.merge_lifecycle(candidates, stored, settings.max_session_days).cache()
    result = delta_tables.write(
        session, changes, uri, WriteMode.UPSERT, keys=[T.SESSION], partition_by=["start_date"],
        merge_floor=("start_date", floor),
    )
    classified.unpersist()
    changes.unpersist()
    metadata = {
        **write_metadata(changes, uri, result, with_row_count=True),
        "events_in_window": sum(drops.values()),
        "eligible_events": drops.get(None, 0),
        "null_cursor_rows": T.null_cursor_rows(source, settings.session_timestamp, limits.lower, limits.upper),
        **{f"dropped_{reason}": n for reason, n in drops.items() if reason},
        "sessions_new_or_changed": result.rows_inserted + result.rows_updated,
    }
    return MaterializeResult(metadata=metadata)


@spark_delta_asset(
    deps=[LIFECYCLE],
    group_name=BASE_GROUP,
    description="Sessions that reached max_session_days (bots): their events stop being processed, so they "
    "stop costing scans. Insert-only.",
)
def quarantined_sessions(
    context: AssetExecutionContext, settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource
) -> MaterializeResult:
    session = spark.session
    limits = this_run(context, manifest)
    lifecycle = read_or_empty(session, manifest.uri(LIFECYCLE), LIFECYCLE_SCHEMA)
    active = T.sessions_this_run(lifecycle, limits.lower, limits.upper, settings.max_session_days)
    new = T.newly_quarantined(active, settings.max_session_days, limits.now)
    uri = manifest.uri(QUARANTINE)
    result = delta_tables.write(session, new, uri, WriteMode.MERGE_INSERT, keys=[T.SESSION])
    return MaterializeResult(
        metadata={
            **write_metadata(new, uri, result, with_row_count=True),
            "sessions_newly_quarantined": result.rows_inserted,
            }
    )


@incremental_asset(write_mode="upsert", keys=["session_identifier"])
def sessions(events: DataFrame, limits: RunLimits) -> DataFrame:
    """One row per session, recomputed whole from all its events whenever a run touches it."""
    by_time = F.struct("derived_tstamp", "event_id")
    page_views = F.col("event_name") == "page_view"
    return (
        events.groupBy(T.SESSION)
        .agg(
            F.max(T.USER).alias(T.USER),
            F.min_by("app_id", by_time).alias("app_id"),
            F.min("derived_tstamp").alias("start_tstamp"),
            F.max("derived_tstamp").alias("end_tstamp"),
            F.count("event_id").alias("events"),
            F.count_if(page_views).alias("page_views"),
            F.min_by(F.when(page_views, F.col("page_url")), F.when(page_views, by_time)).alias("first_page_url"),
            F.max_by(F.when(page_views, F.col("page_url")), F.when(page_views, by_time)).alias("last_page_url"),
        )
        .withColumn(
            "duration_seconds", F.col("end_tstamp").cast("long") - F.col("start_tstamp").cast("long")
        )
    )
