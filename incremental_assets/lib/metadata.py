"""What the UI shows people: tables in an asset's metadata, and metadata read back as values."""

from __future__ import annotations

from typing import Any

from dagster import MetadataValue


def markdown_table(columns: list[str], rows: list[list]) -> MetadataValue:
    """Rows as a markdown table for the UI's metadata (None shows empty; a '|' in a cell is escaped)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if cell is None else str(cell).replace("|", "/") for cell in row) + " |" for row in rows]
    return MetadataValue.md("\n".join(lines))


def materialization_metadata(materialization) -> dict[str, Any]:
    """The plain values of an AssetMaterialization's metadata (what steps of a run read back)."""
    return {key: value.value for key, value in materialization.metadata.items()}
