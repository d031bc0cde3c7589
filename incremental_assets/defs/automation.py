"""What runs by itself: the incremental and daily jobs, the sensors that request them, and the
hourly schedule. Sensors read Delta logs and the small state tables without a JVM (deltalake),
and the Dagster instance; they never start Spark."""

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    sensor,
)

from incremental_assets.lib.catalog import (
    APPLY_PLAN_JOB,
    ATTRIBUTES,
    BASE_GROUP,
    DAILY_AGGREGATES,
    DAILY_JOB,
    DAILY_MANIFEST,
    EVENTS_THIS_RUN,
    FRESHNESS_CHECKS,
    INCREMENTAL_JOB,
    INCREMENTAL_MANIFEST,
    INCREMENTAL_TAG,
    WAREHOUSE_WRITER_TAGS,
    known_incremental,
)
from incremental_assets.lib.delta.log import table_version
from incremental_assets.lib.environment import source_table_uri
from incremental_assets.lib.incremental.days import days_window_tags, requested_day_ranges
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.hooks import RUN_LOG_HOOKS
from incremental_assets.lib.state.plan import pending_plan
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
# The freshness checks are evaluated by their own sensor (definitions.py), not as steps of a run.
NOT_IN_RUNS = AssetSelection.checks(*FRESHNESS_CHECKS)

incremental_job = define_asset_job(
    INCREMENTAL_JOB,
    # the base chain, every incremental asset (a user's own, in any group), the daily manifest
    selection=(AssetSelection.groups(BASE_GROUP) | AssetSelection.tag(INCREMENTAL_TAG, "true")
               | AssetSelection.assets(DAILY_MANIFEST)) - NOT_IN_RUNS,
    tags=WAREHOUSE_WRITER_TAGS,
    hooks=RUN_LOG_HOOKS,
    description="One incremental run: limits, session layer, events this run, then the incremental assets.",
)

daily_job = define_asset_job(
    DAILY_JOB,
    selection=AssetSelection.assets(DAILY_AGGREGATES, ATTRIBUTES) - NOT_IN_RUNS,
    tags=WAREHOUSE_WRITER_TAGS,
    hooks=RUN_LOG_HOOKS,
    description="Recompute daily_aggregates for a range of days (one run, one Spark session), then attributes.",
)

hourly_incremental_schedule = ScheduleDefinition(
    name="hourly_incremental_run",
    job_name=INCREMENTAL_JOB,
    cron_schedule="15 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="One incremental run every hour (turn on instead of the source sensor if preferred).",
)


def plan_waits(context: SensorEvaluationContext, settings: IncrementalSettings) -> SkipReason | None:
    """While the settings differ from those the tables were built under, no run is requested (it
    would be refused): the reason, with the plan."""
    changes, _ = pending_plan(settings, StateStore(), known_incremental(context))
    return None if changes.empty else SkipReason(" ".join(changes.describe()))


@sensor(
    job_name=INCREMENTAL_JOB,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests an incremental run when the source events table has a new Delta version, and "
    "then more, one at a time, until a run is caught up (a backlog, a first load, a full refresh); none "
    "while a change of settings waits for its plan to be applied.",
)
def source_events_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    version = table_version(source_table_uri())
    if version is None:
        return SkipReason(f"No source table at {source_table_uri()} yet")
    waiting = plan_waits(context, settings)
    if waiting is not None:
        return waiting
    active = context.instance.get_runs(filters=RunsFilter(job_name=INCREMENTAL_JOB, statuses=ACTIVE), limit=1)
    if active:
        return SkipReason(f"Run {active[0].run_id} is still processing; the next check will pick up version {version}")
    if context.cursor is None or int(context.cursor) < version:
        context.update_cursor(str(version))
        return RunRequest(run_key=f"source-version-{version}")
    behind = catch_up_key(context.instance, StateStore(), sorted(known_incremental(context)))
    if behind:
        return RunRequest(run_key=behind)
    return SkipReason(f"Source unchanged since version {version}, and the last run was caught up")


def catch_up_key(instance: DagsterInstance, state: StateStore, models: list[str]) -> str | None:
    """The run key of the next catch-up run, or None when none is due: the latest run succeeded and
    its batch had source events past its window, or a full refresh or a plan emptied the manifest
    row of one of the incremental `models` (they are rebuilt). Each key is requested once; a
    failed run is not retried from here (its failure is what to look at)."""
    latest = instance.get_latest_materialization_event(AssetKey(EVENTS_THIS_RUN))
    caught_up = latest.asset_materialization.metadata.get("caught_up") if latest is not None else None
    if caught_up is not None and not caught_up.value:
        run = instance.get_run_by_id(latest.run_id)
        if run is None or run.status == DagsterRunStatus.SUCCESS:
            return f"catch-up-after-{latest.run_id}"
    emptied = table_version(state.uri(INCREMENTAL_MANIFEST))
    if latest is not None and emptied is not None and set(models) - set(state.entries()):
        return f"rebuild-after-manifest-v{emptied}"
    return None


@sensor(
    job_name=DAILY_JOB,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests daily_aggregates runs for the days the daily aggregation manifest marks "
    "to_process: one run per range of consecutive days, each request made once.",
)
def daily_partitions_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    waiting = plan_waits(context, settings)
    if waiting is not None:
        return waiting
    state = StateStore()
    version = table_version(state.uri(DAILY_MANIFEST))
    ranges = requested_day_ranges(state.days(), utcnow().date())
    if not ranges:
        return SkipReason("No day is marked to_process")
    return [
        RunRequest(run_key=f"daily-{first}-{last}-manifest-v{version}", tags=days_window_tags(first, last))
        for first, last in ranges
    ]


@sensor(
    job_name=APPLY_PLAN_JOB,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="With apply_additive_changes, requests apply_plan_job when the settings add or remove "
    "attributes and nothing else; every other change waits for an operator's apply.",
)
def additive_changes_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    changes, current = pending_plan(settings, StateStore(), known_incremental(context))
    if changes.empty:
        return SkipReason("Every table was built under the current settings")
    if not (changes.additive_only and settings.apply_additive_changes):
        return SkipReason("A plan waits for an operator (incremental-assets apply, or apply_plan_job): "
                          + " ".join(changes.describe()))
    return RunRequest(run_key="apply-" + "-".join(current[change.table].digest for change in changes.changes))


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(
        jobs=[incremental_job, daily_job],
        schedules=[hourly_incremental_schedule],
        sensors=[source_events_sensor, daily_partitions_sensor, additive_changes_sensor],
    )
