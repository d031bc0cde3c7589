"""Asset checks: the shared rule of how a check reads, and the late-events warning.

A check reads what the latest write of its asset could have changed (the rows that commit
inserted, or the days from its MERGE floor on), never the whole history, and passes without
reading when that write changed nothing: a quiet hour costs no Spark job. It reads a table with
lib/delta/read.read_just_written (small reads through deltalake). The checks themselves are
declared beside their assets.
"""

from __future__ import annotations

from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    MetadataValue,
)
from pyspark.sql import DataFrame

from incremental_assets.lib.metadata import materialization_metadata

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


