"""The session layer (SPEC §5): lifecycle manifest, quarantine, this run's batch, and `sessions`.

Each asset returns its rows; the Delta IO manager writes them in the mode the asset declares.
"""

from datetime import date, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetExecutionContext,
    AssetIn,
    AssetOut,
    Output,
    asset_check,
    multi_asset,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets import delta_tables
from incremental_assets.assets import OWNERS, SPARK_DELTA, spark_delta_asset
from incremental_assets.atomic_events import with_optional_columns
from incremental_assets.checks import from_offending_rows, latest_write, nothing_written
from incremental_assets.environment import source_table_uri, table_uri
from incremental_assets.incremental import incremental_asset
from incremental_assets.io_managers.delta import MERGE_TARGET_FLOOR, ROWS_AT_MOST, delta_table
from incremental_assets.logic.limits import BatchStats, RunLimits
from incremental_assets.names import BASE_GROUP, EVENTS_THIS_RUN, LIFECYCLE, NEW_EVENT_LIMITS, QUARANTINE
from incremental_assets.resources.spark import SparkResource
from incremental_assets.run_state import RunBatch
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms import checks as C
from incremental_assets.transforms import sessions as T

LIFECYCLE_SCHEMA = "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp, start_date date"
QUARANTINE_SCHEMA = "session_identifier string, quarantined_at timestamp"


def read_or_empty(spark, uri: str, schema: str) -> DataFrame:
    """A table's stored rows (state from earlier runs), or none before its first write."""
    if delta_tables.table_exists(uri):
        return spark.read.format("delta").load(uri)
    return spark.createDataFrame([], schema)


def must_write(rows: int, table: str) -> bool:
    """An empty write is skipped, except the first: it creates the table later steps read."""
    return rows > 0 or not delta_tables.table_exists(table_uri(table))


@spark_delta_asset(
    name=LIFECYCLE,
    ins={"limits": AssetIn(NEW_EVENT_LIMITS)},
    group_name=BASE_GROUP,
    metadata=delta_table("upsert", keys=[T.SESSION], partition_by=["start_date"], one_row_per_key=True),
    description="Start and end of every session (first user sticks, end capped at start + max_session_days), "
    "so a new event for an old session re-processes the whole session without scanning all history.",
)
def sessions_lifecycle_manifest(limits: RunLimits, settings: IncrementalSettings, spark: SparkResource) -> Output:
    session = spark.spark_session
    ts = settings.session_timestamp
    source = delta_tables.read_table(session, source_table_uri())
    quarantined = read_or_empty(session, table_uri(QUARANTINE), QUARANTINE_SCHEMA)
    window = T.window_and_null_cursor_rows(source, ts, limits.lower, limits.upper)
    # Cached narrow: the two passes over it need four columns, not the source's hundred.
    classified = T.classify_window(window, quarantined, settings).select(T.SESSION, T.USER, ts, "drop_reason").cache()
    drops = {r["drop_reason"]: r["count"] for r in classified.groupBy("drop_reason").count().collect()}
    null_cursor_rows = drops.pop(T.NULL_CURSOR, 0)
    # Only stored sessions that started within session_lookback_days are matched (and scanned).
    floor = (limits.lower - timedelta(days=settings.session_lookback_days)).date()
    stored = read_or_empty(session, table_uri(LIFECYCLE), LIFECYCLE_SCHEMA).where(F.col("start_date") >= F.lit(floor))
    changes = T.merge_lifecycle(T.new_session_candidates(classified, ts), stored, settings.max_session_days)
    if drops.get(None):
        changes = changes.cache()
        changed = changes.agg(F.count(F.lit(1)).alias("n"), F.min("start_date").alias("first_day")).first()
    else:  # no eligible event, no change: a quiet hour skips the join with the stored sessions
        changed = {"n": 0, "first_day": None}
    classified.unpersist()
    metadata = {
        "events_in_window": sum(drops.values()),
        "eligible_events": drops.get(None, 0),
        "null_cursor_rows": null_cursor_rows,
        **{f"dropped_{reason}": n for reason, n in drops.items() if reason},
        "sessions_new_or_changed": changed["n"],
    }
    if not must_write(changed["n"], LIFECYCLE):
        changes.unpersist()
        return Output(None, metadata=metadata)
    if changed["first_day"] is not None:
        # A change starts no later than the stored row it updates: the MERGE reads from its first day on.
        metadata[MERGE_TARGET_FLOOR] = changed["first_day"].isoformat()
    return Output(changes, metadata={**metadata, ROWS_AT_MOST: changed["n"]})


