"""Which keys' attributes may have changed since a table was last computed from daily_aggregates:
what attributes and attributes_history each recompute, so that a run costs the keys it changed,
not every key of the days it rewrote.

Each write of either table carries, in its commit, the version of daily_aggregates and the
reference day it was computed from (`BuiltFrom`, under the table's own mark). The next run
recomputes the keys whose daily rows changed since that version (added, removed or with another
partial), those whose "last N days" values age out on the days since, and those whose rows dated
after the last reference day come into the days counted. With no usable mark (a first run, a table
emptied by a refresh or a plan, a daily_aggregates version that can no longer be read) every key is
recomputed.
"""

from dataclasses import dataclass
from datetime import date, timedelta
from functools import reduce
from typing import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.lib.attributes import AttributeSpec
from incremental_assets.lib.delta.arrow import from_rows
from incremental_assets.lib.delta.compare import differing_keys
from incremental_assets.lib.delta.log import latest_marker, partitions_changed, row_count, rows_as_of, stored_table
from incremental_assets.lib.delta.read import read_just_written, read_table
from incremental_assets.lib.delta.spec import Stored

MARK_WITHIN = 100  # commits looked back for a mark (maintenance adds a few a day); beyond: rebuilt whole


@dataclass(frozen=True)
class BuiltFrom:
    """What a stored table was computed from: daily_aggregates (its table id and version) and the
    last day (the reference day of that run)."""

    table_id: str
    version: int
    through: date

    def as_marker(self, mark: str) -> dict:
        return {mark: {"table_id": self.table_id, "version": self.version, "through": self.through.isoformat()}}

    @classmethod
    def stored(cls, uri: str, mark: str, within: int = MARK_WITHIN) -> "BuiltFrom | None":
        """The mark of the stored table's latest write, among its last `within` commits (1: its
        newest commit's, so that no change after it passes unseen); None when none says."""
        raw = latest_marker(uri, mark, within=within)
        return None if raw is None else cls(raw["table_id"], raw["version"], date.fromisoformat(raw["through"]))


@dataclass(frozen=True)
class SinceLastWrite:
    """A table kept from daily_aggregates, as a run finds it: its rows (None: none, or emptied),
    what they were computed from (None: no usable mark) and from now on, and the keys to recompute
    (attribute_key, from_day; None: none)."""

    stored: DataFrame | None
    before: BuiltFrom | None
    now: BuiltFrom
    keys: DataFrame | None


def since_last_write(
    session_for: Callable[[int], SparkSession], daily: Stored, uri: str, daily_uri: str, mark: str,
    specs: list[AttributeSpec], through: date, first_day: Callable[[DataFrame], Column],
) -> SinceLastWrite:
    """What a run of the table at `uri` (its mark `mark`) recomputes to bring it to `through`.
    `session_for`: the session sized for daily_aggregates' rows, asked before `daily` is read (a
    run of the table alone starts its driver for them); `first_day`: the first day a stored row of
    a key holds."""
    source = stored_table(daily_uri)
    now = BuiltFrom(source.metadata().id, source.version(), through)
    session = session_for(source.count())
    stored = read_table(session, uri) if row_count(uri) else None
    before = BuiltFrom.stored(uri, mark) if stored is not None else None
    stored_keys = None if stored is None else stored.select("attribute_key", first_day(stored).alias("day"))
    return SinceLastWrite(stored, before, now, keys_to_recompute(daily.frame, daily_uri, stored_keys, before, now, specs))


