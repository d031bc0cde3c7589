"""The whole incremental job over the generated sample stream, checked against plain DataFrame
queries on the source (not the production code path)."""

import asyncio
from datetime import date, datetime

from dagster import AssetCheckKey, AssetKey, DagsterInstance
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionResolvedStatus
from pyspark.sql import functions as F

from incremental_assets.cli.preview import preview
from incremental_assets.cli.runner import run_incremental
from incremental_assets.lib import environment
from incremental_assets.lib.delta.log import table_exists
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import append_hours, generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from tests.warehouse_tables import found_alike_by_checks, read_alike_by_checks

PARAMS = SampleParams(users=10, days=5, events_per_day=250, start_date=date(2024, 3, 1), bot_share=0.2, seed=7)
SETTINGS = IncrementalSettings(start_date="2024-03-01", backfill_limit_days=2)
NOW = "2024-03-06T06:00:00"


def expected_quarantine(source):
    """Sessions whose eligible events span max_session_days (3) or more, computed directly."""
    eligible = source.where(
        F.col("event_id").isNotNull()
        & F.col("domain_sessionid").isNotNull()
        & (F.col("dvce_sent_tstamp") <= F.col("dvce_created_tstamp") + F.expr("INTERVAL 3 DAYS"))
    )
    spans = eligible.groupBy("domain_sessionid").agg(F.min("load_tstamp").alias("lo"), F.max("load_tstamp").alias("hi"))
    return {r[0] for r in spans.where(F.col("hi") >= F.col("lo") + F.expr("INTERVAL 3 DAYS")).collect()}


def test_sample_stream_end_to_end(spark, warehouse):
    source_uri = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, source_uri, PARAMS, hours=4 * 24)
    source = read_table(spark, source_uri)
    reloaded = source.where(F.col("event_id").isNotNull()).groupBy("event_id").agg(
        F.count_distinct(F.date_trunc("hour", "load_tstamp")).alias("batches")
    )
    assert reloaded.where(F.col("batches") > 1).count() > 0, "the stream must load some duplicates in later batches"

    peek = preview(SETTINGS, now=datetime(2024, 3, 5))
    assert (peek.limits.state.value, peek.new_events > 0) == ("first_run", True)
    assert peek.days_to_recompute == ["2024-03-01", "2024-03-02"]
    assert not table_exists(f"{warehouse}/incremental_manifest"), "preview writes nothing"

    instance = DagsterInstance.ephemeral()
    states = []
    for _ in range(3):
        summary = run_incremental(SETTINGS, now="2024-03-05T00:00:00", instance=instance)
        assert summary.success
        states.append(summary.value("new_event_limits", "run_state"))
    assert states[0] == "first_run" and summary.caught_up

    append_hours(spark, source_uri, 24)  # the fifth day arrives in 24 hourly batches
    summary = run_incremental(SETTINGS, now=NOW, instance=instance)
    assert summary.success and summary.caught_up
    assert summary.daily_runs, "the fifth day's events marked days to recompute"

    source = read_table(spark, source_uri)
    filtered = read_table(spark, f"{warehouse}/filtered_events")
    assert filtered.groupBy("event_id").count().where("count > 1").count() == 0

    quarantined = {r[0] for r in read_table(spark, f"{warehouse}/quarantined_sessions").collect()}
    expected = expected_quarantine(source.where(F.col("load_tstamp") <= F.lit(datetime(2024, 3, 6))))
    assert expected and quarantined == expected

    lifecycle = read_table(spark, f"{warehouse}/sessions_lifecycle_manifest")
    capped = filtered.join(lifecycle.select("session_identifier", "start_tstamp"), "session_identifier")
    assert capped.where(F.col("load_tstamp") > F.col("start_tstamp") + F.expr("INTERVAL 3 DAYS")).count() == 0

    # Running again with nothing new changes no table.
    tables = ("filtered_events", "sessions", "sessions_lifecycle_manifest", "quarantined_sessions")
    before = {t: sorted(map(tuple, read_table(spark, f"{warehouse}/{t}").collect())) for t in tables}
    again = run_incremental(SETTINGS, now=NOW, instance=instance)
    assert again.success and again.value("filtered_events", "new_events", 0) == 0
    assert before == {t: sorted(map(tuple, read_table(spark, f"{warehouse}/{t}").collect())) for t in tables}

    # Freshness is evaluated in the runs that write its table: fresh right after them, not "not evaluated".
    for asset, run_id in (("filtered_events", again.run_id), ("daily_aggregates", summary.daily_runs[-1].run_id)):
        [latest] = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey(asset), "freshness_check"), limit=1)
        assert latest.run_id == run_id, asset
        assert asyncio.run(latest.resolve_status(LoadingContextForTest(instance))) == AssetCheckExecutionResolvedStatus.SUCCEEDED

    read_alike_by_checks(spark, warehouse)  # what the checks read through deltalake is what Spark reads
    found_alike_by_checks(spark, warehouse)  # and what they find there in Arrow, what Spark finds
