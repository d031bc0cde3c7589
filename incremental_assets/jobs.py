"""The jobs: one incremental run, the daily partitions, and the sample loader."""

from dagster import AssetSelection, define_asset_job

from incremental_assets.assets.sample import atomic_events
from incremental_assets.names import BASE_GROUP, DAILY_AGGREGATES, DAILY_JOB, INCREMENTAL_JOB, INCREMENTAL_TAG
from incremental_assets.resources.manifests import DAILY_MANIFEST
from incremental_assets.run_log import record_failed, record_processed

# The run log records each asset's outcome when its step ends (the lease is taken at the first write).
RUN_LOG_HOOKS = {record_processed, record_failed}
# Incremental and daily runs both write the daily aggregation manifest (and the daily layer reads
# what incremental runs merge): they queue behind each other, one at a time (dagster.yaml limits
# this tag to 1). Outside Dagster, the run log's lease refuses a second incremental writer.
WAREHOUSE_WRITER_TAGS = {"incremental_assets/writes": "warehouse"}

incremental_job = define_asset_job(
    INCREMENTAL_JOB,
    # the base chain, every incremental asset (a user's own, in any group), the daily manifest
    selection=AssetSelection.groups(BASE_GROUP) | AssetSelection.tag(INCREMENTAL_TAG, "true") | AssetSelection.assets(DAILY_MANIFEST),
    tags=WAREHOUSE_WRITER_TAGS,
    hooks=RUN_LOG_HOOKS,
    description="One incremental run: limits, session layer, events this run, then the incremental assets.",
)

daily_job = define_asset_job(
    DAILY_JOB,
    selection=AssetSelection.assets(DAILY_AGGREGATES, "attributes"),
    tags=WAREHOUSE_WRITER_TAGS,
    hooks=RUN_LOG_HOOKS,
    description="Recompute daily_aggregates for a range of days (one run, one Spark session), then attributes.",
)

sample_load_job = define_asset_job(
    "sample_load_job",
    selection=AssetSelection.assets(atomic_events),
    description="Append the next hourly load batch(es) of the sample stream to atomic_events.",
)
