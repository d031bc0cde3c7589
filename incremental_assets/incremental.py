"""The run unit (SPEC §5.6) and the extension point for incremental assets.

A run of `incremental_job` computes its limits, the session layer and `events_this_run` (the base
chain), then every incremental asset selected consumes that batch. Declaring your own:

    @incremental_asset(write_mode="upsert", keys=["session_identifier"])
    def my_sessions(events: DataFrame, limits: RunLimits) -> DataFrame:
        '''What it is, for the UI.'''
        return events.groupBy("session_identifier").agg(...)

It receives only this run's events (all events of every session touched, within the session
cap) and the run's limits; it is tracked in the incremental manifest, skipped when already
ahead, and backfilled from start_date when it is new (state 2), without further code.
"""


from dataclasses import dataclass
from typing import Any, Callable

from dagster import AssetExecutionContext, Failure, MaterializeResult
from pyspark.sql import DataFrame, SparkSession

from incremental_assets.assets import spark_delta_asset
from incremental_assets import delta_tables
from incremental_assets.io_managers.delta import TableSpec, delta_table, write_metadata
from incremental_assets.logic.limits import RunLimits, advance, is_ahead
from incremental_assets.resources.manifests import ManifestResource, RunRecord
from incremental_assets.resources.spark import SparkResource

INCREMENTAL_TAG = "incremental_assets/incremental"
INCREMENTAL_JOB = "incremental_job"
EVENTS_THIS_RUN = "events_this_run"
INCREMENTAL_GROUP = "incremental"


def run_key(context: AssetExecutionContext) -> str:
    """Retries (re-execution) share the root run's key, so they redo the same window."""
    return context.run.root_run_id or context.run.run_id


def incremental_models_in_run(context: AssetExecutionContext) -> list[str]:
    layer = context.job_def.asset_layer
    graph = layer.asset_graph
    return sorted(
        key.path[-1] for key in layer.selected_asset_keys if graph.get(key).tags.get(INCREMENTAL_TAG) == "true"
    )


@dataclass(frozen=True)
class Batch:
    """This run's record and its events (the scratch table, checked to be this run's)."""

    record: RunRecord
    events: DataFrame

    @property
    def limits(self) -> RunLimits:
        return self.record.limits


def current_batch(context: AssetExecutionContext, spark: SparkSession, manifest: ManifestResource) -> Batch:
    key = run_key(context)
    record = manifest.run_record(key)
    uri = manifest.uri(EVENTS_THIS_RUN)
    stamp = delta_tables.last_commit(spark, uri).user_metadata if delta_tables.table_exists(spark, uri) else None
    if record is None or record.events_found is None or stamp != key:
        raise Failure(
            f"{context.asset_key.to_user_string()} consumes the events of its own run, and this run has none: "
            f"materialize it with the job '{INCREMENTAL_JOB}' (or select it together with new_event_limits, "
            f"sessions_lifecycle_manifest, quarantined_sessions and {EVENTS_THIS_RUN})."
        )
    return Batch(record, delta_tables.read_table(spark, uri))


def process_batch(
    context: AssetExecutionContext,
    spark: SparkSession,
    manifest: ManifestResource,
    write: Callable[[Batch], dict[str, Any]],
) -> MaterializeResult:
    """Skip when ahead; otherwise write this run's batch, then advance this asset's manifest row.

    Advancing right after the write commits is Snowplow's end-of-run update, one asset at a time:
    a crash between the two only makes the next run redo the window.
    """
    name = context.asset_key.path[-1]
    batch = current_batch(context, spark, manifest)
    limits, record = batch.limits, batch.record
    entry = manifest.entries().get(name)
    base = {"run_state": limits.state.value, "lower_limit": str(limits.lower), "upper_limit": str(limits.upper)}
    if limits.moves_manifest and is_ahead(entry, limits):
        context.log.info(f"{name} is already at {entry.position}, past this run's upper limit: nothing to do")
        return MaterializeResult(metadata={**base, "skipped": "already ahead of this run's window"})
    metadata = write(batch) if record.events_found else {"skipped": "no eligible events in the window"}
    if limits.moves_manifest:
        advanced = advance(entry, name, record.batch_max, record.resume_from)
        manifest.save(spark, advanced, context.run.run_id)
        metadata["manifest_position"] = str(advanced.position)
        if advanced.last_upper != (entry.last_upper if entry else None):
            context.log.warning(
                f"No new eligible event between {limits.lower} and {limits.upper}: {name} resumes from "
                f"{advanced.last_upper} next run"
            )
            metadata["resumes_past_gap_from"] = str(advanced.last_upper)
    return MaterializeResult(metadata={**base, **metadata})


def incremental_asset(
    name: str | None = None,
    *,
    write_mode: str = "upsert",
    keys: list[str] | None = None,
    partition_by: list[str] | None = None,
    description: str | None = None,
    group_name: str = INCREMENTAL_GROUP,
):
    """Declare an incremental asset from `build(events, limits) -> DataFrame` (see module doc)."""
    table = delta_table(write_mode, keys=keys, partition_by=partition_by)

    def decorate(build: Callable[[DataFrame, RunLimits], DataFrame]):
        asset_name = name or build.__name__
        spec = TableSpec.of(table, asset_name)

        @spark_delta_asset(
            name=asset_name,
            deps=[EVENTS_THIS_RUN],
            group_name=group_name,
            tags={INCREMENTAL_TAG: "true"},
            metadata=table,
            description=description or build.__doc__,
        )
        def _incremental(context: AssetExecutionContext, spark: SparkResource, manifest: ManifestResource):
            def write(batch: Batch) -> dict[str, Any]:
                session = spark.session
                frame = build(batch.events, batch.limits)
                uri = manifest.uri(asset_name)
                result = delta_tables.write(session, frame, uri, spec.write_mode, spec.keys, spec.partition_by)
                return write_metadata(frame, uri, result, with_row_count=True)

            return process_batch(context, spark.session, manifest, write)

        return _incremental

    return decorate
