"""The daily layer over the sample stream, checked against plain DataFrame queries on filtered_events."""

import os
import time
from datetime import date, timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus, extract_data_version_from_entry
from dagster._core.loader import LoadingContextForTest
from deltalake import DeltaTable
from pyspark.sql import Window
from pyspark.sql import functions as F

from incremental_assets.cli.runner import process_marked_days, run_days, run_incremental
from incremental_assets.definitions import build_definitions
from incremental_assets.lib import environment
from incremental_assets.lib import spark as spark_module
from incremental_assets.lib.catalog import ATTRIBUTES, ATTRIBUTES_HISTORY, DAILY_MANIFEST, FILTERED_EVENTS, MAINTENANCE_JOB
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import append_hours, generate_stream
from incremental_assets.lib.settings import IncrementalSettings, SettingsError, load_settings
from incremental_assets.lib.state.records import DEFERRED, PROCESSED
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.daily import daily_partials
from tests.warehouse_tables import attributes_values_from

PARAMS = SampleParams(users=8, days=4, events_per_day=200, start_date=date(2024, 3, 1), seed=3, late_share=0.2)
REFERENCE = date(2024, 3, 4)


def settings(**overrides):
    base = dict(start_date="2024-03-01", backfill_limit_days=2, attributes_reference_date=REFERENCE.isoformat())
    return IncrementalSettings(**{**base, **overrides})


def rows(df, order):
    return [tuple(r) for r in df.orderBy(*order).collect()]


def load_and_run(spark, chosen, runs=4):
    uri = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, uri, PARAMS, hours=2 * 24)
    instance = DagsterInstance.ephemeral()
    summaries = []
    for hours in [0] + [24] * (runs - 1):
        if hours:
            append_hours(spark, uri, hours)
        summary = run_incremental(chosen, now="2024-03-05T00:00:00", instance=instance)
        assert summary.success
        summaries.append(summary)
    return instance, summaries


def table(spark, warehouse, name):
    return read_table(spark, f"{warehouse}/{name}")


def expected_attributes(events, reference=REFERENCE):
    """Every sample attribute as of `reference`, straight from filtered_events."""
    week = F.col("event_date").between(F.lit(reference - timedelta(days=6)), F.lit(reference))
    page_view = F.col("event_name") == "page_view"
    latest_page = Window.partitionBy("user_identifier").orderBy(F.col("derived_tstamp").desc())
    last_page = (
        events.where(page_view & F.col("page_url").isNotNull())
        .withColumn("n", F.row_number().over(latest_page)).where("n = 1")
        .select(F.col("user_identifier").alias("k"), F.col("page_url").alias("last_page_url"))
    )
    per_user = events.groupBy(F.col("user_identifier").alias("k")).agg(
        F.count_if(page_view).alias("page_views"),
        F.count_if(page_view & week).alias("page_views_7d"),
        F.count_distinct(F.when(week, F.col("session_identifier"))).alias("sessions_7d"),
        F.min("derived_tstamp").alias("first_seen"),
        F.max("derived_tstamp").alias("last_seen"),
        F.array_sort(F.collect_set("app_id")).alias("distinct_apps"),
        F.count_if(F.col("event_name") == "add_to_cart").alias("carts_added"),
    )
    return per_user.join(last_page, "k", "left").select(
        "k", "page_views", "page_views_7d", "sessions_7d", "first_seen", "last_seen", "last_page_url",
        "distinct_apps", "carts_added",
    )


