"""The jobs: one incremental run, the daily partitions, and the sample loader."""

from dagster import AssetSelection, define_asset_job

from incremental_assets.assets.sample import atomic_events
from incremental_assets.names import BASE_GROUP, DAILY_AGGREGATES, DAILY_JOB, INCREMENTAL_GROUP, INCREMENTAL_JOB
from incremental_assets.resources.manifests import DAILY_MANIFEST

# Runs of the incremental job queue behind each other (dagster.yaml limits this tag to 1).
INCREMENTAL_RUN_TAGS = {"incremental_assets/run": "incremental"}

incremental_job = define_asset_job(
    INCREMENTAL_JOB,
    selection=AssetSelection.groups(BASE_GROUP, INCREMENTAL_GROUP) | AssetSelection.assets(DAILY_MANIFEST),
    tags=INCREMENTAL_RUN_TAGS,
    description="One incremental run: limits, session layer, events this run, then the incremental assets.",
)

daily_job = define_asset_job(
    DAILY_JOB,
    selection=AssetSelection.assets(DAILY_AGGREGATES, "attributes"),
    description="Recompute daily_aggregates for a range of days (one run, one Spark session), then attributes.",
)

sample_load_job = define_asset_job(
    "sample_load_job",
    selection=AssetSelection.assets(atomic_events),
    description="Append the next hourly load batch(es) of the sample stream to atomic_events.",
)
