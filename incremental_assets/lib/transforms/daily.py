"""Daily partials and attributes as DataFrame → DataFrame functions."""

from __future__ import annotations

from datetime import date, timedelta

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.attributes import AttributeSpec, Condition
from incremental_assets.lib.delta.spec import DELETED
from incremental_assets.lib.incremental.days import DayArrivals, LoadGroup, arrivals_by_day, arrivals_from_rows

TIMESTAMP = "derived_tstamp"
SECONDS_A_DAY = 86_400
ADDITIVE = ("count", "sum")
AS_OF, VALID_FROM, VALID_TO = "as_of", "valid_from", "valid_to"


def event_filter(spec: AttributeSpec) -> Column:
    keep = F.lit(True)
    if spec.event_names:
        keep = keep & F.col("event_name").isin(list(spec.event_names))
    for condition in spec.conditions:
        keep = keep & _condition(condition)
    return keep


def _condition(condition: Condition) -> Column:
    column = F.col(condition.column)
    if condition.op == "not_null":
        return column.isNotNull()
    if condition.op == "in":
        return column.isin(list(condition.value))
    value = F.lit(condition.value)
    return {
        "=": column == value, "!=": column != value, ">": column > value,
        ">=": column >= value, "<": column < value, "<=": column <= value,
    }[condition.op]


def _partial(spec: AttributeSpec) -> Column:
    keep = event_filter(spec)
    if spec.aggregation == "count":
        return F.count_if(keep)
    value = F.when(keep, F.col(spec.column))
    if spec.aggregation == "sum":
        return F.sum(value)
    if spec.aggregation in ("min", "max"):
        return getattr(F, spec.aggregation)(value)
    if spec.aggregation in ("first", "last"):
        stamped = F.when(keep & F.col(spec.column).isNotNull(), F.struct(F.col(TIMESTAMP).alias("tstamp"), value.alias("value")))
        return F.min(stamped) if spec.aggregation == "first" else F.max(stamped)
    return F.array_sort(F.collect_set(value))  # count_distinct, unique_list: the exact distinct set


def daily_partials(events: DataFrame, specs: list[AttributeSpec], key: str) -> DataFrame:
    """One row per (attribute_key, event_date): the day's events and each attribute's exact partial."""
    return events.groupBy(F.col(key).alias("attribute_key"), "event_date").agg(
        F.count(F.lit(1)).alias("events"), *[_partial(s).alias(s.partial) for s in specs]
    )


def with_partials(stored: DataFrame, events: DataFrame, specs: list[AttributeSpec], key: str) -> DataFrame:
    """Stored daily rows with the partials of `specs` (re)computed from `events`, every other column
    as it is: an attribute added or redefined, applied to days already aggregated."""
    if not specs:
        return stored
    partials = daily_partials(events, specs, key).drop("events")
    kept = stored.drop(*[spec.partial for spec in specs])
    return kept.join(partials, ["attribute_key", "event_date"], "left")


def _combine(spec: AttributeSpec, reference_day: Column) -> Column:
    """One attribute from a key's partials up to `reference_day` (the caller keeps only those): the
    one rule `attributes`, its history and a point-in-time lookup share."""
    partial = F.col(spec.partial)
    if spec.days is not None:
        partial = F.when(F.col("event_date") > F.date_sub(reference_day, spec.days), partial)
    if spec.aggregation in ADDITIVE:
        total = F.sum(partial)
        return F.coalesce(total, F.lit(0)) if spec.aggregation == "count" else total
    if spec.aggregation in ("min", "first"):
        combined = F.min(partial)
    elif spec.aggregation in ("max", "last"):
        combined = F.max(partial)
    else:
        distinct = F.array_sort(F.array_distinct(F.flatten(F.collect_list(partial))))
        return F.size(distinct) if spec.aggregation == "count_distinct" else distinct
    return combined.getField("value") if spec.aggregation in ("first", "last") else combined


