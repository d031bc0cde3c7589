"""What the UI shows people: tables in an asset's metadata, a table's columns, and metadata read back as values."""

from __future__ import annotations

from typing import Any

import deltalake
from dagster import MetadataValue, TableColumn
from pyspark.sql import types as T

from incremental_assets.lib.delta.log import stored_schema


def markdown_table(columns: list[str], rows: list[list]) -> MetadataValue:
    """Rows as a markdown table for the UI's metadata (None shows empty; a '|' in a cell is escaped)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if cell is None else str(cell).replace("|", "/") for cell in row) + " |" for row in rows]
    return MetadataValue.md("\n".join(lines))


def materialization_metadata(materialization) -> dict[str, Any]:
    """The plain values of an AssetMaterialization's metadata (what steps of a run read back)."""
    return {key: value.value for key, value in materialization.metadata.items()}


def schema_columns(schema: T.StructType) -> list[TableColumn]:
    return [TableColumn(f.name, f.dataType.simpleString()) for f in schema.fields]


def stored_columns(table: deltalake.DeltaTable) -> list[TableColumn]:
    """A stored table's columns, from its log (no JVM; Delta's schema is Spark's JSON, so they read
    as a Spark write shows them)."""
    return schema_columns(stored_schema(table))
