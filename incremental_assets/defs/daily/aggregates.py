"""The daily layer: the daily aggregation manifest, daily_aggregates, attributes."""

import warnings
from datetime import date

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    Definitions,
    MetadataValue,
    Output,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.defs.daily.changed_keys import BuiltFrom, of_keys, since_last_write
from incremental_assets.defs.daily.history import BUILT_FROM as HISTORY_BUILT_FROM
from incremental_assets.lib.catalog import ATTRIBUTES, ATTRIBUTES_HISTORY, DAILY_AGGREGATES, DAILY_GROUP, DAILY_MANIFEST, FILTERED_EVENTS
from incremental_assets.lib.checks import from_offending_rows, latest_write, nothing_written, sums_by
from incremental_assets.lib.delta.read import count_by, naming, read_table, read_to_check
from incremental_assets.lib.delta.spec import Rows, Stored, delta_table, partition_window
from incremental_assets.lib.environment import table_uri
from incremental_assets.lib.assets import spark_delta_asset, warehouse_check
from incremental_assets.lib.attributes import AttributeSpec
from incremental_assets.lib.incremental.days import mismatched_days, processed_days
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.settings_plan import start_writing
from incremental_assets.lib.state.store import StateStore, run_of
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms.daily import attribute_changes, attributes_from_daily, current_attributes, daily_partials
from incremental_assets.lib.utc import utcnow

RECONCILES = "reconciles_with_filtered_events"
ATTRIBUTES_BUILT_FROM = "attributes_built_from"  # the mark in each write's commit (changed_keys.BuiltFrom)


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
        metadata=delta_table("replace_partition", partition_by=["event_date"], partition_column="event_date"),
        description="One row per (attribute_key, event_date) with an exact per-day partial of every declared "
        "attribute. A partition is always recomputed whole from filtered_events (replaceWhere on its days).",
    )
    def daily_aggregates(
        context: AssetExecutionContext, filtered_events: Stored, settings: IncrementalSettings, state: StateStore,
        spark: SparkResource,
    ):
        start_writing(context, settings, state)  # a day aggregated under other definitions would mix
        window = partition_window("event_date", context.partition_time_window)
        # What filtered_events holds for those days (from its log's file statistics: no scan): the
        # session and Spark's settings for that many rows (a run of days in a process of its own
        # starts its driver for them), and what the stored aggregates must reconcile with.
        held = count_by(lambda: spark.spark_session, table_uri(FILTERED_EVENTS), "event_date", window)
        session = spark.session_for(sum(held.values()))
        events = filtered_events.frame
        day_events = events.where(window.condition(events.schema["event_date"].dataType))
        partials = daily_partials(day_events, settings.attribute_specs(), settings.attribute_key).cache()
        per_day = {r.event_date: r.events for r in partials.groupBy("event_date").agg(F.sum("events").alias("events")).collect()}
        yield Output(
            Rows(partials, rows_at_most=sum(held.values())),  # a partial per key and day: at most one per event
            metadata={
                "events_per_day": MetadataValue.json({day.isoformat(): n for day, n in sorted(per_day.items())}),
                "days_with_events": len(per_day),
            },
        )
        # The IO manager has replaced the window: its days are processed, their late events applied.
        run_id = run_of(context)
        if run_id is not None:
            days = [date.fromisoformat(key) for key in context.partition_keys]
            state.save_days(processed_days(days, per_day, state.days(), utcnow(), run_id))
        # The IO manager has written the window: reconcile what is stored for those days with the
        # rows filtered_events holds for them.
        days = [("event_date", ">=", window.start.date()), ("event_date", "<", window.end.date())]
        stored = read_to_check(session, table_uri(DAILY_AGGREGATES), ["event_date", "events"], days)
        aggregated = sums_by(stored, "event_date", "events")
        scope = f"event_date in [{window.start.date()}, {window.end.date()})"
        yield from_offending_rows(mismatched_days(aggregated, held), "days whose aggregates disagree with filtered_events", scope)

    return daily_aggregates


