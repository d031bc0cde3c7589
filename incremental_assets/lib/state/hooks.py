"""Where the run log is written: the lease when a run starts writing (a run's first writer,
refresh and maintenance acquire it, with `alive_in` to judge other holders), and each asset's
outcome when its step ends (the hooks below, attached to the jobs). And the same judgement for the
Dagster instance: a started run whose process is gone is failed there (`runs_in_flight`); which
tables that follow daily_aggregates are behind it there (`behind_daily_aggregates`); and the
source's versions, recorded there as atomic_events' materializations (`record_source_version`)."""

from __future__ import annotations

import os
import socket
from typing import Callable

from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    HookContext,
    MetadataValue,
    RunsFilter,
)
from dagster._core.definitions.decorators.hook_decorator import event_list_hook
from dagster._core.definitions.events import HookExecutionResult

from incremental_assets.lib.catalog import ATOMIC_EVENTS, DAILY_AGGREGATES, FROM_DAILY, WORKER_TAG
from incremental_assets.lib.delta.log import table_version
from incremental_assets.lib.environment import source_table_uri
from incremental_assets.lib.errors import step_failure
from incremental_assets.lib.metadata import markdown_table, materialization_metadata
from incremental_assets.lib.processes import process_exists, process_gone
from incremental_assets.lib.state.run_log import PROCESSED, Record
from incremental_assets.lib.state.store import StateStore

LIVE = {DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED}


def alive_in(instance: DagsterInstance) -> Callable[[Record], bool]:
    """Whether a lease's run may still be writing. On this machine its process is asked first: a
    killed process leaves its run 'started' forever, and a process the instance calls ended (run
    monitoring's verdict, a terminate still unwinding) may still write. A run's own process that
    exists is alive whatever the instance says; the warm worker outlives its runs, so for its runs,
    as for another machine's, the instance's status decides."""

    def alive(record: Record) -> bool:
        run = instance.get_run_by_id(record.run_id)
        if record.host == socket.gethostname() and record.pid is not None:
            # This very process runs one run at a time: an older lease of its own is over.
            if record.pid == os.getpid() or not process_exists(record.pid):
                return False
            if run is None or WORKER_TAG not in run.tags:
                return True
        # Another machine's run that this instance does not know: only an operator can tell.
        return run is None or run.status in LIVE

    return alive


def runs_in_flight(instance: DagsterInstance, **filters) -> list[DagsterRun]:
    """The runs the instance calls live, less those whose process is gone, which are failed here: a
    killed process never reports its run's end, and a run left started would hold back every sensor
    and the UI would show it running forever. Run monitoring does the same through the launcher's
    health check, where it is enabled."""
    live = []
    for run in instance.get_runs(filters=RunsFilter(statuses=list(LIVE), **filters)):
        why = process_gone(run) if run.status == DagsterRunStatus.STARTED else None
        if why is None:
            live.append(run)
        else:
            instance.report_run_failed(run, f"Marked failed: {why} (killed, or the machine restarted).")
    return live


@event_list_hook(required_resource_keys={"state"})
def record_outcome(context: HookContext, event_list) -> HookExecutionResult:
    """Each step's outcome in the run log, by one hook: a success hook and a failure hook would log
    the other one as skipped for every step."""
    if any(event.is_step_failure for event in event_list):
        record_failed(context)
    elif any(event.is_step_success for event in event_list):
        record_processed(context)
    return HookExecutionResult(hook_name="record_outcome", is_skipped=False)


def record_processed(context: HookContext) -> None:
    """Each asset the step materialized: Processed, with its row counts and skip reasons."""
    state: StateStore = context.resources.state
    for event in context.instance.all_logs(context.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        if event.step_key == context.step_key:
            materialization = event.asset_materialization
            state.record(
                context.run_id, materialization.asset_key.path[-1], PROCESSED, materialization_metadata(materialization),
                partition=materialization.partition,
            )


def record_failed(context: HookContext) -> None:
    """A failed step ends the run's writing: every asset still open is Failed, with the error."""
    failure = step_failure(context.step_key, context.op_exception)
    context.resources.state.close_open(context.run_id, f"failed in {failure}")


def as_markdown(rows: list[dict]) -> MetadataValue:
    """A run's records as a table for an asset's metadata in the UI."""
    return markdown_table(
        ["recorded_at", "asset", "partition", "status", "rows read", "rows", "skipped", "message"],
        [[str(r["recorded_at"])[:19], r["asset"], r.get("partition"), r["status"], r.get("rows_read"), r["rows"],
          r["skipped"], r["message"]] for r in rows],
    )


# The run log records each asset's outcome when its step ends (the lease is taken at the first write).
RUN_LOG_HOOKS = {record_outcome}


def behind_daily_aggregates(instance: DagsterInstance) -> list[AssetKey]:
    """Those of attributes and attributes_history whose latest materialization in the instance's
    event log is older than daily_aggregates' (none written yet: behind too). By the order of the
    events, not by what changed between two looks: a run that wrote all three, then one that wrote
    daily_aggregates alone, leave both behind whenever they are looked at."""
    daily = instance.fetch_materializations(AssetKey(DAILY_AGGREGATES), limit=1).records
    if not daily:
        return []
    latest = {key: instance.fetch_materializations(AssetKey(key), limit=1).records for key in FROM_DAILY}
    return [AssetKey(key) for key, records in latest.items() if not (records and records[0].storage_id > daily[0].storage_id)]


def record_source_version(instance: DagsterInstance, how: str, rows: int | None = None) -> None:
    """Record the source table's current version in the instance as a materialization of
    atomic_events, so that the UI shows when the source last changed and a launch there finds its
    upstream materialized: every load of this project's (`rows`: how many it appended), and a
    version a loader of yours wrote, once, when a run first reads it."""
    uri = source_table_uri()
    version = table_version(uri)
    if version is None:
        return
    latest = instance.get_latest_materialization_event(AssetKey(ATOMIC_EVENTS))
    seen = materialization_metadata(latest.asset_materialization) if latest and latest.asset_materialization else {}
    seen_uri = seen.get("dagster/uri") or seen.get("table_uri")  # a load's, or the sample asset's
    if rows is None and seen.get("delta_version") == version and seen_uri == uri:
        return
    metadata = {"dagster/uri": uri, "delta_version": version, **({"rows_loaded": rows} if rows is not None else {})}
    instance.report_runless_asset_event(AssetMaterialization(ATOMIC_EVENTS, description=how, metadata=metadata))
