"""Printing a warehouse table on the terminal (`incremental-assets show`), and one key's
attributes as of a day (`incremental-assets attributes`), without a JVM."""

from __future__ import annotations

from datetime import date
from typing import Any

from incremental_assets.defs.daily.changed_keys import BuiltFrom
from incremental_assets.defs.daily.history import BUILT_FROM
from incremental_assets.lib.delta.log import reading, rows_with, stored_table


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


def print_attributes_as_of(uri: str, key: str, day: date) -> bool:
    """One key's attributes as of the end of `day`, from attributes_history; False when the key
    had no event by then."""
    if stored_table(uri) is None:
        raise FileNotFoundError(f"No attributes history at {uri}: run the daily job first (incremental-assets run)")
    rows = rows_with(uri, "attribute_key", key)
    valid = [r for r in rows if r["valid_from"] <= day and (r["valid_to"] is None or day < r["valid_to"])]
    built = BuiltFrom.stored(uri, BUILT_FROM)
    if built is not None and day > built.through:
        print(f"(the history runs through {built.through}: later days show the values known then)")
    if not valid:
        print(f"{key}: no event by the end of {day}")
        return False
    row = valid[0]
    print(f"{key} as of the end of {day} (values valid from {row['valid_from']} to {row['valid_to'] or 'now'}):")
    names = [name for name in row if name not in ("attribute_key", "valid_from", "valid_to")]
    width = max(len(name) for name in names)
    for name in names:
        print(f"  {name.ljust(width)}  {cell(row[name])}")
    return True
