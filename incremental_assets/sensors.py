"""Sensors read Delta logs without a JVM (deltalake); they never start Spark."""

from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from incremental_assets.assets.daily import days_window_tags, requested_day_ranges
from incremental_assets.incremental import incremental_versions
from incremental_assets.names import FILTERED_EVENTS, SESSIONS
from incremental_assets.plans import pending_plan
from incremental_assets.refresh import apply_plan_job
from incremental_assets.settings import IncrementalSettings
from incremental_assets.jobs import daily_job, incremental_job
from incremental_assets.names import EVENTS_THIS_RUN
from incremental_assets.resources.manifests import DAILY_MANIFEST, INCREMENTAL_MANIFEST, ManifestResource
from incremental_assets.environment import source_table_uri
from incremental_assets.previews import table_version
from incremental_assets.utc import utcnow

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def _incremental(context: SensorEvaluationContext) -> dict[str, str | None]:
    """The code location's incremental assets (the built-in ones when it is not known: a test's context)."""
    graph = context.repository_def.asset_graph if context.repository_def is not None else None
    return {FILTERED_EVENTS: None, SESSIONS: None, **(incremental_versions(graph) if graph else {})}


def plan_pending(context: SensorEvaluationContext, settings: IncrementalSettings) -> SkipReason | RunRequest | None:
    """While the settings differ from those the tables were built under, no run is requested
    (it would be refused): the reason, with the plan; or, for attributes added or removed when
    apply_additive_changes allows it, the run that applies them. None: no plan is pending."""
    changes, current = pending_plan(settings, ManifestResource(), _incremental(context))
    if changes.empty:
        return None
    if changes.additive_only and settings.apply_additive_changes:
        digest = "-".join(current[change.table].digest for change in changes.changes)
        return RunRequest(run_key=f"apply-{digest}", job_name=apply_plan_job.name)
    return SkipReason(" ".join(changes.describe()))


@sensor(
    jobs=[incremental_job, apply_plan_job],
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
    waiting = plan_pending(context, settings)
    if waiting is not None:
        return waiting
    active = context.instance.get_runs(filters=RunsFilter(job_name=incremental_job.name, statuses=ACTIVE), limit=1)
    if active:
        return SkipReason(f"Run {active[0].run_id} is still processing; the next check will pick up version {version}")
    if context.cursor is None or int(context.cursor) < version:
        context.update_cursor(str(version))
        return RunRequest(run_key=f"source-version-{version}", job_name=incremental_job.name)
    behind = catch_up_key(context.instance, ManifestResource(), sorted(_incremental(context)))
    if behind:
        return RunRequest(run_key=behind, job_name=incremental_job.name)
    return SkipReason(f"Source unchanged since version {version}, and the last run was caught up")


def catch_up_key(instance: DagsterInstance, manifest: ManifestResource, models: list[str]) -> str | None:
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
    emptied = table_version(manifest.uri(INCREMENTAL_MANIFEST))
    if latest is not None and emptied is not None and set(models) - set(manifest.entries()):
        return f"rebuild-after-manifest-v{emptied}"
    return None


@sensor(
    job=daily_job,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests daily_aggregates runs for the days the daily aggregation manifest marks "
    "to_process: one run per range of consecutive days, each request made once.",
)
def daily_partitions_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    waiting = plan_pending(context, settings)
    if isinstance(waiting, SkipReason):
        return waiting
    manifest = ManifestResource()
    version = table_version(manifest.uri(DAILY_MANIFEST))
    ranges = requested_day_ranges(manifest.days(), utcnow().date())
    if not ranges:
        return SkipReason("No day is marked to_process")
    return [
        RunRequest(run_key=f"daily-{first}-{last}-manifest-v{version}", tags=days_window_tags(first, last))
        for first, last in ranges
    ]
