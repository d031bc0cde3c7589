"""Reading small Delta tables without a JVM (sensors, `show`): the deltalake package."""

from __future__ import annotations

import json
from typing import Any

from dagster import MetadataValue
from deltalake import DeltaTable
from pyarrow.parquet import filters_to_expression
from deltalake.exceptions import TableNotFoundError


def read_rows(uri: str, columns: list[str] | None = None, filters: list | None = None) -> list[dict[str, Any]] | None:
    """The rows of a small Delta table (optionally filtered), or None when there is no table at `uri`.

    Filters on partition columns prune the files read; the others apply to the rows read (files
    that deltalake's MERGE wrote hold string_view columns, which Arrow's scan filters cannot compare)."""
    try:
        table = DeltaTable(uri)
    except TableNotFoundError:
        return None
    partitioned = set(table.metadata().partition_columns)
    pruning = [f for f in filters or [] if f[0] in partitioned]
    rows = table.to_pyarrow_table(columns=columns, filters=pruning or None)
    rest = [f for f in filters or [] if f[0] not in partitioned]
    return (rows.filter(filters_to_expression(rest)) if rest else rows).to_pylist()


def table_version(uri: str) -> int | None:
    try:
        return DeltaTable(uri).version()
    except TableNotFoundError:
        return None


def latest_marker(uri: str, key: str) -> Any:
    """`key` from the newest commit whose userMetadata (JSON) carries it, or None."""
    try:
        history = DeltaTable(uri).history()
    except TableNotFoundError:
        return None
    for commit in history:  # newest first
        try:
            marker = json.loads(commit.get("userMetadata") or "{}")
        except ValueError:
            continue
        if isinstance(marker, dict) and marker.get(key) is not None:
            return marker[key]
    return None


def row_count(uri: str) -> int | None:
    try:
        return DeltaTable(uri).count()
    except TableNotFoundError:
        return None


def print_table(uri: str, limit: int = 20) -> None:
    try:
        table = DeltaTable(uri)
    except TableNotFoundError:
        raise FileNotFoundError(f"No Delta table at {uri}") from None
    total = table.count()
    data = table.to_pyarrow_dataset().head(limit)
    print(f"{uri}  (version {table.version()}, {total} rows)")
    rows = data.to_pylist()
    if not rows:
        return
    columns = data.column_names
    cells = [[cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    if total > limit:
        print(f"... {total - limit} more rows")


def cell(value: Any) -> str:
    """A value as text of at most 40 characters, for terminal tables."""
    text = "" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def markdown_table(columns: list[str], rows: list[list]) -> MetadataValue:
    """Rows as a markdown table for the UI's metadata (None shows empty; a '|' in a cell is escaped)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if cell is None else str(cell).replace("|", "/") for cell in row) + " |" for row in rows]
    return MetadataValue.md("\n".join(lines))
