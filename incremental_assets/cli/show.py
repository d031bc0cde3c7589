"""Printing a warehouse table on the terminal (`incremental-assets show`), without a JVM."""

from __future__ import annotations

from typing import Any

from incremental_assets.lib.delta.log import reading, stored_table


def print_table(uri: str, limit: int = 20) -> None:
    table = stored_table(uri)
    if table is None:
        raise FileNotFoundError(f"No Delta table at {uri}")
    with reading(uri):
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
