"""What the asset checks look for: each function returns the offending rows, so an empty result is
a pass and the rows found are the evidence. Those a check may hand rows in Arrow (what deltalake
read for it: read.read_to_check) look at them in Arrow, with no Spark job; a Spark DataFrame (a
read too big for the driver) gets the same rule as Spark's query."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from incremental_assets.lib.transforms.sessions import ID_HASH, SESSION, days, duplicated_ids, id_hash


def duplicated(rows: DataFrame | pa.Table, keys: list[str]) -> DataFrame | pa.Table:
    """One row per key that more than one row holds (a null key is one key), with how many (`count`)."""
    if isinstance(rows, pa.Table):
        counted = rows.group_by(keys, use_threads=False).aggregate([([], "count_all")])
        counted = counted.select(keys + ["count_all"]).rename_columns(keys + ["count"])
        return counted.filter(pc.field("count") > 1)
    return rows.groupBy(*keys).count().where(F.col("count") > 1)


def duplicated_event_ids(rows: DataFrame | pa.Table) -> DataFrame | pa.Table:
    """`duplicated(rows, ["event_id"])` for millions of rows: in Spark, counted on the ids' 64-bit
    hashes first (`duplicated_ids`, as the batch's dedupe), then by id among the rows of a shared
    hash alone. When all is well no hash is shared, and Spark skips that second scan."""
    if isinstance(rows, pa.Table):  # rows in the driver's hands already
        return duplicated(rows, ["event_id"])
    shared = duplicated_ids(rows).select(ID_HASH)
    suspects = rows.withColumn(ID_HASH, id_hash()).join(F.broadcast(shared), ID_HASH, "left_semi").drop(ID_HASH)
    return duplicated(suspects, ["event_id"])


def lifecycle_violations(lifecycle: DataFrame | pa.Table, max_session_days: int) -> DataFrame | pa.Table:
    """Sessions stored more than once, or whose bounds break start <= end <= start + max_session_days."""
    if isinstance(lifecycle, pa.Table):
        return _lifecycle_violations_in_arrow(lifecycle, max_session_days)
    start, end = F.col("start_tstamp"), F.col("end_tstamp")
    problem = (
        F.when(F.col("_rows") > 1, "stored more than once")
        .when(start.isNull() | end.isNull(), "missing start or end")
        .when(start > end, "start after end")
        .when(end > start + days(max_session_days), "end beyond start + max_session_days")
    )
    counted = lifecycle.withColumn("_rows", F.count(F.lit(1)).over(Window.partitionBy(SESSION)))
    return counted.select(SESSION, "start_tstamp", "end_tstamp", problem.alias("problem")).where(F.col("problem").isNotNull())


def _lifecycle_violations_in_arrow(lifecycle: pa.Table, max_session_days: int) -> pa.Table:
    """lifecycle_violations in Arrow: each row's first broken rule, in the same order (a comparison
    with a null breaks none, as in Spark's `when`)."""
    start, end = lifecycle["start_tstamp"], lifecycle["end_tstamp"]
    twice = duplicated(lifecycle.select([SESSION]), [SESSION])[SESSION].combine_chunks()
    cap = _plus_days(start, max_session_days)
    rules = [
        (pc.is_in(lifecycle[SESSION], value_set=twice), "stored more than once"),
        (pc.or_(start.is_null(), end.is_null()), "missing start or end"),
        (pc.greater(start, end), "start after end"),
        (pc.greater(end, cap), "end beyond start + max_session_days"),
    ]
    problem = pa.nulls(lifecycle.num_rows, pa.string())
    for broken, name in reversed(rules):
        problem = pc.if_else(pc.fill_null(broken, False), name, problem)
    found = lifecycle.select([SESSION, "start_tstamp", "end_tstamp"]).append_column("problem", problem)
    return found.filter(pc.is_valid(found["problem"]))


def _plus_days(instants: pa.ChunkedArray, n: int) -> pa.ChunkedArray:
    """`instants` + `days(n)`, in Arrow: n whole days of the instants' own unit (the session is in UTC)."""
    return pc.add(instants, pa.scalar(timedelta(days=n)).cast(pa.duration(instants.type.unit)))


def events_beyond_cap(
    events: DataFrame | pa.Table, lifecycle: DataFrame | pa.Table, ts: str, max_session_days: int
) -> DataFrame | pa.Table:
    """Events outside their session's span [start, start + max_session_days] on the cursor `ts`, or
    of a session the lifecycle manifest does not hold (both in Arrow, or both in Spark)."""
    if isinstance(events, pa.Table):
        sessions = lifecycle.select([SESSION, "start_tstamp"]).rename_columns([SESSION, "session_start"])
        joined = events.select(["event_id", SESSION, ts]).join(sessions, SESSION, join_type="left outer", use_threads=False)
        start = joined["session_start"]
        at = joined[ts].cast(start.type)  # the cursor as an instant, as Spark compares it
        cap = _plus_days(start, max_session_days)
        outside = pc.or_kleene(pc.or_kleene(start.is_null(), pc.less(at, start)), pc.greater(at, cap))
        return joined.filter(outside).select(["event_id", SESSION, ts, "session_start"])
    sessions = lifecycle.select(SESSION, F.col("start_tstamp").alias("session_start"))
    start = F.col("session_start")
    outside = start.isNull() | (F.col(ts) < start) | (F.col(ts) > start + days(max_session_days))
    return events.join(sessions, SESSION, "left").where(outside).select("event_id", SESSION, ts, "session_start")


def interval_violations(history: DataFrame | pa.Table, names: list[str]) -> DataFrame | pa.Table:
    """Rows of attributes_history out of shape: a key's intervals [valid_from, valid_to) must follow
    each other from its first without gap or overlap, only the last open (valid_to null), each
    with some value (of `names`) other than the one before's: a new row only where a value changes."""
    if isinstance(history, pa.Table):
        return _interval_violations_in_arrow(history, names)
    key_rows = Window.partitionBy("attribute_key").orderBy("valid_from")
    values = F.struct(*names)
    follows = F.lag("valid_from").over(key_rows).isNotNull()
    broken = (
        (follows & ~F.lag("valid_to").over(key_rows).eqNullSafe(F.col("valid_from")))
        | (F.col("valid_to").isNotNull() & (F.col("valid_to") <= F.col("valid_from")))
        | (F.col("valid_to").isNull() & F.lead("valid_from").over(key_rows).isNotNull())
        | (follows & F.lag(values).over(key_rows).eqNullSafe(values))
    )
    return history.withColumn("_broken", broken).where("_broken").select("attribute_key", "valid_from", "valid_to")


def _interval_violations_in_arrow(history: pa.Table, names: list[str]) -> pa.Table:
    """interval_violations in Arrow: each key's rows in the order of Spark's window (valid_from,
    nulls first; a null key is one key), each held against the row before and after it of the same
    key, with SQL's three-valued logic (a row whose rule is null is not kept, as by Spark's where)."""
    found = ["attribute_key", "valid_from", "valid_to"]
    rows = history.sort_by([("attribute_key", "ascending"), ("valid_from", "ascending")], null_placement="at_start")
    if rows.num_rows == 0:
        return rows.select(found)
    column = {name: rows[name].combine_chunks() for name in {*found, *names}}
    first = pa.array([True] + [False] * (rows.num_rows - 1))
    last = pa.array([False] * (rows.num_rows - 1) + [True])
    same_as_before = pc.and_(pc.invert(first), _same(column["attribute_key"], _before(column["attribute_key"])))
    same_as_after = pc.and_(pc.invert(last), _same(column["attribute_key"], _after(column["attribute_key"])))
    valid_from, valid_to = column["valid_from"], column["valid_to"]
    follows = pc.and_(same_as_before, _before(valid_from).is_valid())
    values_repeat = follows
    for name in names:
        values_repeat = pc.and_(values_repeat, _same(column[name], _before(column[name])))
    broken = [
        pc.and_(follows, pc.invert(_same(_before(valid_to), valid_from))),
        pc.and_kleene(valid_to.is_valid(), pc.less_equal(valid_to, valid_from)),
        pc.and_(pc.and_(valid_to.is_null(), same_as_after), _after(valid_from).is_valid()),
        values_repeat,
    ]
    any_broken = broken[0]
    for rule in broken[1:]:
        any_broken = pc.or_kleene(any_broken, rule)
    return rows.select(found).filter(any_broken)


def _before(values: pa.Array) -> pa.Array:
    """Each row's value of the row before it (null for the first)."""
    return pa.concat_arrays([pa.nulls(1, values.type), values[:-1]])


def _after(values: pa.Array) -> pa.Array:
    """Each row's value of the row after it (null for the last)."""
    return pa.concat_arrays([values[1:], pa.nulls(1, values.type)])


def _same(left: pa.Array, right: pa.Array) -> pa.Array:
    """Spark's null-safe equality, row by row: two nulls are the same, as are two NaNs; two lists
    (a unique_list's values) when they hold the same elements in the same order."""
    if pa.types.is_list(left.type) or pa.types.is_large_list(left.type):
        return _same_lists(left, right)
    if pa.types.is_nested(left.type):  # a struct or a map (the last value of a user's column): as Python values
        return pa.array([a == b for a, b in zip(left.to_pylist(), right.to_pylist())], pa.bool_())
    same = pc.or_(pc.and_(left.is_null(), right.is_null()), pc.fill_null(pc.equal(left, right), False))
    if pa.types.is_floating(left.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(left), pc.is_nan(right)), False))
    return same


def _same_lists(left: pa.Array, right: pa.Array) -> pa.Array:
    """`_same` of two list arrays in Arrow: the rows of equal lengths have their elements lined up
    (flattened, the same number each), compared by `_same`, and a row is the same unless one of
    its elements differs."""
    both_null = pc.and_(left.is_null(), right.is_null())
    lengths_equal = pc.fill_null(pc.equal(pc.list_value_length(left), pc.list_value_length(right)), False)
    rows = pc.indices_nonzero(lengths_equal)
    lined_up = left.take(rows), right.take(rows)
    differs = pc.invert(_same(lined_up[0].flatten(), lined_up[1].flatten()))
    same = lengths_equal.to_numpy(zero_copy_only=False).copy()
    same[rows.take(pc.filter(pc.list_parent_indices(lined_up[0]), differs)).to_numpy()] = False
    return pc.or_(both_null, pa.array(same))
