"""attributes_history: every key's attributes as of the end of each day, one row per interval of
days with the same values, kept incrementally from daily_aggregates.

Each write carries, in its commit, the version of daily_aggregates and the last day it was computed
from (`BUILT_FROM`). The next run recomputes only the keys whose daily rows changed since then
(added, removed or with another partial), from the first day one changed, and the keys whose "last
N days" values age out on the days since; each from its stored values of the day before, so its
cost follows the keys and days recomputed, not the history's length. It writes only the rows that
differ. A run that changes nothing writes nothing, and a re-run after a crash finds its rows there. With no usable mark (a first run, a table emptied
by a refresh or a plan, a daily_aggregates version that can no longer be read) every key is
recomputed from its first day.
"""

from dataclasses import dataclass
from datetime import date, timedelta
from functools import reduce

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, AssetIn, Output
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.assets import spark_delta_asset
from incremental_assets.lib.attributes import AttributeSpec
from incremental_assets.lib.catalog import ATTRIBUTES_HISTORY, DAILY_AGGREGATES, DAILY_GROUP
from incremental_assets.lib.checks import from_offending_rows
from incremental_assets.lib.delta.log import latest_marker, partitions_changed, row_count, rows_as_of, stored_table
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.delta.spec import Rows, Stored, delta_table
from incremental_assets.lib.environment import table_uri
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.settings_plan import start_writing
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms.daily import VALID_FROM, history_changes

BUILT_FROM = "attributes_history_built_from"  # the mark in each write's commit
MARK_WITHIN = 100  # commits looked back for it (maintenance adds a few a day); beyond: rebuilt whole
TILED = "intervals_tile_each_key"


@dataclass(frozen=True)
class BuiltFrom:
    """What the stored history was computed from: daily_aggregates (its table id and version) and
    the last day (the reference day of that run)."""

    table_id: str
    version: int
    through: date

    def as_marker(self) -> dict:
        return {BUILT_FROM: {"table_id": self.table_id, "version": self.version, "through": self.through.isoformat()}}

    @classmethod
    def stored(cls, uri: str) -> "BuiltFrom | None":
        """The mark of the stored history's latest write; None when none says."""
        raw = latest_marker(uri, BUILT_FROM, within=MARK_WITHIN)
        return None if raw is None else cls(raw["table_id"], raw["version"], date.fromisoformat(raw["through"]))


@spark_delta_asset(
    ins={"daily": AssetIn(DAILY_AGGREGATES)},
    group_name=DAILY_GROUP,
    metadata=delta_table(
        "apply_changes", keys=["attribute_key", VALID_FROM], stats_columns=["attribute_key", VALID_FROM, "valid_to"]
    ),
    check_specs=[
        AssetCheckSpec(
            TILED,
            asset=ATTRIBUTES_HISTORY,
            description="The intervals of every key the run recomputed follow each other from its first day without "
            "gap or overlap, only the last one open, each with some value changed from the one before.",
        )
    ],
    description="One row per attribute_key and interval of days [valid_from, valid_to) with the same values: "
    "every declared attribute as of the end of each of those days (valid_to null: the current values). "
    "Kept from daily_aggregates: a recomputed day rebuilds its keys' rows from that day on, nothing else.",
)
def attributes_history(
    context: AssetExecutionContext, daily: Stored, settings: IncrementalSettings, state: StateStore, spark: SparkResource
):
    uri, daily_uri = table_uri(ATTRIBUTES_HISTORY), table_uri(DAILY_AGGREGATES)
    start_writing(context, settings, state)  # a run of the history alone (attributes_after_daily_aggregates)
    specs, through = settings.attribute_specs(), settings.reference_day()
    source = stored_table(daily_uri)
    now = BuiltFrom(source.metadata().id, source.version(), through)
    session = spark.session_for(source.count())  # the partials it may read, from the log just opened
    partials = daily.frame
    stored = read_table(session, uri) if row_count(uri) else None  # none, or emptied: rebuilt whole
    before = BuiltFrom.stored(uri) if stored is not None else None
    first_days = keys_to_recompute(partials, daily_uri, stored, before, now, specs)
    if first_days is None:
        yield Output(Rows(None), metadata={"recomputed": f"nothing: daily_aggregates unchanged since version {before.version}"})
        yield AssetCheckResult(check_name=TILED, passed=True, metadata={"checked": "nothing: no key recomputed"})
        return
    first_days = first_days.cache()
    keys, earliest = first_days.agg(F.count(F.lit(1)), F.min("from_day")).first()
    changes = history_changes(partials, stored, first_days, specs, through, earliest).cache()
    count = changes.count()
    scope = "every key from its first day" if before is None else f"the keys daily_aggregates changed since version {before.version}"
    context.log.info(f"attributes_history: {scope} ({keys} keys), through {through}: {count} rows to write")
    yield Output(
        Rows(changes if count else None, rows_at_most=count, marker=now.as_marker()),
        metadata={"recomputed": scope, "keys_recomputed": keys, "history_through": through.isoformat()},
    )
    changes.unpersist()
    if count:
        written = read_table(session, uri).join(first_days.select("attribute_key"), "attribute_key")
        yield from_offending_rows(
            V.interval_violations(written, [spec.name for spec in specs]), "intervals that do not tile their key's days",
            f"the {keys} keys recomputed", check_name=TILED,
        )
    else:
        yield AssetCheckResult(check_name=TILED, passed=True, metadata={"checked": "nothing: no row changed"})
    first_days.unpersist()


