"""The schedules, both off by default: hourly incremental runs (the source sensor is preferred), and
daily table maintenance."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from incremental_assets.jobs import incremental_job
from incremental_assets.maintenance import maintenance_job

hourly_incremental_schedule = ScheduleDefinition(
    name="hourly_incremental_run",
    job=incremental_job,
    cron_schedule="15 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="One incremental run every hour (turn on instead of the source sensor if preferred).",
)

daily_table_maintenance = ScheduleDefinition(
    name="daily_table_maintenance",
    job=maintenance_job,
    cron_schedule="30 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Table maintenance once a day; off until you start it.",
)
