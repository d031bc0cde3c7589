"""Everything Dagster loads: assets, resources, jobs, and the in-process executor.

The in-process executor runs every step of a run in one process, so a run starts one Spark
JVM instead of one per step (see README, "Measured").
"""

from dagster import Definitions, in_process_executor

from incremental_assets.assets.events import events_this_run, filtered_events
from incremental_assets.assets.limits import new_event_limits
from incremental_assets.assets.sample import atomic_events
from incremental_assets.assets.sessions import quarantined_sessions, sessions, sessions_lifecycle_manifest
from incremental_assets.assets.source import source_load_summary
from incremental_assets.io_managers.delta import DeltaIOManager
from incremental_assets.jobs import incremental_job, sample_load_job
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.schedules import hourly_incremental_schedule
from incremental_assets.sensors import source_events_sensor
from incremental_assets.settings import load_settings

base_chain = [new_event_limits, sessions_lifecycle_manifest, quarantined_sessions, events_this_run]
incremental = [filtered_events, sessions]


def build_definitions(settings=None, extra_incremental=()) -> Definitions:
    """The project's definitions; `extra_incremental` adds assets declared with @incremental_asset."""
    return Definitions(
        assets=[atomic_events, source_load_summary, *base_chain, *incremental, *extra_incremental],
        jobs=[incremental_job, sample_load_job],
        schedules=[hourly_incremental_schedule],
        sensors=[source_events_sensor],
        resources={
            "spark": SparkResource(),
            "io_manager": DeltaIOManager(),
            "manifest": ManifestResource(),
            "settings": settings or load_settings(),
        },
        executor=in_process_executor,
    )


defs = build_definitions()