def test_daily_aggregates_and_attributes_match_a_direct_computation(spark, warehouse):
    chosen = settings(reprocess_days=30, min_rows_to_process=1)
    instance, summaries = load_and_run(spark, chosen)
    assert any(s.daily_runs for s in summaries[1:]), "later runs recompute days"
    # Days marked with a gap (late rows of an older day): one run per range, and attributes and their
    # history written once, by the last.
    StateStore().mark_to_process([date(2024, 3, 1), date(2024, 3, 3), date(2024, 3, 4)], run_id="late-rows")
    runs = process_marked_days(chosen, instance)
    assert [(r.days, "attributes" in r.metadata, "attributes_history" in r.metadata) for r in runs] == [
        (["2024-03-01"], False, False), (["2024-03-03", "2024-03-04"], True, True)]

    events = table(spark, warehouse, "filtered_events")
    daily = table(spark, warehouse, "daily_aggregates")
    scratch = daily_partials(events, chosen.attribute_specs(), "user_identifier")
    order = ["attribute_key", "event_date"]
    assert rows(daily.select(*scratch.columns), order) == rows(scratch, order)

    assert_attributes_as_of(spark, warehouse, events, REFERENCE)
    ways = attributes_values_from(instance)
    assert ways and set(ways) == {"attributes_history's current intervals"}, "the daily runs' writes: their history's"
    assert {d.status for d in StateStore().days().values()} == {PROCESSED}
    # Bounded by the rows they come from (attributes: the keys recomputed): few, written by deltalake.
    for name, operation in (("daily_aggregates", "WRITE"), ("attributes", "MERGE")):
        latest = next(c for c in DeltaTable(f"{warehouse}/{name}").history() if c["operation"] == operation)
        assert latest["engineInfo"].startswith("delta-rs"), (name, latest)


def assert_attributes_as_of(spark, warehouse, events, reference: date) -> None:
    attributes = table(spark, warehouse, "attributes").withColumnRenamed("attribute_key", "k")
    expected = expected_attributes(events.where(F.col("event_date") <= reference), reference)
    assert rows(attributes.select(*expected.columns), ["k"]) == rows(expected, ["k"])


def test_attributes_alone_behind_their_history_take_every_partial_and_both_ways_equal_a_direct_computation(spark, warehouse):
    """attributes takes its keys' values from attributes_history's open intervals when the history's
    newest write was built from the same daily_aggregates and reference day, else from every
    partial: the two ways, as the reference day moves on and 7-day values age out."""
    instance, _ = load_and_run(spark, settings(), runs=2)
    events = table(spark, warehouse, "filtered_events")
    for reference, selection, source in (
        (date(2024, 3, 9), {ATTRIBUTES}, "every partial of daily_aggregates"),  # the history still as of 03-04
        (date(2024, 3, 10), {ATTRIBUTES, ATTRIBUTES_HISTORY}, "attributes_history's current intervals"),
    ):
        chosen = settings(attributes_reference_date=reference.isoformat())
        job = build_definitions(chosen).resolve_implicit_global_asset_job_def().get_subset(
            asset_selection={AssetKey(name) for name in selection})
        assert job.execute_in_process(instance=instance).success
        assert attributes_values_from(instance)[0] == source, reference
        assert_attributes_as_of(spark, warehouse, events, reference)


def test_a_run_that_writes_no_row_leaves_what_reads_the_table_fresh_on_the_asset_page(spark, warehouse):
    """Found by looking at the UI: attributes_history materialized alone over unchanged
    daily_aggregates wrote nothing, yet the asset page marked attributes stale ("has a new
    dependency materialization"). A write of nothing keeps its table's data version; a write of
    rows gives it a new one, and what reads it is stale until it runs."""
    instance, _ = load_and_run(spark, settings(), runs=2)

    def alone(chosen, name):
        job = build_definitions(chosen).resolve_implicit_global_asset_job_def().get_subset(asset_selection={AssetKey(name)})
        result = job.execute_in_process(instance=instance)
        assert result.success
        [materialization] = result.asset_materializations_for_node(name)
        return materialization.metadata

    def version(name):
        return extract_data_version_from_entry(instance.get_latest_data_version_record(AssetKey(name)).event_log_entry)

    def marks(name):
        resolver = CachingStaleStatusResolver(instance, build_definitions(settings()).resolve_asset_graph(),
                                              LoadingContextForTest(instance))
        return resolver.get_status(AssetKey(name)), [cause.reason for cause in resolver.get_stale_causes(AssetKey(name))]

    assert marks(ATTRIBUTES) == (StaleStatus.FRESH, [])
    written = version(ATTRIBUTES_HISTORY)
    assert alone(settings(), ATTRIBUTES_HISTORY)["recomputed"].text.startswith("nothing: daily_aggregates unchanged")
    assert version(ATTRIBUTES_HISTORY) == written
    assert marks(ATTRIBUTES) == (StaleStatus.FRESH, [])

    later = settings(attributes_reference_date="2024-03-10")  # 7-day values age out: the history changes
    rewritten = alone(later, ATTRIBUTES_HISTORY)
    assert rewritten["keys_recomputed"].value > 0 and "written" not in rewritten  # `written`: False alone
    assert version(ATTRIBUTES_HISTORY) != written
    assert marks(ATTRIBUTES) == (StaleStatus.STALE, ["has a new dependency materialization"])
    alone(later, ATTRIBUTES)
    assert marks(ATTRIBUTES) == (StaleStatus.FRESH, [])