def keys_to_recompute(
    daily: DataFrame, daily_uri: str, stored: DataFrame | None, before: BuiltFrom | None, now: BuiltFrom,
    specs: list[AttributeSpec],
) -> DataFrame | None:
    """(attribute_key, from_day): the keys whose history may differ from `stored` from that day on
    now; None when none can."""
    if before is None or before.table_id != now.table_id or before.through > now.through:
        return _every_key(daily, stored)
    if before.version == now.version and before.through == now.through:
        return None
    days = partitions_changed(daily_uri, before.version, "event_date")
    if days is None:
        return _every_key(daily, stored)
    touched = [date.fromisoformat(day) for day in days if day is not None]
    changed = changed_rows(daily_uri, before.version, now.version, touched) if touched else []
    if changed is None:
        return _every_key(daily, stored)
    spark = daily.sparkSession
    keys = spark.createDataFrame(changed, daily.select("attribute_key", "event_date").schema) if changed else None
    aging = _aging(daily, specs, before.through, now.through)
    if aging is not None:
        keys = aging if keys is None else keys.unionByName(aging)
    if keys is None:
        return None
    return keys.groupBy("attribute_key").agg(F.min("event_date").alias("from_day"))


def changed_rows(daily_uri: str, was: int, now: int, days: list[date]) -> list[tuple] | None:
    """(attribute_key, event_date) of the rows of `days` that daily_aggregates' version `now` holds
    and `was` did not hold the same: added, removed or with a partial changed. A run rewrites
    its days whole, yet changes the rows of the keys its events came from. None when `was`
    cannot be read any more. Read with deltalake: a few thousand rows, no Spark job."""
    on_days = [("event_date", "in", [day.isoformat() for day in days])]
    before, after = rows_as_of(daily_uri, was, None, on_days), rows_as_of(daily_uri, now, None, on_days)
    if before is None or after is None:
        return None
    old, new = ({(r["attribute_key"], r["event_date"]): r for r in t.to_pylist()} for t in (before, after))
    if before.schema.names != after.schema.names:  # a column added or dropped: every row differs
        return sorted(old.keys() | new.keys())
    return sorted(pair for pair in old.keys() | new.keys() if old.get(pair) != new.get(pair))


def _every_key(daily: DataFrame, stored: DataFrame | None) -> DataFrame:
    """Every key from its first day (or its first stored row's, if earlier: a key gone from daily)."""
    first = daily.select("attribute_key", F.col("event_date").alias("day"))
    if stored is not None:
        first = first.unionByName(stored.select("attribute_key", F.col(VALID_FROM).alias("day")))
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
