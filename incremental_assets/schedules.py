"""An hourly schedule for the incremental job; off by default in favour of the source sensor."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from incremental_assets.jobs import incremental_job

hourly_incremental_schedule = ScheduleDefinition(
    name="hourly_incremental_run",
    job=incremental_job,
    cron_schedule="15 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="One incremental run every hour (turn on instead of the source sensor if preferred).",
)
