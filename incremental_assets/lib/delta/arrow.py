"""Rows handed between Spark and deltalake as Arrow: to deltalake with every offsets buffer whole,
to Spark without a batch of no rows.

Spark's Arrow writer (Java) sends a variable-width array that holds no value (the strings of a
batch's lists when every list is empty, say) with an offsets buffer of 0 bytes, where the format
asks for one offset per value plus one. pyarrow accepts that, and hands it on through the C Data
Interface as a pointer to its shared zero-size area. The interface carries no buffer sizes, so
deltalake's arrow-rs reads the missing first offset from that area (-189,153,672, pyarrow's debug
pattern) and panics as soon as it copies the array: a partitioned write or a MERGE of such rows
fails with "range start index 18446744073520397944 out of range for slice of length 0".
docs/upstream/deltalake-empty-offsets.py reproduces it without Spark.

Rows a step makes in Python go to Spark as Arrow too: a DataFrame made from Python rows (even none)
is evaluated in a Python worker, a process Spark starts beside the JVM, which a run needs for
nothing else (its cost: benchmarks/comparisons.md).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

# Up to this many cells (rows times columns), rows are held in the driver's Python as Arrow on their
# way between Spark and deltalake (a small write collected for deltalake, a small read handed to
# Spark). A cell takes about 20 bytes in Arrow (17 in the sample's 18 columns, 22 in a real export's
# 147), so about 80 MB, small beside the driver's memory. Counted in cells, not rows: an hourly
# batch of the sample's columns is held, a real export's wide rows 27 thousand at most
# (benchmarks/comparisons.md: "The small writes' bound in cells").
HELD_CELLS = 4_000_000

_OFFSET_BYTES = {
    pa.types.is_string: 4, pa.types.is_binary: 4, pa.types.is_list: 4, pa.types.is_map: 4,
    pa.types.is_large_string: 8, pa.types.is_large_binary: 8, pa.types.is_large_list: 8,
}


def held(rows: int | None, columns: int) -> bool:
    """Whether `rows` (at most; None: not known) of `columns` may be held in the driver's Python."""
    return rows is not None and rows * columns <= HELD_CELLS


def collect(df: DataFrame) -> pa.Table:
    """`df`'s rows in the driver, as deltalake can take them."""
    return whole_offsets(df.toArrow())


def nullable(rows: pa.Table) -> pa.Table:
    """`rows` with every field nullable at any depth (a map's keys aside: Arrow's are never null),
    as Spark's Delta writer stores any frame; no copy."""
    schema = pa.schema([_nullable(field) for field in rows.schema], metadata=rows.schema.metadata)
    return rows if schema.equals(rows.schema) else rows.cast(schema)


def _nullable(field: pa.Field) -> pa.Field:
    kind = field.type
    if pa.types.is_struct(kind):
        kind = pa.struct([_nullable(kind.field(i)) for i in range(kind.num_fields)])
    elif pa.types.is_map(kind):
        kind = pa.map_(kind.key_field, _nullable(kind.item_field), kind.keys_sorted)
    elif pa.types.is_list(kind):
        kind = pa.list_(_nullable(kind.value_field))
    elif pa.types.is_large_list(kind):
        kind = pa.large_list(_nullable(kind.value_field))
    return field.with_type(kind).with_nullable(True)


def to_spark(spark: SparkSession, rows: pa.Table, schema: T.StructType) -> DataFrame:
    """`rows` as a Spark DataFrame of `schema`. pyspark (4.0.1) reads an Arrow table's batches up to
    the first one of no rows and silently drops the others: a table filtered in Arrow has such
    batches, so they are left out."""
    if not rows.num_rows:  # pyspark cannot take a timestamp column of no chunk from Arrow
        return no_rows(spark, schema)
    batches = [batch for batch in rows.to_batches() if batch.num_rows]
    return spark.createDataFrame(pa.Table.from_batches(batches, rows.schema), schema=schema)


def from_rows(spark: SparkSession, rows: list[tuple], schema: T.StructType) -> DataFrame:
    """`rows` (tuples in `schema`'s order) as a Spark DataFrame of `schema`, made from Arrow. A naive
    datetime is UTC, as everywhere in the project (lib/utc.py)."""
    arrow = to_arrow_schema(schema)
    columns = list(zip(*rows)) or [()] * len(arrow)
    return to_spark(spark, pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, arrow)], schema=arrow), schema)


def no_rows(spark: SparkSession, schema: T.StructType) -> DataFrame:
    """No rows of `schema`, made from Arrow."""
    return spark.createDataFrame(to_arrow_schema(schema).empty_table(), schema=schema)


def whole_offsets(rows: pa.Table) -> pa.Table:
    """`rows` with each column chunk that has a short offsets buffer, at any depth, copied anew
    (Arrow's concatenation allocates every offsets buffer whole); the others as they are."""
    columns = []
    for column in rows.columns:
        chunks = [pa.concat_arrays([chunk]) if short_offsets(chunk) else chunk for chunk in column.chunks]
        columns.append(pa.chunked_array(chunks, column.type))
    return pa.Table.from_arrays(columns, schema=rows.schema)


def short_offsets(array: pa.Array) -> bool:
    """Whether `array`, or an array nested in it, has fewer offsets than its values need."""
    kind = array.type
    width = next((bytes_ for is_kind, bytes_ in _OFFSET_BYTES.items() if is_kind(kind)), None)
    if width is not None:
        offsets = array.buffers()[1]
        if offsets is None or offsets.size < (array.offset + len(array) + 1) * width:
            return True
    if pa.types.is_struct(kind):
        return any(short_offsets(array.field(i)) for i in range(kind.num_fields))
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):  # a map is a list of entries
        return short_offsets(array.values)
    return False
