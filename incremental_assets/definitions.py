"""Everything Dagster loads: assets, resources, jobs, and the in-process executor.

The in-process executor runs every step of a run in one process, so a run starts one Spark
JVM instead of one per step (see README, "Measured").
"""

import warnings

from dagster import BetaWarning, Definitions, in_process_executor

from incremental_assets.assets.daily import (
    attributes,
    build_daily_assets,
    daily_aggregation_manifest,
    one_row_per_attribute_key,
)
from incremental_assets.assets.events import filtered_events, filtered_events_checks
from incremental_assets.assets.limits import new_event_limits, source_rows_behind_the_cursor
from incremental_assets.assets.sample import atomic_events
from incremental_assets.assets.sessions import (
    session_batch,
    sessions,
    sessions_lifecycle_manifest,
    sessions_unique_and_within_cap,
)
from incremental_assets.assets.source import source_load_summary
from incremental_assets.checks import late_events_stranded_beyond_horizon, manifest_consistent_with_tables
from incremental_assets.freshness import freshness_checks, freshness_sensor
from incremental_assets.io_managers.delta import DeltaIOManager
from incremental_assets.jobs import daily_job, incremental_job, sample_load_job
from incremental_assets.logs import cli_logger
from incremental_assets.maintenance import maintenance_job
from incremental_assets.refresh import apply_plan_job, refresh_job
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.schedules import daily_table_maintenance, hourly_incremental_schedule
from incremental_assets.sensors import daily_partitions_sensor, source_events_sensor
from incremental_assets.settings import load_settings

# Dagster's own copy of a sensor when it binds resources passes a beta parameter: nothing of ours.
warnings.filterwarnings("ignore", message="Parameter `owners` of initializer `SensorDefinition.__init__`", category=BetaWarning)

base_chain = [new_event_limits, sessions_lifecycle_manifest, session_batch]
incremental = [filtered_events, sessions]


def build_definitions(settings=None, extra_incremental=()) -> Definitions:
    """The project's definitions; `extra_incremental` adds assets declared with @incremental_asset.

    Loading them reads no table: everything they depend on comes from the settings.
    """
    settings = settings or load_settings()
    spark, manifest = SparkResource(), ManifestResource()
    daily = [daily_aggregation_manifest, build_daily_assets(settings.start), attributes]
    fresh = freshness_checks(settings)
    return Definitions(
        assets=[atomic_events, source_load_summary, *base_chain, *incremental, *extra_incremental, *daily],
        jobs=[incremental_job, daily_job, sample_load_job, maintenance_job, refresh_job, apply_plan_job],
        schedules=[hourly_incremental_schedule, daily_table_maintenance],
        sensors=[source_events_sensor, daily_partitions_sensor, freshness_sensor(fresh)],
        asset_checks=[
            source_rows_behind_the_cursor,
            sessions_unique_and_within_cap,
            filtered_events_checks,
            late_events_stranded_beyond_horizon,
            manifest_consistent_with_tables,
            one_row_per_attribute_key,
            *fresh,
        ],
        resources={
            "spark": spark,
            "io_manager": DeltaIOManager(spark=spark, manifest=manifest),
            "manifest": manifest,
            "settings": settings,
        },
        executor=in_process_executor,
        loggers={"cli": cli_logger},
    )


defs = build_definitions()
