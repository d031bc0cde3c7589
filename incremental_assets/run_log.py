"""Where the run log is written (SPEC §8): the lease when a run starts writing (the Delta IO
manager calls `take_lease` before a run's first write), and each asset's outcome when its step
ends (the hooks below, attached to both jobs). Assets never write it themselves."""

from __future__ import annotations

import os
import socket
from typing import Callable

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    HookContext,
    MetadataValue,
    failure_hook,
    success_hook,
)

from incremental_assets.logic.limits import RunLimits
from incremental_assets.logic.run_log import PROCESSED, Record
from incremental_assets.resources.manifests import ManifestResource

LIVE = {DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED}


def alive_in(instance: DagsterInstance) -> Callable[[Record], bool]:
    """Whether a lease's run may still be writing: the Dagster instance says it is live, and, on
    this machine, its process exists (a killed process leaves its run 'started' forever)."""

    def alive(record: Record) -> bool:
        run = instance.get_run_by_id(record.run_id)
        if run is not None and run.status not in LIVE:
            return False
        if record.host == socket.gethostname() and record.pid is not None:
            # This very process runs one run at a time: an older lease of its own is over.
            return record.pid != os.getpid() and _process_exists(record.pid)
        return True  # another machine's run that this instance does not know: only an operator can tell

    return alive


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_lease(manifest: ManifestResource, instance: DagsterInstance, run_id: str, assets: list[str], limits: RunLimits | None) -> None:
    manifest.acquire(run_id, assets, limits, alive_in(instance))


@success_hook(required_resource_keys={"manifest"})
def record_processed(context: HookContext) -> None:
    """Each asset the step materialized: Processed, with its row counts and skip reasons."""
    manifest: ManifestResource = context.resources.manifest
    for event in context.instance.all_logs(context.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        if event.step_key == context.step_key:
            materialization = event.asset_materialization
            metadata = {key: value.value for key, value in materialization.metadata.items()}
            manifest.record(context.run_id, materialization.asset_key.path[-1], PROCESSED, metadata)


@failure_hook(required_resource_keys={"manifest"})
def record_failed(context: HookContext) -> None:
    """A failed step ends the run's writing: every asset still open is Failed, with the error."""
    error = context.op_exception
    context.resources.manifest.close_open(context.run_id, f"step {context.step_key} failed: {error!r}"[:2000])


def as_markdown(rows: list[dict]) -> MetadataValue:
    """A run's records as a table for an asset's metadata in the UI."""
    lines = ["| recorded_at | asset | status | rows | skipped | message |", "|---|---|---|---|---|---|"]
    for row in rows:
        cells = [str(row["recorded_at"])[:19], row["asset"], row["status"], row["rows"], row["skipped"], row["message"]]
        lines.append("| " + " | ".join("" if cell is None else str(cell).replace("|", "/") for cell in cells) + " |")
    return MetadataValue.md("\n".join(lines))
