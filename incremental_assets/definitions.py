"""Everything Dagster loads: assets, resources, jobs, and the in-process executor.

The in-process executor runs every step of a run in one process, so a run starts one Spark
JVM instead of one per step (see README, "Measured").
"""

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from incremental_assets.assets.events import events_this_run, filtered_events
from incremental_assets.assets.limits import BASE_GROUP, new_event_limits
from incremental_assets.assets.sample import atomic_events
from incremental_assets.assets.sessions import quarantined_sessions, sessions, sessions_lifecycle_manifest
from incremental_assets.assets.source import source_load_summary
from incremental_assets.incremental import INCREMENTAL_GROUP, INCREMENTAL_JOB
from incremental_assets.io_managers.delta import DeltaIOManager
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import load_settings

# Runs of the incremental job queue behind each other (dagster.yaml limits this tag to 1).
INCREMENTAL_RUN_TAGS = {"incremental_assets/run": "incremental"}

base_chain = [new_event_limits, sessions_lifecycle_manifest, quarantined_sessions, events_this_run]
incremental = [filtered_events, sessions]

incremental_job = define_asset_job(
    INCREMENTAL_JOB,
    selection=AssetSelection.groups(BASE_GROUP, INCREMENTAL_GROUP),
    tags=INCREMENTAL_RUN_TAGS,
    description="One incremental run: limits, session layer, events this run, then the incremental assets.",
)

sample_load_job = define_asset_job(
    "sample_load_job",
    selection=AssetSelection.assets(atomic_events),
    description="Append the next hourly load batch(es) of the sample stream to atomic_events.",
)


def build_definitions(settings=None) -> Definitions:
    return Definitions(
        assets=[atomic_events, source_load_summary, *base_chain, *incremental],
        jobs=[incremental_job, sample_load_job],
        resources={
            "spark": SparkResource(),
            "io_manager": DeltaIOManager(),
            "manifest": ManifestResource(),
            "settings": settings or load_settings(),
        },
        executor=in_process_executor,
    )


defs = build_definitions()
