"""Asset checks (SPEC §8): the shared rule of how a check reads, and the late-events warning.

A check reads what the latest write of its asset could have changed (the rows that commit
inserted, or the days from its MERGE floor on), never the whole history, and passes without
reading when that write changed nothing: a quiet hour costs no Spark job. The checks themselves
are declared beside their assets.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    MetadataValue,
    asset_check,
)
from pyspark.sql import DataFrame

from incremental_assets.delta_tables import stored_max
from incremental_assets.logic.days import stranded
from incremental_assets.names import FILTERED_EVENTS, LIFECYCLE
from incremental_assets.resources.manifests import DAILY_MANIFEST, INCREMENTAL_MANIFEST, ManifestResource
from incremental_assets.run_state import materialization_metadata
from incremental_assets.utc import naive

EXAMPLES = 10  # offending rows shown in a failed check's metadata


def latest_metadata(context: AssetCheckExecutionContext | AssetExecutionContext, asset: str) -> dict[str, Any] | None:
    """The metadata of the asset's latest materialization, whether or not it wrote; None before any."""
    event = context.instance.get_latest_materialization_event(AssetKey(asset))
    return None if event is None else materialization_metadata(event.asset_materialization)


def latest_write(context: AssetCheckExecutionContext, asset: str) -> dict[str, Any] | None:
    """The metadata of the asset's latest materialization, if it wrote rows; None otherwise."""
    metadata = latest_metadata(context, asset)
    if metadata is None:
        return None
    changed = (metadata.get("rows_inserted") or 0) + (metadata.get("rows_updated") or 0)
    return metadata if changed and metadata.get("delta_version") is not None else None


def nothing_written(check_name: str | None = None) -> AssetCheckResult:
    return AssetCheckResult(passed=True, check_name=check_name, metadata={"checked": "nothing: the latest write changed no row"})


def from_offending_rows(
    offending: DataFrame | list[dict], what: str, scope: str, check_name: str | None = None
) -> AssetCheckResult:
    """Pass when `offending` (a DataFrame, or rows in hand) is empty; otherwise fail and show the first rows found."""
    rows = offending[:EXAMPLES] if isinstance(offending, list) else [r.asDict() for r in offending.limit(EXAMPLES).collect()]
    found = [{key: str(value) for key, value in row.items()} for row in rows]
    return AssetCheckResult(
        passed=not found,
        check_name=check_name,
        metadata={"checked": scope, "examples": MetadataValue.json(found)},
        description=f"{what}: {len(found)}{'+' if len(found) == EXAMPLES else ''} found, e.g. {found[0]}" if found else None,
    )


@asset_check(
    asset=DAILY_MANIFEST,
    description="Warns about late events beyond reprocess_days: they are counted but will only be applied "
    "by a partition backfill of their days (incremental-assets backfill, or the UI).",
)
def late_events_stranded_beyond_horizon(manifest: ManifestResource) -> AssetCheckResult:
    days = stranded(manifest.days())
    pending = sum(d.pending_late_events for d in days)
    return AssetCheckResult(
        passed=not days,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "days": MetadataValue.json([str(d.event_date) for d in days]),
            "pending_late_events": pending,
        },
        description=f"{pending} late events on {len(days)} day(s) wait for a backfill" if days else None,
    )


@asset_check(
    asset=FILTERED_EVENTS,
    description="The incremental manifest claims no more than the tables hold: each asset's last_success is at "
    "most the greatest cursor value stored (the latest session end in the lifecycle manifest, which every "
    "processed event lies within). A manifest ahead of its data would make the next runs skip events.",
)
def manifest_consistent_with_tables(manifest: ManifestResource) -> AssetCheckResult:
    """Reads the manifest's rows and the lifecycle's file statistics: no Spark job. Delta keeps
    timestamp statistics to the millisecond, so positions are compared to the millisecond."""
    stored = naive(stored_max(manifest.uri(LIFECYCLE), "end_tstamp"))
    ahead = sorted(
        (entry.model, str(entry.last_success))
        for entry in manifest.entries().values()
        if entry.last_success is not None and (stored is None or _to_the_millisecond(entry.last_success) > stored)
    )
    return AssetCheckResult(
        passed=not ahead,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "greatest_cursor_value_stored": str(stored),
            "ahead_of_the_tables": MetadataValue.json([{"model": m, "last_success": t} for m, t in ahead]),
        },
        description=f"{INCREMENTAL_MANIFEST} is past the data stored ({stored}) for {[m for m, _ in ahead]}" if ahead else None,
    )


def _to_the_millisecond(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
