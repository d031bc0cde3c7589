"""filtered_events: the persistent, deduplicated, session-complete event table."""

from datetime import date, datetime, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    Definitions,
    MetadataValue,
    Output,
)
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.assets import warehouse_check
from incremental_assets.lib.catalog import FILTERED_EVENTS, INCREMENTAL_MANIFEST, LIFECYCLE
from incremental_assets.lib.checks import from_offending_rows, latest_write, nothing_written
from incremental_assets.lib.delta.log import partitions_added, stored_max
from incremental_assets.lib.delta.read import inserted_rows, inserted_as_read, read_just_written, read_to_check
from incremental_assets.lib.delta.spec import Rows
from incremental_assets.lib.environment import table_uri
from incremental_assets.lib.incremental.asset import incremental_asset
from incremental_assets.lib.incremental.limits import RunLimits
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.run_log import ROWS_KEPT, ROWS_READ
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms.sessions import SESSION
from incremental_assets.lib.utc import naive


@incremental_asset(
    FILTERED_EVENTS,
    write_mode="merge_insert",
    keys=["event_id"],
    partition_by=["event_date"],
    change_feed=True,
    # Files hold days of events, so time bounds skip files; random event ids and strings would not.
    stats_columns=["derived_tstamp", "collector_tstamp", "load_tstamp"],
    one_row_per_key=True,  # events_this_run holds one row per event_id
    description="Deduplicated, filtered, session-complete events, partitioned by event_date. Insert-only on "
    "event_id: an event already stored is never duplicated or overwritten; the rows a run inserted (its "
    "change feed) drive the daily layer.",
)
def filtered_events(events: DataFrame, limits: RunLimits, settings: IncrementalSettings) -> Output:
    selected = F.col("event_name").isin(settings.event_names) if settings.event_names else F.lit(True)
    undated = F.col("derived_tstamp").isNull()  # no event_date to store it under
    before_start = F.to_date("derived_tstamp") < F.lit(settings.start)
    kept = selected & ~undated & ~before_start
    # The window's events are accounted for (the run log's read = kept + skipped); the batch's
    # other events (earlier ones of its sessions) were, by the run whose window held them.
    inside = F.col(settings.session_timestamp).between(F.lit(limits.lower), F.lit(limits.upper))
    counts = events.agg(
        F.count(F.lit(1)).alias("events"),
        F.count_if(inside).alias("read"),
        F.count_if(inside & ~selected).alias("filtered_out_by_event_name"),
        F.count_if(inside & selected & undated).alias("dropped_null_derived_tstamp"),
        F.count_if(inside & selected & before_start).alias("before_start_date_dropped"),
        F.count_if(inside & kept).alias("kept"),
        F.count_if(kept).alias("offered"),
        F.min(F.when(kept, F.to_date("derived_tstamp"))).alias("first_day"),
    ).first()
    metadata = {
        "events_this_run": counts["events"],
        ROWS_READ: counts["read"],
        ROWS_KEPT: counts["kept"],  # stored: inserted now, or held already (insert-only MERGE on event_id)
        "filtered_out_by_event_name": counts["filtered_out_by_event_name"],
        "dropped_null_derived_tstamp": counts["dropped_null_derived_tstamp"],
        "before_start_date_dropped": counts["before_start_date_dropped"],
        # offered - rows_inserted = events of re-processed sessions, and duplicates loaded again
        "events_offered": counts["offered"],
    }
    if not counts["offered"]:
        return Output(None, metadata=metadata)
    rows = events.where(kept).withColumn("event_date", F.to_date("derived_tstamp"))
    floor = settings.upsert_floor(counts["first_day"])
    return Output(Rows(rows, merge_floor=floor, rows_at_most=counts["offered"]), metadata=metadata)