def _as_of(daily: DataFrame, specs: list[AttributeSpec], by: list[str], reference_day: Column) -> DataFrame:
    """Each group's attributes as of the end of `reference_day`, from its partials up to that day:
    a key seen only later has no row, and no later event counts."""
    return daily.where(F.col("event_date") <= reference_day).groupBy(*by).agg(
        *[_combine(s, reference_day).alias(s.name) for s in specs]
    )


def attributes_from_daily(daily: DataFrame, specs: list[AttributeSpec], reference_day: date) -> DataFrame:
    """One row per attribute_key seen by the end of `reference_day`: every attribute as of then."""
    return _as_of(daily, specs, ["attribute_key"], F.lit(reference_day))


def current_attributes(history: DataFrame, keys: DataFrame, specs: list[AttributeSpec]) -> DataFrame:
    """The attributes of `keys` (attribute_key) from attributes_history built through the reference
    day: each key's open interval, whose values are those as of that day by the same combination
    (§7.5), so they cost the keys, not their days of history. A key with no interval has no row.
    A list holds no null (collect_set drops them) and is typed so, as attributes_from_daily types
    it: the history may store its elements as nullable, and Spark's MERGE into attributes casts no
    list of nullable elements into a column of non-null ones."""
    current = history.where(F.col(VALID_TO).isNull()).join(F.broadcast(keys.select("attribute_key")), "attribute_key")
    return current.select("attribute_key", *[_as_computed(spec) for spec in specs])


def _as_computed(spec: AttributeSpec) -> Column:
    column = F.col(spec.name)
    return F.array_compact(column).alias(spec.name) if spec.aggregation == "unique_list" else column


def attribute_changes(fresh: DataFrame, stored: DataFrame | None, keys: DataFrame) -> DataFrame:
    """The rows that bring `stored` (attributes; None: none yet) up to date when the keys of `keys`
    (attribute_key) take their recomputed values `fresh` (a row per key that has any): rows to
    write (`DELETED` false) and stored rows to delete (true: a key with no row in `fresh`), on
    attribute_key. An unchanged key yields no row."""
    if stored is None:
        return fresh.withColumn(DELETED, F.lit(False))
    kept = stored.join(F.broadcast(keys.select("attribute_key")), "attribute_key").select(*fresh.columns)
    written = fresh.exceptAll(kept).withColumn(DELETED, F.lit(False))
    gone = kept.join(fresh, "attribute_key", "left_anti").withColumn(DELETED, F.lit(True))
    return written.unionByName(gone)


def attributes_by_day(daily: DataFrame, specs: list[AttributeSpec], days: DataFrame) -> DataFrame:
    """Each key's attributes as of the end of each day of `days` (attribute_key, as_of): the same
    combination as `attributes_from_daily`, with each row's own reference day."""
    return _as_of(daily.join(days, "attribute_key"), specs, ["attribute_key", AS_OF], F.col(AS_OF))


def days_from(first_days: DataFrame, through: date) -> DataFrame:
    """(attribute_key, as_of) for every day from each key's `from_day` to `through`."""
    days = F.sequence(F.col("from_day"), F.lit(through))
    return first_days.where(F.col("from_day") <= F.lit(through)).select("attribute_key", F.explode(days).alias(AS_OF))


def intervals(by_day: DataFrame, names: list[str]) -> DataFrame:
    """A key's consecutive days with equal values as one row: `valid_from` its first day, `valid_to`
    the day after its last (null for the latest: the key's current values). A key's days must run
    without a gap from its first; a row may stand for a run of days that starts on its as_of."""
    key_days = Window.partitionBy("attribute_key").orderBy(AS_OF)
    values = F.struct(*names)
    starts = by_day.withColumn("_starts", ~F.lag(values).over(key_days).eqNullSafe(values)).where("_starts")
    return starts.select(
        "attribute_key", F.col(AS_OF).alias(VALID_FROM), F.lead(AS_OF).over(key_days).alias(VALID_TO), *names
    )