@spark_delta_asset(
    ins={"daily": AssetIn(DAILY_AGGREGATES)},
    deps=[ATTRIBUTES_HISTORY],
    group_name=DAILY_GROUP,
    metadata=delta_table("apply_changes", keys=["attribute_key"], stats_columns=["attribute_key"]),
    description="One row per attribute_key: every declared attribute (lifetime or last N days) as of the reference "
    "day. Kept from daily_aggregates: a run recomputes the keys whose daily rows changed since its last write, and "
    "those whose last-N-days values age out, and writes the rows that differ. Their values are attributes_history's "
    "current intervals when the history's newest write was built from the same daily_aggregates and day (the same "
    "values, at the cost of the keys), else each key's every partial.",
)
def attributes(
    context: AssetExecutionContext, daily: Stored, settings: IncrementalSettings, state: StateStore, spark: SparkResource
):
    start_writing(context, settings, state)  # a run of attributes alone (attributes_after_daily_aggregates)
    specs, through = settings.attribute_specs(), settings.reference_day()
    found = since_last_write(spark.session_for, daily, table_uri(ATTRIBUTES), table_uri(DAILY_AGGREGATES),
                             ATTRIBUTES_BUILT_FROM, specs, through, lambda stored: F.lit(through))
    if found.keys is None:
        yield Output(Rows(None), metadata={"recomputed": f"nothing: daily_aggregates unchanged since version {found.before.version}"})
        return
    keys = found.keys.select("attribute_key").cache()
    count_keys = keys.count()
    named = naming(keys, "attribute_key", count_keys)
    fresh, values_from = recomputed(daily, keys, named, specs, found.now)
    stored = of_keys(found.stored, table_uri(ATTRIBUTES), named)
    changes = attribute_changes(fresh, stored, keys).cache()
    count = changes.count()
    scope = "every key" if found.before is None else f"the keys daily_aggregates changed since version {found.before.version}"
    context.log.info(f"attributes: {scope} ({count_keys} keys), as of {through}, from {values_from}: {count} rows to write")
    yield Output(
        Rows(changes if count else None, rows_at_most=count, marker=found.now.as_marker(ATTRIBUTES_BUILT_FROM)),
        metadata={"recomputed": scope, "keys_recomputed": count_keys, "values_from": values_from,
                  "reference_day": through.isoformat()},
    )
    changes.unpersist()
    keys.unpersist()


def recomputed(daily: Stored, keys: DataFrame, named: list[tuple], specs: list[AttributeSpec], now: BuiltFrom) -> tuple[DataFrame, str]:
    """The attributes of `keys` as of `now`'s day, and where they come from: attributes_history's
    current intervals when its newest commit was built from `now` (any change after it, a refresh,
    an erasure or maintenance, is that commit), else each key's every partial: a run of attributes
    alone, or a history behind."""
    history = table_uri(ATTRIBUTES_HISTORY)
    if BuiltFrom.stored(history, HISTORY_BUILT_FROM, within=1) == now:
        rows = of_keys(read_table(daily.frame.sparkSession, history), history, named)
        return current_attributes(rows, keys, specs), f"attributes_history's current intervals (daily_aggregates version {now.version})"
    partials = of_keys(daily.frame, table_uri(DAILY_AGGREGATES), named).join(F.broadcast(keys), "attribute_key")
    return attributes_from_daily(partials, specs, now.through), "every partial of daily_aggregates"


@warehouse_check(asset="attributes", description="One row per attribute_key, in the whole table.")
def one_row_per_attribute_key(context: AssetCheckExecutionContext, spark: SparkResource) -> AssetCheckResult:
    write = latest_write(context, "attributes")
    if write is None:
        return nothing_written()
    keys = read_to_check(spark.spark_session, write["dagster/uri"], ["attribute_key"])
    return from_offending_rows(V.duplicated(keys, ["attribute_key"]), "attribute keys with several rows", "the whole table")


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(assets=[build_daily_assets(settings.start), attributes], asset_checks=[one_row_per_attribute_key])
