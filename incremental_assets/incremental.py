"""The run unit (SPEC §5.6) and the extension point for incremental assets.

A run of `incremental_job` computes its limits, the session layer and `events_this_run` (the base
chain), then every incremental asset selected consumes that batch. Declaring your own:

    @incremental_asset(write_mode="upsert", keys=["session_identifier"])
    def my_sessions(events: DataFrame, limits: RunLimits) -> DataFrame:
        '''What it is, for the UI.'''
        return events.groupBy("session_identifier").agg(...)

It receives only this run's events (all events of every session touched, within the session
cap) and the run's limits (and the settings, if it takes a `settings` argument), and returns a
DataFrame (or an `Output` of one, with metadata) that the Delta IO manager writes in the declared
mode. Its rows are taken to be at most one per event it received (as aggregates and filters
are), which lets a small MERGE run without Spark; a build that makes more says so in its Output's
metadata: `rows_at_most` (a bound, or None). Rows unique on `keys` by construction (a group-by on
them) are declared with `one_row_per_key=True`, which spares a big MERGE its key check. It is tracked in the incremental manifest, skipped
when already ahead, and backfilled from start_date when it is new (state 2), without further code.
"""


import inspect
from typing import Callable

from dagster import AssetExecutionContext, AssetIn, Output
from pyspark.sql import DataFrame

from incremental_assets.assets import spark_delta_asset
from incremental_assets.io_managers.delta import ROWS_AT_MOST, Progress, delta_table
from incremental_assets.logic.limits import Cursor
from incremental_assets.names import EVENTS_THIS_RUN, INCREMENTAL_GROUP, INCREMENTAL_TAG
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.run_state import RunBatch
from incremental_assets.settings import IncrementalSettings


def incremental_models_in_run(context: AssetExecutionContext) -> list[str]:
    """The incremental assets selected in this run: the run's limits are computed over them."""
    layer = context.job_def.asset_layer
    graph = layer.asset_graph
    return sorted(
        key.path[-1] for key in layer.selected_asset_keys if graph.get(key).tags.get(INCREMENTAL_TAG) == "true"
    )


def incremental_versions(graph) -> dict[str, str | None]:
    """Every incremental asset of an asset graph (the definitions'), with its declared code version:
    the tables whose fingerprints hold the source rules (plans.current_fingerprints)."""
    return {node.key.path[-1]: node.code_version for node in graph.asset_nodes if node.tags.get(INCREMENTAL_TAG) == "true"}


def incremental_asset(
    name: str | None = None,
    *,
    write_mode: str = "upsert",
    keys: list[str] | None = None,
    partition_by: list[str] | None = None,
    change_feed: bool = False,
    stats_columns: list[str] | None = None,
    one_row_per_key: bool = False,
    description: str | None = None,
    group_name: str = INCREMENTAL_GROUP,
    code_version: str | None = None,
):
    """Declare an incremental asset from `build(events, limits[, settings]) -> DataFrame` (see module doc).
    `code_version`: change it when the build's logic changes; the plan then rebuilds the table."""
    table = delta_table(
        write_mode, keys=keys, partition_by=partition_by, progress=Progress.INCREMENTAL.value, change_feed=change_feed,
        stats_columns=stats_columns, one_row_per_key=one_row_per_key,
    )

    def decorate(build: Callable[..., DataFrame]):
        asset_name = name or build.__name__
        takes_settings = "settings" in inspect.signature(build).parameters

        @spark_delta_asset(
            name=asset_name,
            ins={"batch": AssetIn(EVENTS_THIS_RUN)},
            group_name=group_name,
            tags={INCREMENTAL_TAG: "true"},
            metadata=table,
            description=description or build.__doc__,
            code_version=code_version,
        )
        def _incremental(
            context: AssetExecutionContext, batch: RunBatch, manifest: ManifestResource, settings: IncrementalSettings
        ):
            # The IO manager decides again, on the same Cursor, whether to write and advance.
            if Cursor(asset_name, manifest.entries().get(asset_name), batch.stats).ahead:
                return None
            if not batch.stats.events_found:
                context.log.info(f"No eligible events between {batch.limits.lower} and {batch.limits.upper}")
                return None
            extra = {"settings": settings} if takes_settings else {}
            built = build(batch.events, batch.limits, **extra)
            output = built if isinstance(built, Output) else Output(built)
            # One row per event at most (aggregates and filters), unless the build says otherwise.
            bound = {ROWS_AT_MOST: batch.stats.events_found} if ROWS_AT_MOST not in output.metadata else {}
            return output.with_metadata({**output.metadata, **bound})

        return _incremental

    return decorate
