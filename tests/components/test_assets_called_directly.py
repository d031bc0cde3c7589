"""The core incremental assets called as plain functions with a built context: a plan and a batch in,
the rows to store out (no IO manager, no run, so no state is written: `run_of` is None)."""

from datetime import date, datetime

from dagster import build_asset_context

from incremental_assets.defs.incremental.filtered_events import filtered_events
from incremental_assets.defs.incremental.sessions import sessions
from incremental_assets.lib.incremental.batch import Found, RunBatch
from incremental_assets.lib.incremental.limits import RunLimits, RunState
from incremental_assets.lib.incremental.run_plan import RunPlan
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.records import ManifestEntry
from incremental_assets.lib.state.store import StateStore

SETTINGS = IncrementalSettings(start_date="2024-03-01", event_names=["page_view"], upsert_lookback_days=1)
LIMITS = RunLimits(RunState.STANDARD, datetime(2024, 3, 2), datetime(2024, 3, 3), datetime(2024, 3, 5))
COLUMNS = "event_id string, session_identifier string, user_identifier string, app_id string, event_name string, " \
          "page_url string, derived_tstamp timestamp, load_tstamp timestamp"
EVENTS = [
    ("e1", "s1", "u1", "web", "page_view", "/a", datetime(2024, 3, 2, 10), datetime(2024, 3, 2, 10)),
    ("e2", "s1", "u1", "web", "page_view", "/b", datetime(2024, 3, 2, 11), datetime(2024, 3, 2, 11)),
    ("e3", "s2", "u2", "web", "add_to_cart", None, datetime(2024, 3, 2, 12), datetime(2024, 3, 2, 12)),
]


def call(asset, spark, entries=None, limits=LIMITS):
    batch = RunBatch(spark.createDataFrame(EVENTS, COLUMNS), limits, None, Found(3, datetime(2024, 3, 2, 12), 0),
                     "load_tstamp", "run-1")
    plan = RunPlan(limits, "run-1", (asset.key.path[-1],), entries or {})
    [output] = list(asset(build_asset_context(), plan=plan, batch=batch, state=StateStore(), settings=SETTINGS))
    return output


def test_sessions_build_one_row_per_session_keyed_by_the_deciding_run(spark):
    output = call(sessions, spark)
    rows = output.value
    assert sorted((r.session_identifier, r.events, r.page_views) for r in rows.frame.collect()) == [("s1", 2, 2), ("s2", 1, 0)]
    assert (rows.decided_by, rows.rows_at_most, rows.merge_floor) == ("run-1", 3, date(2024, 3, 1))
    assert output.metadata["manifest_position"].value == "2024-03-02 12:00:00"


def test_filtered_events_keep_the_selected_events_with_their_day(spark):
    output = call(filtered_events, spark)
    rows = output.value
    assert sorted((r.event_id, r.event_date) for r in rows.frame.collect()) == [("e1", date(2024, 3, 2)), ("e2", date(2024, 3, 2))]
    assert (rows.rows_at_most, output.metadata["filtered_out_by_event_name"].value) == (2, 1)


def test_an_asset_already_past_the_window_builds_nothing(spark):
    ahead = {"sessions": ManifestEntry("sessions", last_success=datetime(2024, 3, 4))}
    output = call(sessions, spark, entries=ahead)
    assert output.value.frame is None
    assert output.metadata["skipped"].value == "already ahead of this run's window"


def test_an_explicit_window_builds_but_says_the_manifest_stays(spark):
    keyhole = RunLimits(RunState.KEYHOLE, LIMITS.lower, LIMITS.upper, LIMITS.now)
    output = call(sessions, spark, limits=keyhole)
    assert output.value.frame.count() == 2
    assert output.metadata["manifest"].value == "not moved: explicit window (keyhole backfill)"


def test_the_sample_loader_appends_only_the_hours_due_by_now(spark, spark_resource, warehouse):
    """The launchpad's `hours: 24` on a stream loaded up to two hours ago appends those two: rows
    stamped ahead of the clock would wait unseen while the sensor calls the warehouse caught up."""
    from datetime import timedelta

    from incremental_assets.defs.source import SampleBatchConfig, atomic_events
    from incremental_assets.lib import environment
    from incremental_assets.lib.sample.generator import SampleParams
    from incremental_assets.lib.sample.stream import generate_stream, read_stream_state
    from incremental_assets.lib.utc import utcnow

    now = utcnow()
    start = now.date() - timedelta(days=1)
    loaded = int((now - datetime.combine(start, datetime.min.time())).total_seconds() // 3600) - 2
    uri = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, uri, SampleParams(users=3, days=2, events_per_day=48, start_date=start, seed=2), hours=loaded)

    result = atomic_events(build_asset_context(), SampleBatchConfig(hours=24), spark_resource)
    assert result.metadata["hours_appended"] == 2
    _, loaded_until = read_stream_state(uri)
    assert loaded_until <= utcnow() and loaded_until == datetime.combine(start, datetime.min.time()) + timedelta(hours=loaded + 2)
    assert result.metadata["dagster/row_count"] > 0 and result.metadata["dagster/column_schema"].columns

    again = atomic_events(build_asset_context(), SampleBatchConfig(hours=24), spark_resource)
    assert again.metadata["hours_appended"] == 0 and again.metadata["rows_appended"] == 0


def test_the_sample_loader_leaves_a_table_that_is_not_the_sample_stream_as_it_is(spark, spark_resource, warehouse):
    """Finding: with a Snowplow export as atomic_events (the layout of ../shared/repro), Materialize
    on atomic_events (or Materialize all on the lineage page) replaced the export with the sample's
    first hour. It now appends nothing and records the table's version: the table keeps its
    version and rows, and a Materialize all goes on to the steps after it."""
    from incremental_assets.defs.source import SampleBatchConfig, atomic_events
    from incremental_assets.lib import environment
    from incremental_assets.lib.delta.log import stored_table

    uri = environment.table_uri(environment.ATOMIC_EVENTS)
    spark.createDataFrame([("e1", "u1"), ("e2", "u2")], "event_id string, domain_userid string").write.format("delta").save(uri)
    result = atomic_events(build_asset_context(), SampleBatchConfig(hours=1), spark_resource)
    assert {name: result.metadata[name] for name in ("rows_appended", "hours_appended", "delta_version")} == {
        "rows_appended": 0, "hours_appended": 0, "delta_version": 0}
    assert stored_table(uri).version() == 0 and spark.read.format("delta").load(uri).count() == 2