def history_changes(
    daily: DataFrame, stored: DataFrame | None, first_days: DataFrame, specs: list[AttributeSpec], through: date,
    earliest: date | None = None,
) -> DataFrame:
    """The rows that bring `stored` (attributes_history; None: none yet) up to date through
    `through` when each key of `first_days` has its values recomputed from its `from_day` on: rows
    to write (`DELETED` false) and stored rows to delete (true), on (attribute_key, valid_from). A
    key's interval that holds the day before its from_day keeps its start, and runs on if the
    values continue; its values are where the recomputation starts (`partials_from`), so nothing
    before it is read or written. An unchanged key yields no row. `earliest`: no from_day is
    before it (the reads skip the days and intervals before)."""
    names = [spec.name for spec in specs]
    keys = F.broadcast(first_days)
    days = days_from(first_days, through)
    if stored is None:
        return intervals(attributes_by_day(partials_from(daily, first_days, None, specs, earliest), specs, days), names).withColumn(
            DELETED, F.lit(False))
    if earliest is not None:
        stored = stored.where(F.col(VALID_TO).isNull() | (F.col(VALID_TO) >= F.lit(earliest)))
    stored = stored.join(keys, "attribute_key")
    # The stored intervals the recomputation can touch: from the one holding the day before from_day on.
    reaching = stored.where(F.col(VALID_TO).isNull() | (F.col(VALID_TO) >= F.col("from_day")))
    before = reaching.where(F.col(VALID_FROM) < F.col("from_day"))  # holds the day before: kept as it starts
    recomputed = attributes_by_day(partials_from(daily, first_days, before, specs, earliest), specs, days)
    start = before.select("attribute_key", F.col(VALID_FROM).alias(AS_OF), *names)
    rebuilt = intervals(start.unionByName(recomputed), names)
    kept = reaching.select(*rebuilt.columns)
    written = rebuilt.exceptAll(kept).withColumn(DELETED, F.lit(False))
    gone = kept.join(rebuilt, ["attribute_key", VALID_FROM], "left_anti").withColumn(DELETED, F.lit(True))
    return written.unionByName(gone)


def carried(spec: AttributeSpec) -> bool:
    """An attribute whose value as of a day follows from its value the day before and that day's
    partial: every lifetime one but a count_distinct, whose stored value is a count, not its set."""
    return spec.days is None and spec.aggregation != "count_distinct"


def first_partial_day(specs: list[AttributeSpec], earliest: date | None) -> date | None:
    """The first day of partials that a recomputation from `earliest` on reads (`partials_from`);
    None: every day (no `earliest`, or a lifetime count_distinct)."""
    return None if earliest is None or _whole(specs) else earliest - timedelta(days=_reach(specs))


def _reach(specs: list[AttributeSpec]) -> int:
    """The days before from_day a "last N days" value reads."""
    return max((spec.days - 1 for spec in specs if spec.days is not None), default=0)


def _whole(specs: list[AttributeSpec]) -> bool:
    """Whether a key's values need every day of its partials: a lifetime one not carried."""
    return any(spec.days is None and not carried(spec) for spec in specs)