def keys_to_recompute(
    daily: DataFrame, daily_uri: str, stored_keys: DataFrame | None, before: BuiltFrom | None, now: BuiltFrom,
    specs: list[AttributeSpec],
) -> DataFrame | None:
    """(attribute_key, from_day): the keys whose values may differ from the stored ones from that
    day on now; None when none can. `stored_keys` (attribute_key, day): the stored table's keys, each
    with the first day it holds, so that a key gone from daily is recomputed (to nothing) too."""
    if before is None or before.table_id != now.table_id or before.through > now.through:
        return _every_key(daily, stored_keys)
    if before.version == now.version and before.through == now.through:
        return None
    days = partitions_changed(daily_uri, before.version, "event_date")
    if days is None:
        return _every_key(daily, stored_keys)
    touched = [date.fromisoformat(day) for day in days if day is not None]
    changed = changed_rows(daily_uri, before.version, now.version, touched) if touched else []
    if changed is None:
        return _every_key(daily, stored_keys)
    spark = daily.sparkSession
    keys = from_rows(spark, changed, daily.select("attribute_key", "event_date").schema) if changed else None
    for moved in (_aging(daily, specs, before.through, now.through), _entering(daily, before.through, now.through)):
        if moved is not None:
            keys = moved if keys is None else keys.unionByName(moved)
    if keys is None:
        return None
    return keys.groupBy("attribute_key").agg(F.min("event_date").alias("from_day"))


def changed_rows(daily_uri: str, was: int, now: int, days: list[date]) -> list[tuple] | None:
    """(attribute_key, event_date) of the rows of `days` that daily_aggregates' version `now` holds
    and `was` did not hold the same: added, removed or with a partial changed. A run rewrites
    its days whole, yet changes the rows of the keys its events came from. None when `was`
    cannot be read any more. Read and compared with deltalake and Arrow: a few thousand rows, no
    Spark job."""
    on_days = [("event_date", "in", [day.isoformat() for day in days])]
    before, after = rows_as_of(daily_uri, was, None, on_days), rows_as_of(daily_uri, now, None, on_days)
    if before is None or after is None:
        return None
    return differing_keys(before, after, ["attribute_key", "event_date"])


def of_keys(rows: DataFrame | None, uri: str, named: list[tuple], days: list[tuple] = ()) -> DataFrame | None:
    """`rows`, the table at `uri` read whole, down to the keys `named` names (read.naming), read by
    name: a small read goes through deltalake (read_just_written), its files pruned by the filters
    `days` on a partition column (a bound the caller applies anyway). As `rows` with none named."""
    if rows is None or not named:
        return rows
    return read_just_written(rows.sparkSession, uri, rows.columns, [*named, *days])


def _every_key(daily: DataFrame, stored_keys: DataFrame | None) -> DataFrame:
    """Every key from its first day (or its first stored one's, if earlier: a key gone from daily)."""
    first = daily.select("attribute_key", F.col("event_date").alias("day"))
    if stored_keys is not None:
        first = first.unionByName(stored_keys.select("attribute_key", "day"))
    return first.groupBy("attribute_key").agg(F.min("day").alias("from_day"))


def _aging(daily: DataFrame, specs: list[AttributeSpec], last: date, through: date) -> DataFrame | None:
    """The keys some "last N days" value of which changes after `last` up to `through` as events
    age out of its window (the events of day e leave it on day e + N), each from the day after `last`."""
    spans = sorted({spec.days for spec in specs if spec.days is not None})
    if through <= last or not spans:
        return None
    leaving = [F.col("event_date").between(F.lit(last - timedelta(days=n - 1)), F.lit(through - timedelta(days=n))) for n in spans]
    rows = daily.where(reduce(Column.__or__, leaving)).select("attribute_key")
    return rows.distinct().withColumn("event_date", F.lit(last + timedelta(days=1)))


def _entering(daily: DataFrame, last: date, through: date) -> DataFrame | None:
    """The keys with partials dated after `last` up to `through`: counted from now on, though their
    rows may be unchanged (a reference date set ahead, or rows of a day after the last reference
    day), each from its first such day."""
    if through <= last:
        return None
    rows = daily.where(F.col("event_date").between(F.lit(last + timedelta(days=1)), F.lit(through)))
    return rows.groupBy("attribute_key").agg(F.min("event_date").alias("event_date"))