def test_late_days_stay_deferred_until_a_backfill_applies_them(spark, warehouse):
    chosen = settings(reprocess_days=30, min_rows_to_process=10_000)
    instance, _ = load_and_run(spark, chosen)
    days = StateStore().days()
    deferred = sorted(d for d, s in days.items() if s.status == DEFERRED)
    assert deferred, "late data in the stream leaves some days deferred"

    events = table(spark, warehouse, "filtered_events").groupBy("event_date").count()
    aggregated = table(spark, warehouse, "daily_aggregates").groupBy("event_date").agg(F.sum("events").alias("n"))
    behind = {r.event_date: r["count"] - (r.n or 0) for r in events.join(aggregated, "event_date", "left").collect()}
    for day in deferred:
        assert days[day].pending_late_events == behind[day] > 0

    summary = run_days(chosen, deferred[0], deferred[-1], instance)
    assert summary.success
    after = StateStore().days()
    assert all(after[d].status == PROCESSED and after[d].pending_late_events == 0 for d in deferred)
    daily = table(spark, warehouse, "daily_aggregates")
    scratch = daily_partials(table(spark, warehouse, "filtered_events"), chosen.attribute_specs(), "user_identifier")
    order = ["attribute_key", "event_date"]
    assert rows(daily.select(*scratch.columns), order) == rows(scratch, order)


def test_a_thirty_day_backfill_is_one_run_with_per_day_row_counts(spark, warehouse):
    chosen = settings()
    instance, _ = load_and_run(spark, chosen, runs=1)
    app_id = spark.sparkContext.applicationId
    summary = run_days(chosen, date(2024, 3, 1), date(2024, 3, 30), instance)
    assert summary.success and spark.sparkContext.applicationId == app_id
    [run] = instance.get_runs()[:1]
    assert run.run_id == summary.run_id
    events = instance.get_records_for_run(summary.run_id).records
    counts = {
        e.event_log_entry.dagster_event.partition: e.event_log_entry.asset_materialization.metadata["dagster/row_count"].value
        for e in events
        if e.event_log_entry.is_dagster_event and e.event_log_entry.dagster_event.is_step_materialization
        and e.event_log_entry.asset_materialization.asset_key.path[-1] == "daily_aggregates"
    }
    assert len(counts) == 30
    daily = table(spark, warehouse, "daily_aggregates").groupBy("event_date").count().collect()
    expected = {r.event_date.isoformat(): r["count"] for r in daily}
    assert counts == {key: expected.get(key, 0) for key in counts}
    assert len({v for v in counts.values()}) > 1


def test_a_run_of_days_or_of_attributes_starts_its_driver_for_the_rows_it_reads(spark, warehouse, monkeypatch):
    """A run of days in a process of its own (a daily run the daemon launches, a UI backfill, the
    command line's backfill) starts its JVM at its first Spark step, daily_aggregates, once it has
    counted from filtered_events' log what those days hold; a run of attributes and their history
    alone (what attributes_after_daily_aggregates requests) once it has counted daily_aggregates'
    rows. C1 alone and the small-step settings for few rows; both compilers and the session's own
    settings past SMALL_STEP_ROWS."""
    chosen = settings()
    instance, _ = load_and_run(spark, chosen, runs=1)
    asked, build = [], spark_module.build_spark_session
    monkeypatch.setattr(spark_module, "build_spark_session", lambda **kw: asked.append(kw.get("small", False)) or build(**kw))
    assert run_days(chosen, date(2024, 3, 1), date(2024, 3, 2), instance).success
    assert asked[0] is True, "the run's first Spark step asks for a driver sized for the days' few rows"
    assert {key: spark.conf.get(key) for key in spark_module.SIZED_CONF} == spark_module.SIZED_CONF
    following = build_definitions(chosen).resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={AssetKey(ATTRIBUTES), AssetKey(ATTRIBUTES_HISTORY)})
    asked.clear()
    assert following.execute_in_process(instance=instance).success
    assert asked[0] is True, "attributes alone: a driver sized for daily_aggregates' few rows"
    monkeypatch.setattr(spark_module, "SMALL_STEP_ROWS", 0)  # the rows are "many"
    asked.clear()
    assert run_days(chosen, date(2024, 3, 1), date(2024, 3, 2), instance).success
    assert asked[0] is False, "a driver for many rows keeps C2"
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true" and spark.conf.get(spark_module.SHUFFLE_PARTITIONS) != "1"