def partials_from(
    daily: DataFrame, first_days: DataFrame, prior: DataFrame | None, specs: list[AttributeSpec], earliest: date | None,
) -> DataFrame:
    """The partials each key's values from its from_day on are computed from, as `_combine` reads
    them: a carried attribute's from from_day, with its value as of the day before (the `prior`
    interval of the stored history, holding that day) as one more partial dated that day; a
    "last N days" one's from N - 1 days before from_day; a lifetime count_distinct's from the key's
    first day. So a key's cost follows the days recomputed, not the length of its history."""
    rows = daily.join(F.broadcast(first_days), "attribute_key")
    if not _whole(specs):
        rows = rows.where(F.col("event_date") >= F.date_sub("from_day", _reach(specs)))
        first = first_partial_day(specs, earliest)
        if first is not None:  # a bound Delta prunes partitions by
            rows = rows.where(F.col("event_date") >= F.lit(first))
    since = F.col("event_date") >= F.col("from_day")
    partials = [(F.when(since, F.col(s.partial)) if carried(s) else F.col(s.partial)).alias(s.partial) for s in specs]
    rows = rows.select("attribute_key", "event_date", *partials)
    if prior is None:
        return rows
    day_before = F.date_sub("from_day", 1)
    values = [_as_partial(s, day_before, daily.schema[s.partial].dataType).alias(s.partial) for s in specs]
    return rows.unionByName(prior.select("attribute_key", day_before.alias("event_date"), *values))


def _as_partial(spec: AttributeSpec, day: Column, kind: T.DataType) -> Column:
    """A stored value as the partial of one day before every partial it is combined with: a first
    or last one stamped at that day's start, so that any later value wins a `last` and loses a
    `first`; none (of the partial's type) for an attribute not carried."""
    if not carried(spec):
        return F.lit(None).cast(kind)
    value = F.col(spec.name)
    if spec.aggregation in ("first", "last"):
        return F.when(value.isNotNull(), F.struct(day.cast("timestamp").alias("tstamp"), value.alias("value")))
    return value


def as_of_day_before(examples: DataFrame, history: DataFrame, key: str = "attribute_key", at: str = "timestamp") -> DataFrame:
    """`examples` with each attribute as of the end of the day before each row's `at` (its key in
    `key`): what was known when the example happened, never a later event. Every row comes back
    once; a key not seen by then gets nulls."""
    names = [c for c in history.columns if c not in ("attribute_key", VALID_FROM, VALID_TO)]
    day = F.date_sub(utc_day(examples[at], examples.schema[at].dataType), 1)
    valid = history.select(F.col("attribute_key").alias("_key"), VALID_FROM, VALID_TO, *names)
    holds = (examples[key] == valid["_key"]) & (valid[VALID_FROM] <= day) & (valid[VALID_TO].isNull() | (day < valid[VALID_TO]))
    return examples.join(valid, holds, "left").drop("_key", VALID_FROM, VALID_TO)


def utc_day(moment: Column, kind: T.DataType) -> Column:
    """The UTC day of `moment`, whatever the session's time zone: to_date of a timestamp follows
    the session's (a user's own session in Tokyo would put an example's day ahead of UTC's and
    leak the future into a lookup), so a timestamp goes by its epoch seconds. A naive timestamp
    is UTC already, as everywhere in the warehouse; a date is its own day."""
    if isinstance(kind, T.TimestampType):
        return F.date_from_unix_date(F.floor(F.unix_timestamp(moment) / SECONDS_A_DAY).cast("int"))
    return F.to_date(moment)


def day_arrivals(new_rows: DataFrame | pa.Table) -> list[DayArrivals]:
    """Per event day, the rows newly inserted into filtered_events: how many, how many late.

    Rows in Arrow (a small insert, read from deltalake's change feed) are counted as the preview
    counts them (arrivals_from_rows). Spark only groups by (event day, load day), a result small
    enough to collect; the rule itself is days.arrivals_by_day, which both share."""
    if isinstance(new_rows, pa.Table):
        return arrivals_from_rows(new_rows.to_pylist())
    delay_hours = (F.col("load_tstamp").cast("double") - F.col(TIMESTAMP).cast("double")) / 3600
    groups = (
        new_rows.groupBy("event_date", F.to_date("load_tstamp").alias("load_date"))
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.max("load_tstamp").alias("max_load_tstamp"),
            F.max(delay_hours).alias("max_delay_hours"),
        )
        .collect()
    )
    return arrivals_by_day(LoadGroup(**group.asDict()) for group in groups)
