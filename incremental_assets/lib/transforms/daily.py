"""Daily partials and attributes as DataFrame → DataFrame functions."""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.attributes import AttributeSpec, Condition
from incremental_assets.lib.incremental.days import DayArrivals, LoadGroup, arrivals_by_day

TIMESTAMP = "derived_tstamp"
ADDITIVE = ("count", "sum")


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


def _combine(spec: AttributeSpec, reference_day: date) -> Column:
    partial = F.col(spec.partial)
    if spec.days is not None:
        first_day = reference_day - timedelta(days=spec.days - 1)
        partial = F.when(F.col("event_date").between(F.lit(first_day), F.lit(reference_day)), partial)
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


def attributes_from_daily(daily: DataFrame, specs: list[AttributeSpec], reference_day: date) -> DataFrame:
    """One row per attribute_key, every attribute combined from the daily partials."""
    return daily.groupBy("attribute_key").agg(*[_combine(s, reference_day).alias(s.name) for s in specs])


def day_arrivals(new_rows: DataFrame) -> list[DayArrivals]:
    """Per event day, the rows newly inserted into filtered_events: how many, how many late.

    Spark only groups by (event day, load day), a result small enough to collect; the rule itself
    is logic.days.arrivals_by_day, which the preview shares."""
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
