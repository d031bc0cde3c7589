"""The daily layer (SPEC §7): the daily aggregation manifest, daily_aggregates, attributes."""

import warnings
from datetime import date, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    Output,
    asset_check,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets import delta_tables
from incremental_assets.assets import spark_delta_asset
from incremental_assets.checks import from_offending_rows, latest_write, nothing_written
from incremental_assets.environment import table_uri
from incremental_assets.io_managers.delta import EVENTS_PER_DAY, delta_table, partition_window
from incremental_assets.logic.days import (
    BEYOND_HORIZON,
    DEFERRED,
    TO_PROCESS,
    DayStatus,
    contiguous_ranges,
    days_to_process,
    mismatched_days,
)
from incremental_assets.plans import start_writing
from incremental_assets.run_state import RunPlan
from incremental_assets.previews import markdown_table
from incremental_assets.names import DAILY_AGGREGATES, DAILY_GROUP, FILTERED_EVENTS, NEW_EVENT_LIMITS
from incremental_assets.resources.manifests import DAILY_MANIFEST, ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms import checks as C
from incremental_assets.transforms.daily import attributes_from_daily, daily_partials, day_arrivals

RECONCILES = "reconciles_with_filtered_events"


def manifest_table(days: list[DayStatus]) -> MetadataValue:
    """The manifest rows as a readable table in the UI."""
    return markdown_table(
        ["event_date", "status", "processed", "pending late", "late total", "max delay h"],
        [
            [d.event_date, d.status, d.processed_events, d.pending_late_events, d.late_events_total, f"{d.max_delay_hours:.1f}"]
            for d in sorted(days, key=lambda d: d.event_date)
        ],
    )


@spark_delta_asset(
    name=DAILY_MANIFEST,
    ins={"plan": AssetIn(NEW_EVENT_LIMITS)},
    deps=[FILTERED_EVENTS],
    group_name=DAILY_GROUP,
    description="One row per event day: events processed, late events pending or applied, and the status "
    "(processed, to_process, deferred, beyond_horizon) that decides which days are recomputed.",
)
def daily_aggregation_manifest(
    context: AssetExecutionContext, plan: RunPlan, settings: IncrementalSettings, spark: SparkResource,
    manifest: ManifestResource,
) -> MaterializeResult:
    session = spark.spark_session
    uri = manifest.uri(FILTERED_EVENTS)
    current = delta_tables.table_version(uri)
    if current is None:
        return MaterializeResult(metadata={"days_changed": 0, "skipped": "no filtered_events yet"})
    consumed = manifest.consumed_version()
    if consumed is not None and consumed >= current:
        return MaterializeResult(metadata={"days_changed": 0, "filtered_events_version": current})
    # Every insert since the last version counted, so a crashed or skipped run loses nothing.
    first_unread = 0 if consumed is None else consumed + 1
    arrivals = day_arrivals(delta_tables.inserted_rows(session, uri, first_unread, current))
    changed = days_to_process(
        arrivals, manifest.days(), plan.limits.upper, settings.start, settings.reprocess_days,
        settings.min_rows_to_process, context.run.run_id,
    )
    manifest.save_days(list(changed.values()), consumed_version=current)
    by_status = {
        status: sorted(str(d.event_date) for d in changed.values() if d.status == status)
        for status in (TO_PROCESS, DEFERRED, BEYOND_HORIZON)
    }
    waiting = {status: sum(d.pending_late_events for d in changed.values() if d.status == status) for status in (DEFERRED, BEYOND_HORIZON)}
    return MaterializeResult(
        metadata={
            "days_changed": len(changed),
            "days_to_process": MetadataValue.json(by_status[TO_PROCESS]),
            "days_deferred": MetadataValue.json(by_status[DEFERRED]),
            "days_beyond_horizon": MetadataValue.json(by_status[BEYOND_HORIZON]),
            "new_rows_counted": sum(a.rows for a in arrivals),
            "late_events_deferred": waiting[DEFERRED],
            "late_events_beyond_horizon": waiting[BEYOND_HORIZON],
            "filtered_events_version": current,
            "manifest": manifest_table(list(manifest.days().values())),
        }
    )


def build_daily_assets(start_date: date):
    """daily_aggregates is partitioned by day from the deployment's start_date (from its settings)
    to today: the day in progress has a partition too, which hourly runs keep up to date."""
    partitions = DailyPartitionsDefinition(start_date=start_date.isoformat(), timezone="UTC", end_offset=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)  # backfill_policy is beta in Dagster 1.13
        return _daily_aggregates(partitions)


