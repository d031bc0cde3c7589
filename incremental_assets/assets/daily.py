"""The daily layer (SPEC §7): the daily aggregation manifest, daily_aggregates, attributes."""

import warnings
from datetime import date, timedelta

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets import delta_tables
from incremental_assets.assets import spark_delta_asset
from incremental_assets.assets.events import FILTERED_EVENTS
from incremental_assets.delta_tables import WriteMode
from incremental_assets.incremental import run_key
from incremental_assets.io_managers.delta import delta_table, partition_row_counts, partition_window, write_metadata
from incremental_assets.logic.days import BEYOND_HORIZON, DEFERRED, TO_PROCESS, DayStatus, days_to_process, mark_processed
from incremental_assets.resources.manifests import DAILY_MANIFEST, ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms.daily import attributes_from_daily, daily_partials, day_arrivals
from incremental_assets.utc import utcnow


DAILY_GROUP = "daily"
DAILY_AGGREGATES = "daily_aggregates"



def manifest_table(days: list[DayStatus]) -> MetadataValue:
    """The manifest rows as a readable table in the UI."""
    lines = ["| event_date | status | processed | pending late | late total | max delay h |", "|---|---|---|---|---|---|"]
    for d in sorted(days, key=lambda d: d.event_date):
        lines.append(
            f"| {d.event_date} | {d.status} | {d.processed_events} | {d.pending_late_events} | "
            f"{d.late_events_total} | {d.max_delay_hours:.1f} |"
        )
    return MetadataValue.md("\n".join(lines))


@spark_delta_asset(
    name=DAILY_MANIFEST,
    deps=[FILTERED_EVENTS],
    group_name=DAILY_GROUP,
    description="One row per event day: events processed, late events pending or applied, and the status "
    "(processed, to_process, deferred, beyond_horizon) that decides which days are recomputed.",
)
def daily_aggregation_manifest(
    context: AssetExecutionContext, settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource
) -> MaterializeResult:
    session = spark.session
    uri = manifest.uri(FILTERED_EVENTS)
    if not delta_tables.table_exists(session, uri):
        return MaterializeResult(metadata={"days_changed": 0, "skipped": "no filtered_events yet"})
    current = delta_tables.last_commit(session, uri).version
    consumed = manifest.consumed_version()
    if consumed is not None and consumed >= current:
        return MaterializeResult(metadata={"days_changed": 0, "filtered_events_version": current})
    # Every insert since the last version counted, so a crashed or skipped run loses nothing.
    first_unread = 0 if consumed is None else consumed + 1
    arrivals = day_arrivals(delta_tables.inserted_rows(session, uri, first_unread, current))
    record = manifest.run_record(run_key(context))
    upper = record.limits.upper if record else utcnow()
    changed = days_to_process(
        arrivals, manifest.days(), upper, settings.start, settings.reprocess_days,
        settings.min_rows_to_process, context.run.run_id,
    )
    manifest.save_days(session, list(changed.values()), consumed_version=current)
    by_status = {s: sorted(str(d.event_date) for d in changed.values() if d.status == s) for s in (TO_PROCESS, DEFERRED, BEYOND_HORIZON)}
    return MaterializeResult(
        metadata={
            "days_changed": len(changed),
            "days_to_process": MetadataValue.json(by_status[TO_PROCESS]),
            "days_deferred": MetadataValue.json(by_status[DEFERRED]),
            "days_beyond_horizon": MetadataValue.json(by_status[BEYOND_HORIZON]),
            "new_rows_counted": sum(a.rows for a in arrivals),
            "filtered_events_version": current,
            "manifest": manifest_table(list(manifest.days().values())),
        }
    )


def build_daily_assets(start_date: date):
    """daily_aggregates is partitioned by day from the deployment's start_date (read at load)."""
    partitions = DailyPartitionsDefinition(start_date=start_date.isoformat(), timezone="UTC")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)  # backfill_policy is beta in Dagster 1.13
        return _daily_aggregates(partitions)


def _daily_aggregates(partitions: DailyPartitionsDefinition):
    @spark_delta_asset(
        name=DAILY_AGGREGATES,
        deps=[FILTERED_EVENTS, DAILY_MANIFEST],
        group_name=DAILY_GROUP,
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.single_run(),
        metadata=delta_table("replace_partition", partition_by=["event_date"], partition_column="event_date"),
        description="One row per (attribute_key, event_date) with an exact per-day partial of every declared "
        "attribute. A partition is always recomputed whole from filtered_events (replaceWhere on its days).",
    )
    def daily_aggregates(
        context: AssetExecutionContext, settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource
    ) -> MaterializeResult:
        session = spark.session
        window = partition_window("event_date", context.partition_time_window)
        events = delta_tables.read_table(session, manifest.uri(FILTERED_EVENTS))
        day_events = events.where(window.condition(events.schema["event_date"].dataType))
        partials = daily_partials(day_events, settings.attribute_specs(), settings.attribute_key).cache()
        uri = manifest.uri(DAILY_AGGREGATES)
        result = delta_tables.write(
            session, partials, uri, WriteMode.REPLACE_PARTITION, partition_by=["event_date"], window=window
        )
        per_day = {r.event_date: r.events for r in partials.groupBy("event_date").agg(F.sum("events").alias("events")).collect()}
        partials.unpersist()
        _record_days(context, manifest, session, window, per_day, uri)
        return MaterializeResult(metadata={**write_metadata(partials, uri, result), "days_recomputed": len(per_day)})

    return daily_aggregates


def _record_days(context, manifest: ManifestResource, session, window, per_day: dict, uri: str) -> None:
    """Per-partition metadata, then every recomputed day marked processed with its pending reset."""
    keys = context.partition_keys
    rows = partition_row_counts(session, uri, window, context.assets_def.partitions_def, keys)
    known = manifest.days()
    now = utcnow()
    processed = []
    for key in keys:
        day = date.fromisoformat(key)
        events = per_day.get(day, 0)
        context.add_asset_metadata({"dagster/row_count": rows[key], "events": events}, partition_key=key)
        if events or day in known:
            processed.append(mark_processed(known.get(day) or DayStatus(day), events, now, context.run.run_id))
    manifest.save_days(session, processed)


@spark_delta_asset(
    deps=[DAILY_AGGREGATES],
    group_name=DAILY_GROUP,
    metadata=delta_table("replace"),
    description="One row per attribute_key: every declared attribute (lifetime or last N days), dropped and "
    "recomputed from daily_aggregates.",
)
def attributes(settings: IncrementalSettings, spark: SparkResource, manifest: ManifestResource) -> DataFrame:
    daily = delta_tables.read_table(spark.session, manifest.uri(DAILY_AGGREGATES))
    return attributes_from_daily(daily, settings.attribute_specs(), settings.reference_day())


def days_window_tags(first: date, last: date) -> dict[str, str]:
    """Run tags that make one run (one Spark session) materialize the days [first, last]."""
    return {"dagster/asset_partition_range_start": first.isoformat(), "dagster/asset_partition_range_end": last.isoformat()}


def day_range(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]
