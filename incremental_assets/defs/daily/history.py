"""attributes_history: every key's attributes as of the end of each day, one row per interval of
days with the same values, kept incrementally from daily_aggregates.

A run recomputes the keys that changed since the history's last write (changed_keys: its mark
`BUILT_FROM`), from the first day one changed, each from its stored values of the day before, so
its cost follows the keys and days recomputed, not the history's length. It writes only the rows
that differ. A run that changes nothing writes nothing, and a re-run after a crash finds its rows
there. With no usable mark every key is recomputed from its first day.
"""

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, AssetIn, Output
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.defs.daily.changed_keys import of_keys, since_last_write
from incremental_assets.lib.assets import spark_delta_asset
from incremental_assets.lib.catalog import ATTRIBUTES_HISTORY, DAILY_AGGREGATES, DAILY_GROUP
from incremental_assets.lib.checks import from_offending_rows
from incremental_assets.lib.delta.read import naming, read_just_written, read_to_check
from incremental_assets.lib.delta.spec import Rows, Stored, delta_table
from incremental_assets.lib.environment import table_uri
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.settings_plan import start_writing
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms.daily import VALID_FROM, first_partial_day, history_changes

BUILT_FROM = "attributes_history_built_from"  # the mark in each write's commit (changed_keys.BuiltFrom)
TILED = "intervals_tile_each_key"


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
    uri = table_uri(ATTRIBUTES_HISTORY)
    start_writing(context, settings, state)  # a run of the history alone (attributes_after_daily_aggregates)
    specs, through = settings.attribute_specs(), settings.reference_day()
    found = since_last_write(spark.session_for, daily, uri, table_uri(DAILY_AGGREGATES), BUILT_FROM, specs, through,
                             lambda stored: stored[VALID_FROM])
    stored, before, now, first_days, partials = found.stored, found.before, found.now, found.keys, daily.frame
    if first_days is None:
        yield Output(Rows(None), metadata={"recomputed": f"nothing: daily_aggregates unchanged since version {before.version}"})
        yield AssetCheckResult(check_name=TILED, passed=True, metadata={"checked": "nothing: no key recomputed"})
        return
    first_days = first_days.cache()
    keys, earliest = first_days.agg(F.count(F.lit(1)), F.min("from_day")).first()
    named = naming(first_days, "attribute_key", keys)
    first = first_partial_day(specs, earliest)  # history_changes reads no partial before
    days = [] if first is None else [("event_date", ">=", first)]
    partials, stored = of_keys(partials, table_uri(DAILY_AGGREGATES), named, days), of_keys(stored, uri, named)
    changes = history_changes(partials, stored, first_days, specs, through, earliest).cache()
    count = changes.count()
    scope = "every key from its first day" if before is None else f"the keys daily_aggregates changed since version {before.version}"
    context.log.info(f"attributes_history: {scope} ({keys} keys), through {through}: {count} rows to write")
    yield Output(
        Rows(changes if count else None, rows_at_most=count, marker=now.as_marker(BUILT_FROM)),
        metadata={"recomputed": scope, "keys_recomputed": keys, "history_through": through.isoformat()},
    )
    changes.unpersist()
    if count:
        names = [spec.name for spec in specs]
        columns = ["attribute_key", VALID_FROM, "valid_to", *names]
        if named:  # a small read is looked at in Arrow, with no Spark job
            written = read_to_check(partials.sparkSession, uri, columns, named)
        else:  # read whole: joined down to the recomputed keys
            written = read_just_written(partials.sparkSession, uri, columns).join(first_days.select("attribute_key"), "attribute_key")
        yield from_offending_rows(
            V.interval_violations(written, names), "intervals that do not tile their key's days",
            f"the {keys} keys recomputed", check_name=TILED,
        )
    else:
        yield AssetCheckResult(check_name=TILED, passed=True, metadata={"checked": "nothing: no row changed"})
    first_days.unpersist()