def test_a_run_of_days_or_of_attributes_without_its_input_table_is_refused_before_it_writes(warehouse):
    """Their input is read only after the step has asked for its session (above): a missing table
    is still named before the run takes the lease or records anything."""
    chosen, instance = settings(), DagsterInstance.ephemeral()
    summary = run_days(chosen, date(2024, 3, 1), date(2024, 3, 1), instance)
    assert not summary.success and f"No Delta table at {warehouse}/filtered_events" in summary.error, summary.error
    following = build_definitions(chosen).resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={AssetKey(ATTRIBUTES), AssetKey(ATTRIBUTES_HISTORY)})
    result = following.execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success
    errors = [event.event_specific_data.error.to_string() for event in result.all_events if event.is_step_failure]
    assert errors and all(f"No Delta table at {warehouse}/daily_aggregates" in error for error in errors), errors
    assert not list(Path(warehouse).iterdir()), "nothing written: no lease, no run-log record, no fingerprint"


@pytest.mark.parametrize(
    "definition, message",
    [
        ({"name": "x", "aggregation": "median", "property": "page_url"}, "aggregation must be one of"),
        ({"name": "x", "aggregation": "sum"}, "aggregation sum needs a property column"),
        ({"name": "x", "aggregation": "count", "period": "last fortnight"}, "period must be 'lifetime' or 'last N days'"),
    ],
)
def test_invalid_attribute_definitions_fail_at_load(definition, message):
    with pytest.raises(SettingsError, match=message):
        build_definitions(load_settings(overrides={"attributes": [definition]}, environ={}))


def _age_log(uri: str, days: int) -> None:
    """Make every commit file look `days` old: Delta's log cleanup goes by file time."""
    past = time.time() - days * 86_400
    for entry in Path(uri, "_delta_log").glob("*.json"):
        os.utime(entry, (past, past))


def _clean_up_log(uri: str) -> None:
    """What Delta does after a checkpoint once delta.logRetentionDuration has passed."""
    table = DeltaTable(uri)
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 1 hour"}, raise_if_not_exists=False)
    table = DeltaTable(uri)
    table.create_checkpoint()
    _age_log(uri, 2)
    table.cleanup_metadata()


def test_the_daily_layer_counts_every_insert_once_after_delta_log_cleanup(spark, warehouse):
    params = SampleParams(users=6, days=3, events_per_day=150, start_date=date(2024, 3, 1), seed=5, late_share=0.2)
    chosen = IncrementalSettings(start_date="2024-03-01", reprocess_days=30, min_rows_to_process=1)
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, source, params, hours=36)
    instance = DagsterInstance.ephemeral()
    assert run_incremental(chosen, now="2024-03-02T12:00:00", instance=instance).success
    state = StateStore()
    consumed = state.consumed_version()
    daily_uri = state.uri(DAILY_MANIFEST)

    _clean_up_log(daily_uri)
    assert not Path(daily_uri, "_delta_log", f"{0:020}.json").exists(), "the first commits are gone"
    assert state.consumed_version() == consumed, "the consumed version outlives log cleanup"

    append_hours(spark, source, 36)
    assert run_incremental(chosen, now="2024-03-04T00:00:00", instance=instance).success
    per_day = {r.event_date: r["count"] for r in read_table(spark, f"{warehouse}/filtered_events").groupBy("event_date").count().collect()}
    days = state.days()
    assert {d: s.processed_events + s.pending_late_events for d, s in days.items()} == per_day
    assert {s.status for s in days.values()} == {"processed"}


