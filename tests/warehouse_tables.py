"""The tables of a warehouse, as sorted rows to compare two warehouses that processed the same
events differently (batched against one-shot, interrupted against uninterrupted)."""

from __future__ import annotations

from pathlib import Path

from incremental_assets import delta_tables

COMPARED = ("filtered_events", "sessions_lifecycle_manifest", "quarantined_sessions", "sessions", "daily_aggregates", "attributes")
# Columns that say when a run did something, not what the data is: left out of the comparison.
RUN_DEPENDENT = {"quarantined_sessions": ("quarantined_at",)}


def comparable_tables(spark, warehouse: str | Path) -> dict[str, list[tuple]]:
    tables = {}
    for name in COMPARED:
        table = delta_tables.read_table(spark, f"{warehouse}/{name}")
        columns = sorted(c for c in table.columns if c not in RUN_DEPENDENT.get(name, ()))
        tables[name] = sorted(tuple(row) for row in table.select(*columns).collect())
    return tables
