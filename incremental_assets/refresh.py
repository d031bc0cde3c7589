"""Full refresh (SPEC §8): every table built from the source, and both manifests, are emptied so
that the next runs rebuild them from start_date. Only with `allow_refresh`; otherwise a clear error,
and nothing is dropped.

Two ways in: `incremental-assets refresh` (empties, then runs until caught up), and `refresh_job`
from the launchpad with `allow_refresh: true` in the settings' config (empties; the source sensor
then requests incremental runs until the rebuild is caught up).

Rows are deleted (deltalake, no JVM), not directories: tables keep their schema, properties and
history, object stores need no file-system calls, and the daily manifest's record of the
filtered_events version it has counted stays true (the rebuild's inserts come after it). The
run log is kept, and the refresh holds its lease while it deletes.
"""

from uuid import uuid4

from dagster import Config, DagsterInstance, Failure, MetadataValue, Nothing, OpExecutionContext, Out, Output, job, op

from incremental_assets.delta_tables import table_exists, truncate
from incremental_assets.jobs import WAREHOUSE_WRITER_TAGS
from incremental_assets.logic.run_log import PROCESSED
from incremental_assets.previews import markdown_table
from incremental_assets.names import BASE_GROUP, DAILY_GROUP, INCREMENTAL_GROUP, NEW_EVENT_LIMITS
from incremental_assets.plans import apply_plan, pending_plan
from incremental_assets.resources.manifests import DAILY_MANIFEST, INCREMENTAL_MANIFEST, ManifestResource
from incremental_assets.run_log import alive_in, record_failed
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.utc import utcnow


class RefreshNotAllowed(ValueError):
    pass


def derived_tables(settings: IncrementalSettings) -> list[str]:
    """The tables a refresh empties: the assets of the base, incremental and daily groups (not the
    run records of new_event_limits), and the manifests."""
    from incremental_assets.definitions import build_definitions

    graph = build_definitions(settings).resolve_asset_graph()
    groups = {BASE_GROUP, INCREMENTAL_GROUP, DAILY_GROUP}
    assets = {key.path[-1] for key in graph.materializable_asset_keys if graph.get(key).group_name in groups}
    return sorted((assets - {NEW_EVENT_LIMITS}) | {INCREMENTAL_MANIFEST, DAILY_MANIFEST})


def refresh(settings: IncrementalSettings, instance: DagsterInstance, run_id: str | None = None) -> dict[str, int]:
    """Empty the derived tables under the run log's lease (held as `run_id`); rows deleted per table."""
    if not settings.allow_refresh:
        raise RefreshNotAllowed(
            "A full refresh deletes every row of the manifests and of the tables built from the source. "
            "Set allow_refresh to true to allow it (--set allow_refresh=true). Nothing was dropped."
        )
    manifest = ManifestResource()
    tables = [table for table in derived_tables(settings) if table_exists(manifest.uri(table))]
    run_id = run_id or f"refresh-{uuid4()}"
    manifest.acquire(run_id, tables, None, alive_in(instance))
    state = {INCREMENTAL_MANIFEST, DAILY_MANIFEST}
    # The asset tables through the write module (each takes the current schema at its next write),
    # the manifests and fingerprints through the state store.
    deleted = {table: truncate(manifest.uri(table)) for table in tables if table not in state}
    deleted.update({table: rows for table, rows in manifest.reset().items() if table in tables})
    for table in tables:
        manifest.record(run_id, table, PROCESSED, {"rows_updated": deleted[table]}, message="full refresh: rows deleted")
    return deleted


@op(out=Out(Nothing), description="Empty the manifests and every table built from the source (needs allow_refresh).")
def full_refresh(context: OpExecutionContext, settings: IncrementalSettings) -> Output:
    try:
        deleted = refresh(settings, context.instance, run_id=context.run_id)
    except RefreshNotAllowed as refused:
        raise Failure(str(refused), allow_retries=False) from None
    return Output(None, metadata={
        "rows_deleted": markdown_table(["table", "rows deleted"], sorted(deleted.items())),
        "next": f"incremental runs rebuild from start_date {settings.start_date} (the source sensor requests them)",
    })


@job(
    tags=WAREHOUSE_WRITER_TAGS,
    hooks={record_failed},
    description="Full refresh: empties the manifests and derived tables, refused unless the launchpad sets "
    "resources.settings.config.allow_refresh: true; incremental runs then rebuild from start_date.",
)
def refresh_job():
    full_refresh()


class ApplyConfig(Config):
    forward_only: bool = False


@op(out=Out(Nothing), description="Carry out the plan between the tables' fingerprints and the current settings.")
def apply_settings_plan(
    context: OpExecutionContext, config: ApplyConfig, settings: IncrementalSettings, manifest: ManifestResource,
    spark: SparkResource,
) -> Output:
    from incremental_assets.runner import incremental_of  # the definitions' incremental assets

    incremental = incremental_of(settings)
    changes, current = pending_plan(settings, manifest, incremental, config.forward_only)
    if changes.empty:
        return Output(None, metadata={"plan": "nothing to apply: every table was built under the current settings"})
    before = apply_plan(settings, changes, current, manifest, lambda: spark.spark_session, context.run_id,
                        alive_in(context.instance), utcnow().date(), incremental)
    return Output(None, metadata={
        "plan": MetadataValue.md("\n".join(f"- {change.describe()}" for change in changes.changes)),
        "rows_before": markdown_table(["table", "rows before"], sorted(before.items())),
        "next": "the source sensor requests the runs that rebuild what the plan emptied; the daily sensor the days it marked",
    })


@job(
    tags=WAREHOUSE_WRITER_TAGS,
    hooks={record_failed},
    description="Apply the plan of a settings change (incremental-assets plan shows it): launch with "
    "ops.apply_settings_plan.config.forward_only true to rebuild nothing and apply it from now on.",
)
def apply_plan_job():
    apply_settings_plan()