def _daily_aggregates(partitions: DailyPartitionsDefinition):
    @spark_delta_asset(
        name=DAILY_AGGREGATES,
        ins={"filtered_events": AssetIn(FILTERED_EVENTS)},
        deps=[DAILY_MANIFEST],
        group_name=DAILY_GROUP,
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.single_run(),
        check_specs=[
            AssetCheckSpec(
                RECONCILES,
                asset=DAILY_AGGREGATES,
                blocking=True,
                description="Each day of the run's partitions aggregates exactly the events filtered_events holds "
                "for it; checked with every partition or range, on those days only.",
            )
        ],
        metadata=delta_table(
            "replace_partition", partition_by=["event_date"], partition_column="event_date", progress="daily"
        ),
        description="One row per (attribute_key, event_date) with an exact per-day partial of every declared "
        "attribute. A partition is always recomputed whole from filtered_events (replaceWhere on its days).",
    )
    def daily_aggregates(
        context: AssetExecutionContext, filtered_events: DataFrame, settings: IncrementalSettings, manifest: ManifestResource
    ):
        start_writing(context, settings, manifest)  # a day aggregated under other definitions would mix
        window = partition_window("event_date", context.partition_time_window)
        day_events = filtered_events.where(window.condition(filtered_events.schema["event_date"].dataType))
        partials = daily_partials(day_events, settings.attribute_specs(), settings.attribute_key).cache()
        per_day = partials.groupBy("event_date").agg(F.sum("events").alias("events")).collect()
        yield Output(
            partials,
            metadata={
                EVENTS_PER_DAY: MetadataValue.json({r.event_date.isoformat(): r.events for r in per_day}),
                "days_with_events": len(per_day),
            },
        )
        # The IO manager has written the window: reconcile what is stored for those days with the
        # rows filtered_events holds for them (counted from its log's file statistics: no scan).
        spark = filtered_events.sparkSession
        stored = delta_tables.read_table(spark, table_uri(DAILY_AGGREGATES))
        per_day = stored.where(window.condition(stored.schema["event_date"].dataType)).groupBy("event_date")
        aggregated = {r.event_date: r.events for r in per_day.agg(F.sum("events").alias("events")).collect()}
        held = delta_tables.count_by(spark, table_uri(FILTERED_EVENTS), "event_date", window)
        scope = f"event_date in [{window.start.date()}, {window.end.date()})"
        yield from_offending_rows(mismatched_days(aggregated, held), "days whose aggregates disagree with filtered_events", scope)

    return daily_aggregates


@spark_delta_asset(
    ins={"daily": AssetIn(DAILY_AGGREGATES)},
    group_name=DAILY_GROUP,
    metadata=delta_table("replace"),
    description="One row per attribute_key: every declared attribute (lifetime or last N days), dropped and "
    "recomputed from daily_aggregates.",
)
def attributes(daily: DataFrame, settings: IncrementalSettings) -> DataFrame:
    return attributes_from_daily(daily, settings.attribute_specs(), settings.reference_day())


@asset_check(asset="attributes", description="One row per attribute_key (the table is rebuilt whole on each write).")
def one_row_per_attribute_key(context: AssetCheckExecutionContext, spark: SparkResource) -> AssetCheckResult:
    write = latest_write(context, "attributes")
    if write is None:
        return nothing_written()
    keys = delta_tables.read_table(spark.spark_session, write["dagster/uri"]).select("attribute_key")
    return from_offending_rows(C.duplicated(keys, ["attribute_key"]), "attribute keys with several rows", "the whole table")


def requested_day_ranges(days: dict[date, DayStatus], today: date) -> list[tuple[date, date]]:
    """What the daily sensor and `incremental-assets run` request: one run per range of days to
    process, up to today (the last partition). A later day (events stamped in the future) stays
    to_process until its partition exists."""
    return contiguous_ranges(day for day, status in days.items() if status.status == TO_PROCESS and day <= today)


def days_window_tags(first: date, last: date) -> dict[str, str]:
    """Run tags that make one run (one Spark session) materialize the days [first, last]."""
    return {"dagster/asset_partition_range_start": first.isoformat(), "dagster/asset_partition_range_end": last.isoformat()}


def day_range(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]
