"""daily_aggregation_manifest: per event day, what was processed and which late
events wait, deciding which days the daily layer recomputes; and the warning about late events
beyond the horizon."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetIn,
    Definitions,
    MaterializeResult,
    MetadataValue,
)

from incremental_assets.lib.catalog import DAILY_GROUP, DAILY_MANIFEST, FILTERED_EVENTS, NEW_EVENT_LIMITS
from incremental_assets.lib.delta.log import UnreadableTableError, commit_gone, rows_added, table_version
from incremental_assets.lib.delta.read import inserted_as_read
from incremental_assets.lib.assets import spark_delta_asset, warehouse_check
from incremental_assets.lib.incremental.days import days_to_process, stranded, stranded_note
from incremental_assets.lib.incremental.run_plan import RunPlan
from incremental_assets.lib.metadata import markdown_table
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.records import BEYOND_HORIZON, DEFERRED, TO_PROCESS, DayStatus
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.daily import TIMESTAMP, day_arrivals


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
    state: StateStore,
) -> MaterializeResult:
    uri = state.uri(FILTERED_EVENTS)
    current = table_version(uri)
    if current is None:
        return MaterializeResult(metadata={"days_changed": 0, "skipped": "no filtered_events yet"})
    consumed = state.read_past_unchanged()
    if consumed is not None and consumed >= current:
        return MaterializeResult(metadata={"days_changed": 0, "filtered_events_version": current})
    # Every insert since the last version counted, so a crashed or skipped run loses nothing.
    first_unread = 0 if consumed is None else consumed + 1
    if commit_gone(uri, first_unread):
        raise UnreadableTableError(
            f"{uri}: commit {first_unread}, the first the daily aggregation manifest has not counted, is gone from the "
            "log (Delta's log cleanup after delta.logRetentionDuration), so the days its rows changed cannot be read: "
            "a full refresh (incremental-assets refresh, with allow_refresh) rebuilds the warehouse from the source"
        )
    # A few hours' inserts are read from deltalake's change feed and counted in Arrow, with no Spark job.
    inserted = inserted_as_read(spark.spark_session, uri, first_unread, ["event_date", "load_tstamp", TIMESTAMP],
                                 rows_added(uri, first_unread, current), current)
    arrivals = day_arrivals(inserted)
    changed = days_to_process(
        arrivals, state.days(), plan.limits.upper, settings.start, settings.reprocess_days,
        settings.min_rows_to_process, context.run.run_id, asked=not plan.limits.moves_manifest,
    )
    state.save_days(list(changed.values()), consumed_version=current)
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
            "manifest": manifest_table(list(state.days().values())),
        }
    )


@warehouse_check(
    asset=DAILY_MANIFEST,
    description="Warns about late events beyond reprocess_days: they are counted but will only be applied "
    "by a partition backfill of their days (incremental-assets backfill, or the UI).",
)
def late_events_stranded_beyond_horizon(state: StateStore) -> AssetCheckResult:
    days = stranded(state.days())
    pending = sum(d.pending_late_events for d in days)
    return AssetCheckResult(
        passed=not days,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "days": MetadataValue.json([str(d.event_date) for d in days]),
            "pending_late_events": pending,
        },
        description=stranded_note(days),
    )


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(assets=[daily_aggregation_manifest], asset_checks=[late_events_stranded_beyond_horizon])