@asset_check(
    asset=LIFECYCLE,
    blocking=True,
    description="Each session stored once, with start <= end <= start + max_session_days; reads the rows "
    "from the latest write's first changed day on. Blocks the batch, which would follow wrong bounds.",
)
def sessions_unique_and_within_cap(
    context: AssetCheckExecutionContext, spark: SparkResource, settings: IncrementalSettings
) -> AssetCheckResult:
    write = latest_write(context, LIFECYCLE)
    if write is None:
        return nothing_written()
    lifecycle = delta_tables.read_table(spark.spark_session, write["dagster/uri"])
    floor = write.get(MERGE_TARGET_FLOOR)
    if floor:
        lifecycle = lifecycle.where(F.col("start_date") >= F.lit(date.fromisoformat(floor)))
    violations = C.lifecycle_violations(lifecycle, settings.max_session_days)
    return from_offending_rows(violations, "lifecycle rows breaking a rule", f"start_date >= {floor or 'any'}")


@multi_asset(
    name="session_batch",
    ins={"limits": AssetIn(NEW_EVENT_LIMITS), "lifecycle": AssetIn(LIFECYCLE)},
    outs={
        QUARANTINE: AssetOut(
            group_name=BASE_GROUP,
            kinds=SPARK_DELTA,
            owners=OWNERS,
            metadata=delta_table("merge_insert", keys=[T.SESSION], one_row_per_key=True),
            description="Sessions that reached max_session_days (bots): their events stop being processed, so "
            "they stop costing scans. Insert-only.",
        ),
        EVENTS_THIS_RUN: AssetOut(
            group_name=BASE_GROUP,
            kinds=SPARK_DELTA,
            owners=OWNERS,
            metadata=delta_table("replace", stats_columns=[]),  # read whole: statistics would not skip a file
            description="Scratch table, replaced every run: every event of the sessions active in the window, "
            "within each session's cap, deduplicated on event_id (earliest wins). Its metadata says what the "
            "batch found; the incremental assets of the same run consume it.",
        ),
    },
)
def session_batch(
    context: AssetExecutionContext, limits: RunLimits, lifecycle: DataFrame, settings: IncrementalSettings,
    spark: SparkResource,
):
    """The sessions active in the window, computed once: the ones to quarantine, and all their events."""
    ts = settings.session_timestamp
    active = T.sessions_this_run(lifecycle, limits.lower, limits.upper, settings.max_session_days).cache()
    span = T.sessions_span(active, settings.max_session_days)  # on the cached sessions: cheaper than an empty MERGE
    at_cap = span["at_cap"]
    quarantine = None
    if must_write(at_cap, QUARANTINE):
        quarantine = T.newly_quarantined(active, settings.max_session_days, limits.now)
    yield Output(quarantine, QUARANTINE, metadata={"sessions_at_their_cap": at_cap, ROWS_AT_MOST: at_cap})

    source = with_optional_columns(delta_tables.read_table(spark.spark_session, source_table_uri()))
    events = T.session_events(source, active, settings, span)
    # Not cached: these stats need a few narrow columns, which Spark reads and dedupes far cheaper
    # than it would cache every column of a big batch before the write reads it once.
    found = events.agg(
        F.count(F.lit(1)).alias("n"),
        F.max(ts).alias("batch_max"),
        F.sum(F.col(T.COPIES) - 1).alias("duplicates"),
        F.count_distinct(T.SESSION).alias("sessions"),
    ).first() if span["sessions"] else {"n": 0, "batch_max": None, "duplicates": 0, "sessions": 0}
    stats = BatchStats(limits, found["n"], found["batch_max"], T.next_event_after(source, ts, limits.upper, limits.now))
    if stats.events_found == 0:
        context.log.info(f"No eligible events between {limits.lower} and {limits.upper}")
    yield Output(
        RunBatch(events.drop(T.COPIES), stats),
        EVENTS_THIS_RUN,
        metadata={
            "dagster/row_count": stats.events_found,
            "duplicates_dropped": found["duplicates"] or 0,
            "sessions_this_run": found["sessions"],
        },
    )
    active.unpersist()


@incremental_asset(write_mode="upsert", keys=["session_identifier"], one_row_per_key=True)  # grouped by session
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
