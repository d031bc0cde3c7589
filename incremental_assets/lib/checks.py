"""Asset checks: the shared rule of how a check reads, and the late-events warning.

A check reads what the latest write of its asset could have changed (the rows that commit
inserted, or the days from its MERGE floor on), never the whole history, and passes without
reading when that write changed nothing: a quiet hour costs no Spark job. It reads a table with
lib/delta/read.read_to_check: a small read through deltalake stays in Arrow, and is looked at
there (lib/transforms/violations); a bigger one is Spark's. The checks themselves are declared
beside their assets.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    MetadataValue,
)
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

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


def sums_by(rows: DataFrame | pa.Table, key: str, value: str) -> dict:
    """The sum of `value` for each `key` of `rows` (read.read_to_check's, in Arrow or in Spark)."""
    if isinstance(rows, pa.Table):
        summed = rows.group_by(key, use_threads=False).aggregate([(value, "sum")])
        return dict(zip(summed[key].to_pylist(), summed[f"{value}_sum"].to_pylist()))
    return {row[key]: row[value] for row in rows.groupBy(key).agg(F.sum(value).alias(value)).collect()}


def from_offending_rows(
    offending: DataFrame | pa.Table | list[dict], what: str, scope: str, check_name: str | None = None
) -> AssetCheckResult:
    """Pass when `offending` (a DataFrame, or rows in hand) is empty; otherwise fail and show the first rows found."""
    if isinstance(offending, pa.Table):  # its instants in UTC, shown as Spark's rows show them
        rows = [{key: _naive(value) for key, value in row.items()} for row in offending.slice(0, EXAMPLES).to_pylist()]
    else:
        rows = offending[:EXAMPLES] if isinstance(offending, list) else [r.asDict() for r in offending.limit(EXAMPLES).collect()]
    found = [{key: str(value) for key, value in row.items()} for row in rows]
    return AssetCheckResult(
        passed=not found,
        check_name=check_name,
        metadata={"checked": scope, "examples": MetadataValue.json(found)},
        description=f"{what}: {len(found)}{'+' if len(found) == EXAMPLES else ''} found, e.g. {found[0]}" if found else None,
    )


def _naive(value: Any) -> Any:
    return value.astimezone(timezone.utc).replace(tzinfo=None) if isinstance(value, datetime) and value.tzinfo else value