@warehouse_check(
    asset=FILTERED_EVENTS,
    blocking=True,
    description="No event stored twice: every event_id in the days the latest write inserted into is held by "
    "one row there (across the upsert lookback, the MERGE itself refuses a second copy).",
)
def event_id_unique(context: AssetCheckExecutionContext, spark: SparkResource) -> AssetCheckResult:
    """The days the latest write inserted into come from its commit's files in the log; every id of
    those days is counted, not only the inserted ones: one aggregation, no join with the inserts."""
    write = latest_write(context, FILTERED_EVENTS)
    if write is None:
        return nothing_written()
    uri, version = write["dagster/uri"], write["delta_version"]
    days = partitions_added(uri, version, "event_date")
    ids = read_to_check(spark.spark_session, uri, ["event_id"], [("event_date", "in", days)])
    scope = f"every id in the {len(days)} day(s) version {version} inserted into"
    return from_offending_rows(V.duplicated_event_ids(ids), "event_ids stored more than once", scope)


@warehouse_check(
    asset=FILTERED_EVENTS,
    blocking=True,
    description="No event beyond its session's cap: each event the latest write inserted lies within "
    "[start, start + max_session_days] of its session in the lifecycle manifest.",
)
def events_within_session_cap(
    context: AssetCheckExecutionContext, spark: SparkResource, settings: IncrementalSettings
) -> AssetCheckResult:
    """The rows the latest write inserted, from its change feed, against the sessions that could
    hold them: those started from `max_session_days` (and a day for time zones) before the earliest.
    A session started earlier holds none of them within its cap, so the pass is the same as
    against the whole manifest, whose read grew with history; a failure is shown from the whole."""
    write = latest_write(context, FILTERED_EVENTS)
    if write is None:
        return nothing_written()
    session, ts, cap = spark.spark_session, settings.session_timestamp, settings.max_session_days
    uri, version, columns = write["dagster/uri"], write["delta_version"], ["event_id", SESSION, ts]
    inserted = inserted_as_read(session, uri, version, columns, write.get("rows_inserted"))
    in_arrow = isinstance(inserted, pa.Table)
    earliest = pc.min(inserted[ts]).as_py() if in_arrow else inserted.agg(F.min(ts)).first()[0]
    since = None if earliest is None else (earliest - timedelta(days=cap + 1)).date()

    def against(first_day: date | None) -> AssetCheckResult:
        sessions = [] if first_day is None else [("start_date", ">=", first_day)]
        # Rows in Spark meet the sessions in Spark; rows in Arrow, the sessions as read (Spark's when many).
        read = read_to_check if in_arrow else read_just_written
        lifecycle = read(session, table_uri(LIFECYCLE), [SESSION, "start_tstamp"], sessions)
        events = inserted if in_arrow == isinstance(lifecycle, pa.Table) else inserted_rows(session, uri, version).select(*columns)
        beyond = V.events_beyond_cap(events, lifecycle, ts, cap)
        scope = f"rows inserted by version {version}, against the sessions started " + (
            "on any day" if first_day is None else f"from {first_day} on")
        return from_offending_rows(beyond, "events outside their session's span", scope)

    checked = against(since)
    return checked if checked.passed or since is None else against(None)


@warehouse_check(
    asset=FILTERED_EVENTS,
    description="The incremental manifest claims no more than the tables hold: each asset's last_success is at "
    "most the greatest cursor value stored (the latest session end in the lifecycle manifest, which every "
    "processed event lies within). A manifest ahead of its data would make the next runs skip events.",
)
def manifest_consistent_with_tables(state: StateStore) -> AssetCheckResult:
    """Reads the manifest's rows and the lifecycle's file statistics: no Spark job. Delta keeps
    timestamp statistics to the millisecond, so positions are compared to the millisecond."""
    stored = naive(stored_max(state.uri(LIFECYCLE), "end_tstamp"))
    ahead = sorted(
        (entry.model, str(entry.last_success))
        for entry in state.entries().values()
        if entry.last_success is not None and (stored is None or _to_the_millisecond(entry.last_success) > stored)
    )
    return AssetCheckResult(
        passed=not ahead,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "greatest_cursor_value_stored": str(stored),
            "ahead_of_the_tables": MetadataValue.json([{"model": m, "last_success": t} for m, t in ahead]),
        },
        description=f"{INCREMENTAL_MANIFEST} is past the data stored ({stored}) for {[m for m, _ in ahead]}" if ahead else None,
    )


def _to_the_millisecond(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(assets=[filtered_events], asset_checks=[event_id_unique, events_within_session_cap, manifest_consistent_with_tables])
