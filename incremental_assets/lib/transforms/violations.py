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


def interval_violations(history: DataFrame, names: list[str]) -> DataFrame:
    """Rows of attributes_history out of shape: a key's intervals [valid_from, valid_to) must follow
    each other from its first without gap or overlap, only the last open (valid_to null), each
    with some value (of `names`) other than the one before's: a new row only where a value changes."""
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
