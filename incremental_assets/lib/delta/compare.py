"""Which rows two versions of a table hold differently, compared in Arrow.

Only the keys of the rows that differ become Python values: turning every row of a few thousand
into Python objects (timestamps with a time zone the slowest) cost a daily step more than its
Spark jobs at a site's shape (benchmarks/comparisons.md).
"""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

_BEFORE, _AFTER = "_row_before", "_row_after"


def differing_keys(before: pa.Table, after: pa.Table, keys: list[str]) -> list[tuple]:
    """The keys (tuples of `keys`' values, nulls first) of the rows that one table holds and the
    other does not, or holds with some other value. Each key is on at most one row of each table;
    a null in a key is a value like any other (a real export's events without a user id share
    one). Tables whose columns differ in name or type differ on every row."""
    numbered = [
        table.select(keys).append_column(mine, pa.array(range(table.num_rows), pa.int64()))
        .append_column(other, pa.nulls(table.num_rows, pa.int64()))
        for table, mine, other in ((before, _BEFORE, _AFTER), (after, _AFTER, _BEFORE))
    ]
    # Grouping, unlike a join, matches null keys: each key's row number in either table.
    rows = pa.concat_tables([numbered[0], numbered[1].select(numbered[0].column_names)]).group_by(keys).aggregate(
        [(_BEFORE, "max"), (_AFTER, "max")]).rename_columns({f"{_BEFORE}_max": _BEFORE, f"{_AFTER}_max": _AFTER})
    if [(f.name, f.type) for f in before.schema] == [(f.name, f.type) for f in after.schema]:
        matched = pc.and_(rows.column(_BEFORE).is_valid(), rows.column(_AFTER).is_valid())
        both = rows.filter(matched)
        was, now = both.column(_BEFORE), both.column(_AFTER)
        values = [name for name in before.column_names if name not in keys]
        equal = reduce(pc.and_, (equal_rows(before.column(n).take(was), after.column(n).take(now)) for n in values),
                       pa.array([True] * both.num_rows, pa.bool_()))
        rows = pa.concat_tables([rows.filter(pc.invert(matched)).select(keys), both.filter(pc.invert(equal)).select(keys)])
    return sorted(zip(*(rows.column(k).to_pylist() for k in keys)), key=lambda key: [(v is not None, v) for v in key])


def equal_rows(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
    """Row by row, whether `a` and `b` (of one type and length) hold the same value: a null equals
    a null only, at every depth. Flat values, structs and lists are compared in Arrow; other nested
    values (maps) as Python values."""
    a, b = _whole(a), _whole(b)
    both_null = pc.and_(a.is_null(), b.is_null())
    one_null = pc.xor(a.is_null(), b.is_null())
    kind = a.type
    if pa.types.is_struct(kind):
        fields = [equal_rows(a.field(i), b.field(i)) for i in range(kind.num_fields)]
        values = reduce(pc.and_, fields, pa.array([True] * len(a), pa.bool_()))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = _equal_lists(a, b)
    elif pa.types.is_nested(kind):
        values = pa.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist())], pa.bool_())
    else:
        values = pc.fill_null(pc.equal(a, b), False)
    return pc.or_(both_null, pc.and_(pc.invert(one_null), values))


def _equal_lists(a: pa.Array, b: pa.Array) -> pa.BooleanArray:
    """Lists of the same length whose elements are equal one by one (False where either is null)."""
    same_length = pc.fill_null(pc.equal(pc.list_value_length(a), pc.list_value_length(b)), False)
    alike_a, alike_b = a.filter(same_length), b.filter(same_length)
    elements = equal_rows(pc.list_flatten(alike_a), pc.list_flatten(alike_b))
    differing = pc.filter(pc.list_parent_indices(alike_a), pc.invert(elements))
    equal = pc.invert(pc.is_in(pa.array(range(len(alike_a)), pa.int64()), value_set=differing.cast(pa.int64())))
    return pc.replace_with_mask(same_length, same_length, equal)


def _whole(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
