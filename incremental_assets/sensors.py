"""Sensors read Delta logs without a JVM (deltalake); they never start Spark."""

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from incremental_assets.assets.daily import days_window_tags, requested_day_ranges
from incremental_assets.jobs import daily_job, incremental_job
from incremental_assets.resources.manifests import DAILY_MANIFEST, ManifestResource
from incremental_assets.environment import source_table_uri
from incremental_assets.previews import table_version

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


@sensor(
    job=incremental_job,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests an incremental run when the source events table has a new Delta version.",
)
def source_events_sensor(context: SensorEvaluationContext):
    version = table_version(source_table_uri())
    if version is None:
        return SkipReason(f"No source table at {source_table_uri()} yet")
    if context.cursor is not None and int(context.cursor) >= version:
        return SkipReason(f"Source unchanged since version {version}")
    active = context.instance.get_runs(filters=RunsFilter(job_name=incremental_job.name, statuses=ACTIVE), limit=1)
    if active:
        return SkipReason(f"Run {active[0].run_id} is still processing; the next check will pick up version {version}")
    context.update_cursor(str(version))
    return RunRequest(run_key=f"source-version-{version}")


@sensor(
    job=daily_job,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests daily_aggregates runs for the days the daily aggregation manifest marks "
    "to_process: one run per range of consecutive days, each request made once.",
)
def daily_partitions_sensor(context: SensorEvaluationContext):
    manifest = ManifestResource()
    version = table_version(manifest.uri(DAILY_MANIFEST))
    ranges = requested_day_ranges(manifest.days())
    if not ranges:
        return SkipReason("No day is marked to_process")
    return [
        RunRequest(run_key=f"daily-{first}-{last}-manifest-v{version}", tags=days_window_tags(first, last))
        for first, last in ranges
    ]
