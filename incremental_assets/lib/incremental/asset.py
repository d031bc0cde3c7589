"""The run unit and the extension point for incremental assets.

A run of `incremental_job` computes its limits, the session layer and `events_this_run` (the base
chain), then every incremental asset selected consumes that batch. Declaring your own:

    @incremental_asset(write_mode="upsert", keys=["session_identifier"])
    def my_sessions(events: DataFrame, limits: RunLimits) -> DataFrame:
        '''What it is, for the UI.'''
        return events.groupBy("session_identifier").agg(...)

It receives only this run's events (all events of every session touched, within the session
cap) and the run's limits (and the settings, if it takes a `settings` argument), and returns a
DataFrame (or `Rows` of one, with how to write it; or an `Output` of either, with metadata) that
the Delta IO manager writes in the declared mode. Its rows are taken to be at most one per event it
received (as aggregates and filters are), which lets a small MERGE run without Spark; a build that
makes more says so: `Rows(frame, rows_at_most=...)`. Rows unique on `keys` by construction (a
group-by on them) are declared with `one_row_per_key=True`, which spares a big MERGE its key check.

The decorator owns the cursor contract, for the built-in incremental assets and a user's own: it
skips when the asset is already past the window (from the run's plan), builds, hands the rows to
the IO manager, and once they are committed advances the asset's row of the incremental manifest
(not for an explicit window: a keyhole backfill writes no state). A new asset is backfilled from
start_date by the manifest's state 2, without further code.
"""


import inspect
from dataclasses import replace
from typing import Callable

from dagster import AssetExecutionContext, AssetIn, Output
from pyspark.sql import DataFrame

from incremental_assets.lib.assets import spark_delta_asset
from incremental_assets.lib.catalog import EVENTS_THIS_RUN, INCREMENTAL_GROUP, INCREMENTAL_TAG, NEW_EVENT_LIMITS
from incremental_assets.lib.delta.spec import Rows, delta_table
from incremental_assets.lib.incremental.batch import RunBatch
from incremental_assets.lib.incremental.limits import Cursor
from incremental_assets.lib.incremental.run_plan import RunPlan
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.records import ManifestEntry
from incremental_assets.lib.state.store import StateStore, run_of


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
        write_mode, keys=keys, partition_by=partition_by, change_feed=change_feed, stats_columns=stats_columns,
        one_row_per_key=one_row_per_key,
    )

    def decorate(build: Callable[..., DataFrame]):
        asset_name = name or build.__name__
        takes_settings = "settings" in inspect.signature(build).parameters

        @spark_delta_asset(
            name=asset_name,
            ins={"plan": AssetIn(NEW_EVENT_LIMITS), "batch": AssetIn(EVENTS_THIS_RUN)},
            group_name=group_name,
            tags={INCREMENTAL_TAG: "true"},
            metadata=table,
            description=description or build.__doc__,
            code_version=code_version,
        )
        def _incremental(
            context: AssetExecutionContext, plan: RunPlan, batch: RunBatch, state: StateStore, settings: IncrementalSettings,
        ):
            cursor = Cursor(asset_name, plan.entries.get(asset_name), batch.stats)
            if cursor.ahead:  # e.g. while a new asset backfills from start_date
                context.log.info(f"{asset_name} is already at {cursor.entry.position}, past this run's upper limit: nothing to do")
                yield Output(Rows(None), metadata={"skipped": "already ahead of this run's window"})
                return
            output = Output(Rows(None))
            if batch.stats.events_found:
                extra = {"settings": settings} if takes_settings else {}
                built = build(batch.events, batch.limits, **extra)
                output = built if isinstance(built, Output) else Output(built)
            else:
                context.log.info(f"No eligible events between {batch.limits.lower} and {batch.limits.upper}")
            advanced = cursor.advanced()  # where the manifest row moves once the write has committed
            yield Output(_rows_of(output.value, plan, batch), metadata={**output.metadata, **_moved(cursor, advanced)})
            # The IO manager has committed the write: Snowplow's end-of-run manifest update, per asset
            # (a crash before it only makes the next run redo the window).
            run_id = run_of(context)
            if advanced is not None and run_id is not None:
                state.save_entry(advanced, run_id)
                if advanced.last_upper is not None and advanced.last_upper != (cursor.entry and cursor.entry.last_upper):
                    # Normal work, not a warning: a window whose events are none, or none past the
                    # asset's position (rows a lookback re-read), moves it on ("never stuck").
                    context.log.info(f"{asset_name}: no event past its position in this window; "
                                     f"the next run starts from {advanced.last_upper}")

        return _incremental

    return decorate


def _rows_of(built: DataFrame | Rows | None, plan: RunPlan, batch: RunBatch) -> Rows:
    """What a build returned, keyed by the run that decided the window; at most one row per event
    it received (aggregates and filters) unless it says otherwise."""
    rows = built if isinstance(built, Rows) else Rows(built)
    return replace(rows, decided_by=plan.run_id, rows_at_most=rows.rows_at_most or batch.stats.events_found)


def _moved(cursor: Cursor, advanced: ManifestEntry | None) -> dict[str, str]:
    """Where the asset's manifest row goes, for people."""
    if advanced is None:
        return {"manifest": "not moved: explicit window (keyhole backfill)"}
    moved = {"manifest_position": str(advanced.position)}
    if advanced.last_upper is not None and advanced.last_upper != (cursor.entry and cursor.entry.last_upper):
        moved["resumes_past_gap_from"] = str(advanced.last_upper)
    return moved