def _maintenance(settings: IncrementalSettings) -> str:
    """maintenance_job as its schedule runs it; its table of passes."""
    result = build_definitions(settings).resolve_job_def(MAINTENANCE_JOB).execute_in_process(
        instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    [output] = [e.event_specific_data.metadata for e in result.all_events if e.is_successful_output]
    return output["tables"].value


def _stored_per_day(spark, warehouse) -> dict:
    rows = read_table(spark, f"{warehouse}/filtered_events").groupBy("event_date").count().collect()
    return {row.event_date: row["count"] for row in rows}


DORMANT = SampleParams(users=6, days=3, events_per_day=150, start_date=date(2024, 3, 1), seed=5, late_share=0.2)
DORMANT_SETTINGS = IncrementalSettings(start_date="2024-03-01", reprocess_days=30, min_rows_to_process=1)


def test_a_stream_that_ended_resumes_after_maintenance_and_log_cleanup_with_every_insert_counted_once(spark, warehouse):
    """Finding: with the stream ended no run read filtered_events, while maintenance compacted it;
    once Delta's log cleanup had removed the first of those commits, the run of the resumed stream
    failed reading the change feed from it, and maintenance stopped with StopIteration."""
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, source, DORMANT, hours=36)
    instance = DagsterInstance.ephemeral()
    assert run_incremental(DORMANT_SETTINGS, now="2024-03-02T12:00:00", instance=instance).success
    append_hours(spark, source, 6)  # the same day again: a second file in its partition
    assert run_incremental(DORMANT_SETTINGS, now="2024-03-02T18:00:00", instance=instance).success
    state, uri = StateStore(), f"{warehouse}/{FILTERED_EVENTS}"
    read = state.consumed_version()
    assert read == DeltaTable(uri).version()

    # The stream ends. Maintenance compacts filtered_events; Delta's log cleanup follows, in time.
    _maintenance(DORMANT_SETTINGS)
    assert any(commit["operation"] == "OPTIMIZE" and commit["version"] > read for commit in DeltaTable(uri).history())
    assert state.consumed_version() == DeltaTable(uri).version(), "commits that changed no data are not left to read"
    _clean_up_log(uri)
    assert not Path(uri, "_delta_log", f"{read + 1:020}.json").exists(), "the first commit after the last run is gone"

    # The stream resumes: every insert is counted once, and maintenance passes again.
    append_hours(spark, source, 36)
    assert run_incremental(DORMANT_SETTINGS, now="2024-03-04T00:00:00", instance=instance).success
    days = state.days()
    assert {d: s.processed_events + s.pending_late_events for d, s in days.items()} == _stored_per_day(spark, warehouse)
    assert {s.status for s in days.values()} == {PROCESSED}
    _maintenance(DORMANT_SETTINGS)


def test_a_change_feed_whose_first_unread_commit_left_the_log_is_named_and_maintenance_keeps_its_files(spark, warehouse):
    """A commit nobody read that left the log (a warehouse of an earlier release, dormant past the
    log's retention): what it changed cannot be told, so the run names it and the way back, instead
    of Spark's version error; maintenance does not vacuum the files the change feed would need."""
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, source, DORMANT, hours=30)
    instance = DagsterInstance.ephemeral()
    assert run_incremental(DORMANT_SETTINGS, now="2024-03-02T06:00:00", instance=instance).success
    uri = f"{warehouse}/{FILTERED_EVENTS}"
    read = StateStore().consumed_version()
    DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "false"})  # a commit no run read
    _clean_up_log(uri)
    assert not Path(uri, "_delta_log", f"{read + 1:020}.json").exists()

    append_hours(spark, source, 6)
    failed = run_incremental(DORMANT_SETTINGS, now="2024-03-02T12:00:00", instance=instance)
    assert not failed.success and failed.failure is not None
    told = str(failed.failure)
    assert f"commit {read + 1}, the first the daily aggregation manifest has not counted, is gone" in told, told
    assert "incremental-assets refresh" in told, told
    tables = _maintenance(DORMANT_SETTINGS)
    assert f"not vacuumed: the daily manifest has not read the change feed of commit {read + 1} (gone from the log) yet" in tables, tables
