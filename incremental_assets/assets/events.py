"""events_this_run (the run's batch) and filtered_events (SPEC §5.5, §6)."""

from dataclasses import replace
from datetime import timedelta

from dagster import AssetExecutionContext, MaterializeResult
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.assets import spark_delta_asset
from incremental_assets import delta_tables
from incremental_assets.atomic_events import LOAD_DATE
from incremental_assets.assets.limits import BASE_GROUP
from incremental_assets.assets.sessions import LIFECYCLE, LIFECYCLE_SCHEMA, QUARANTINE, read_or_empty, this_run
from incremental_assets.delta_tables import WriteMode
from incremental_assets.environment import source_table_uri
from incremental_assets.incremental import (
    EVENTS_THIS_RUN,
    INCREMENTAL_GROUP,
    INCREMENTAL_TAG,
    Batch,
    process_batch,
    run_key,
)
from incremental_assets.io_managers.delta import delta_table, write_metadata
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms import sessions as T

FILTERED_EVENTS = "filtered_events"


@spark_delta_asset(
    name=EVENTS_THIS_RUN,
    deps=[QUARANTINE],
    group_name=BASE_GROUP,
    description="Scratch table, overwritten every run and stamped with its run: every event of the sessions "
    "active in the window, within each session's cap, deduplicated on event_id (earliest wins).",
)
def events_this_run(
    context: AssetExecutionContext, settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource
) -> MaterializeResult:
    session = spark.session
    key = run_key(context)
    limits = this_run(context, manifest)
    lifecycle = read_or_empty(session, manifest.uri(LIFECYCLE), LIFECYCLE_SCHEMA)
    active = T.sessions_this_run(lifecycle, limits.lower, limits.upper, settings.max_session_days)
    source = delta_tables.read_table(session, source_table_uri())
    events = T.session_events(source, active, settings).cache()
    ts = settings.session_timestamp
    stats = events.agg(
        F.count(F.lit(1)).alias("n"), F.max(ts).alias("batch_max"), F.sum(F.col(T.COPIES) - 1).alias("duplicates")
    ).first()
    uri = manifest.uri(EVENTS_THIS_RUN)
    batch = events.drop(T.COPIES)
    result = delta_tables.write(session, batch, uri, WriteMode.REPLACE, user_metadata=key)
    events.unpersist()
    resume_from = _next_event_after(source, ts, limits.upper) or limits.upper
    record = replace(
        manifest.run_record(key), events_found=stats["n"], batch_max=stats["batch_max"], resume_from=resume_from
    )
    manifest.record_run(session, record, context.run.run_id)
    return MaterializeResult(
        metadata={
            **write_metadata(batch, uri, result),
            "dagster/row_count": stats["n"],
            "events_found": stats["n"],
            "duplicates_dropped": stats["duplicates"] or 0,
            "sessions_this_run": active.count(),
            "batch_max": str(stats["batch_max"]),
            "resume_from": str(resume_from) if resume_from else "",
            "run_key": key,
        }
    )


def _next_event_after(source: DataFrame, ts: str, upper) -> object:
    """Where the next run may start if this window held nothing new: the next source event, so a
    gap in the data costs one run, not one per backfill_limit_days."""
    later = source.where(F.col(ts) > F.lit(upper))
    if LOAD_DATE in source.columns:
        later = later.where(F.col(LOAD_DATE) >= F.lit(upper.date()))
    return later.agg(F.min(ts)).first()[0]


@spark_delta_asset(
    name=FILTERED_EVENTS,
    deps=[EVENTS_THIS_RUN],
    group_name=INCREMENTAL_GROUP,
    tags={INCREMENTAL_TAG: "true"},
    metadata=delta_table("merge_insert", keys=["event_id"], partition_by=["event_date"]),
    description="Deduplicated, filtered, session-complete events, partitioned by event_date. Insert-only on "
    "event_id: an event already stored is never duplicated or overwritten.",
)
def filtered_events(
    context: AssetExecutionContext, settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource
) -> MaterializeResult:
    session = spark.session

    def write(batch: Batch) -> dict:
        kept = batch.events
        if settings.event_names:
            kept = kept.where(F.col("event_name").isin(settings.event_names))
        before_start = F.to_date("derived_tstamp") < F.lit(settings.start)
        counts = kept.agg(
            F.count(F.lit(1)).alias("selected"), F.count_if(before_start).alias("before_start_date")
        ).first()
        rows = kept.where(~before_start).withColumn("event_date", F.to_date("derived_tstamp"))
        floor = rows.agg(F.min("event_date")).first()[0]
        uri = manifest.uri(FILTERED_EVENTS)
        if floor is None:
            return {"new_events": 0, "before_start_date_dropped": counts["before_start_date"]}
        delta_tables.create_with_change_feed(session, uri, rows.schema, ["event_date"])
        result = delta_tables.write(
            session, rows, uri, WriteMode.MERGE_INSERT, keys=["event_id"], partition_by=["event_date"],
            merge_floor=("event_date", floor - timedelta(days=settings.upsert_lookback_days)),
        )
        offered = counts["selected"] - counts["before_start_date"]
        return {
            **write_metadata(rows, uri, result),
            "events_this_run": batch.record.events_found,
            "filtered_out_by_event_name": batch.record.events_found - counts["selected"],
            "before_start_date_dropped": counts["before_start_date"],
            "new_events": result.rows_inserted,
            # read them back with delta_tables.inserted_rows(spark, uri, new_events_version)
            "new_events_version": result.version,
            # events of re-processed sessions, and duplicates of stored events loaded again
            "already_stored": offered - result.rows_inserted,
        }

    return process_batch(context, session, manifest, write)
