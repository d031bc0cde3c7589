"""filtered_events (SPEC §6): the persistent, deduplicated, session-complete event table."""

from datetime import timedelta

from dagster import Output
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.incremental import incremental_asset
from incremental_assets.io_managers.delta import MERGE_TARGET_FLOOR
from incremental_assets.logic.limits import RunLimits
from incremental_assets.names import FILTERED_EVENTS
from incremental_assets.settings import IncrementalSettings


@incremental_asset(
    FILTERED_EVENTS,
    write_mode="merge_insert",
    keys=["event_id"],
    partition_by=["event_date"],
    change_feed=True,
    # Files hold days of events, so time bounds skip files; random event ids and strings would not.
    stats_columns=["derived_tstamp", "collector_tstamp", "load_tstamp"],
    description="Deduplicated, filtered, session-complete events, partitioned by event_date. Insert-only on "
    "event_id: an event already stored is never duplicated or overwritten; the rows a run inserted (its "
    "change feed) drive the daily layer.",
)
def filtered_events(events: DataFrame, limits: RunLimits, settings: IncrementalSettings) -> Output:
    selected = F.col("event_name").isin(settings.event_names) if settings.event_names else F.lit(True)
    before_start = F.to_date("derived_tstamp") < F.lit(settings.start)
    kept = selected & ~before_start
    counts = events.agg(
        F.count(F.lit(1)).alias("events"),
        F.count_if(~selected).alias("filtered_out_by_event_name"),
        F.count_if(selected & before_start).alias("before_start_date_dropped"),
        F.count_if(kept).alias("offered"),
        F.min(F.when(kept, F.to_date("derived_tstamp"))).alias("first_day"),
    ).first()
    metadata = {
        "events_this_run": counts["events"],
        "filtered_out_by_event_name": counts["filtered_out_by_event_name"],
        "before_start_date_dropped": counts["before_start_date_dropped"],
        # offered - rows_inserted = events of re-processed sessions, and duplicates loaded again
        "events_offered": counts["offered"],
    }
    if not counts["offered"]:
        return Output(None, metadata=metadata)
    # A stored copy of an event lies within upsert_lookback_days of the new one: prune the MERGE there.
    floor = counts["first_day"] - timedelta(days=settings.upsert_lookback_days)
    rows = events.where(kept).withColumn("event_date", F.to_date("derived_tstamp"))
    return Output(rows, metadata={**metadata, MERGE_TARGET_FLOOR: floor.isoformat()})
