"""The catalogue of bad inputs (README, "Bad input"): each case either stops the run before it
writes anything, with an error naming what is wrong, or is counted in the run's metadata and run
log while the rest is processed. One scenario holds the row-level cases, over three loads of an
export that lacks every optional column; the table-level cases each get their own source.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance

from incremental_assets.cli.runner import run_incremental, run_until_caught_up
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import REQUIRED_COLUMNS, contract_problems
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.utc import utcnow

DAY0 = (utcnow() - timedelta(days=90)).replace(hour=0, minute=0, second=0, microsecond=0)
SETTINGS = IncrementalSettings(start_date=DAY0.date().isoformat(), app_ids=["website"], backfill_limit_days=40)


def event(event_id, session, at, loaded, **overrides) -> dict:
    """A page view of the required columns only (no optional one: a minimal export)."""
    row = {
        "event_id": event_id, "app_id": "website", "event_name": "page_view", "collector_tstamp": at,
        "dvce_created_tstamp": at - timedelta(seconds=2), "dvce_sent_tstamp": at - timedelta(seconds=1),
        "derived_tstamp": at, "load_tstamp": loaded, "domain_sessionid": session, "domain_userid": f"user-of-{session}",
    }
    return {**row, **overrides}


def loads() -> list[list[dict]]:
    at, loaded = DAY0 + timedelta(hours=9), DAY0 + timedelta(hours=10)
    first = [
        *(event(f"clean-{i}", "clean", at + timedelta(minutes=i), loaded) for i in range(3)),
        event(None, "clean", at, loaded),  # null event_id
        event("no-cursor", "clean", at, None),  # null load_tstamp with the load_tstamp cursor
        # the same event_id twice in one load, different payloads: the one created first is kept
        event("twice", "clean", at, loaded, event_name="first_copy"),
        event("twice", "clean", at, loaded, event_name="second_copy", dvce_created_tstamp=at),
        event("skewed", "clean", at, loaded, dvce_sent_tstamp=at - timedelta(hours=2)),  # sent before created
        event("late-sent", "clean", at, loaded, dvce_sent_tstamp=at + timedelta(days=5)),
        event("other-app", "clean", at, loaded, app_id="not-allowed"),
        event("bot-0", "bot", at, loaded),
        event("undated", "clean", at, loaded, derived_tstamp=None),  # no derived_tstamp: no event_date
        # the device's clock runs 30 days ahead of the collector's: its day is far in the future
        event("future", "clean", at, loaded, derived_tstamp=utcnow() + timedelta(days=30)),
    ]
    later, loaded = DAY0 + timedelta(days=5, hours=9), DAY0 + timedelta(days=5, hours=10)
    second = [
        # across loads: an event_id already stored, with another payload, is not stored again
        event("clean-0", "replayed", later, loaded, event_name="replayed"),
        {**event("bot-5", "bot", later, loaded), "experiment": "b"},  # the source gains a column
        {**event("gained", "gained", later, loaded), "experiment": "b"},
    ]
    months, loaded = DAY0 + timedelta(days=70, hours=9), DAY0 + timedelta(days=70, hours=10)
    third = [{**event("bot-70", "bot", months, loaded), "experiment": "c"}]  # the bot session, months on
    return [first, second, [], third]  # [] : an empty load


# When each load's runs happen ('now' pinned, as the loads' load_tstamp are in the past).
RUN_AFTER = [DAY0 + timedelta(hours=11), DAY0 + timedelta(days=5, hours=11), DAY0 + timedelta(days=6), DAY0 + timedelta(days=70, hours=11)]


def as_arrow(rows: list[dict]) -> pa.Table:
    """Rows as a load (naive times are UTC), with the load_date partition column."""
    names = dict.fromkeys(name for row in rows for name in row)
    kind = {name: pa.timestamp("us", "UTC") if name.endswith("tstamp") else pa.string() for name in names}
    table = pa.table({name: pa.array([row.get(name) for row in rows], kind[name]) for name in names})
    return table.append_column("load_date", pa.array([r["load_tstamp"] and r["load_tstamp"].date() for r in rows], pa.date32()))


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    """Each load, then runs until caught up; returns what each load's runs reported, and the tables."""
    root = tmp_path_factory.mktemp("bad-inputs")
    saved = {name: os.environ.get(name) for name in ("INCREMENTAL_ASSETS_WAREHOUSE", "INCREMENTAL_ASSETS_SOURCE")}
    os.environ["INCREMENTAL_ASSETS_WAREHOUSE"] = str(root / "warehouse")
    os.environ["INCREMENTAL_ASSETS_SOURCE"] = source = str(root / "export")
    instance, reports = DagsterInstance.ephemeral(), []
    required = [name for name in REQUIRED_COLUMNS] + ["load_date"]
    for rows, now in zip(loads(), RUN_AFTER):
        if rows:
            frame = spark.createDataFrame(as_arrow(rows))
            frame = frame.select(*required, *(c for c in frame.columns if c not in required))
        else:  # an empty load: an append of no rows
            frame = spark.read.format("delta").load(source).limit(0)
        spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
        write_events(spark, frame, source, "append")
        spark.conf.unset("spark.databricks.delta.schema.autoMerge.enabled")
        reports.append(run_until_caught_up(SETTINGS, report=lambda line: None, instance=instance, now=now.isoformat()))
    tables = {name: read_table(spark, f"{root}/warehouse/{name}") for name in
              ("filtered_events", "sessions_lifecycle_manifest", "quarantined_sessions", "run_log")}
    yield reports, tables
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def _summed(reports, asset: str, key: str) -> int:
    return sum(summary.value(asset, key, 0) or 0 for runs in reports for summary in runs)


def test_every_run_succeeds_and_the_good_events_are_stored_once(scenario):
    reports, tables = scenario
    assert all(summary.success for runs in reports for summary in runs)
    stored = sorted(r.event_id for r in tables["filtered_events"].collect())
    assert stored == sorted(["clean-0", "clean-1", "clean-2", "twice", "skewed", "future", "bot-0", "gained"])


def test_rows_that_cannot_be_processed_are_counted_by_reason_in_metadata_and_the_run_log(scenario):
    reports, tables = scenario
    counted = {
        ("sessions_lifecycle_manifest", "dropped_null_event_id"): 1,
        ("sessions_lifecycle_manifest", "dropped_late_sent"): 1,
        ("sessions_lifecycle_manifest", "dropped_app_filtered"): 1,
        ("events_this_run", "duplicates_dropped"): 1,
        ("filtered_events", "dropped_null_derived_tstamp"): 1,
    }
    assert {key: _summed(reports[:1], *key) for key in counted} == counted
    assert _summed(reports[:1], "sessions_lifecycle_manifest", "null_cursor_rows") >= 1
    logged = {}
    for row in tables["run_log"].where("skipped IS NOT NULL").select("skipped").collect():
        for reason, n in json.loads(row.skipped).items():
            logged[reason] = logged.get(reason, 0) + n
    assert {"null_event_id", "late_sent", "app_filtered", "duplicate", "null_cursor", "quarantined", "null_derived_tstamp"} <= set(logged)


def test_an_event_id_seen_twice_keeps_its_first_copy_within_a_load_and_across_loads(scenario):
    _, tables = scenario
    names = {r.event_id: r.event_name for r in tables["filtered_events"].collect()}
    assert names["twice"] == "first_copy" and names["clean-0"] == "page_view"


def test_a_bot_session_lasting_months_is_capped_quarantined_and_its_later_events_dropped(scenario):
    reports, tables = scenario
    [bot] = tables["sessions_lifecycle_manifest"].where("session_identifier = 'bot'").collect()
    assert bot.end_tstamp - bot.start_tstamp == timedelta(days=SETTINGS.max_session_days)
    assert [r.session_identifier for r in tables["quarantined_sessions"].collect()] == ["bot"]
    assert _summed(reports[3:], "sessions_lifecycle_manifest", "dropped_quarantined_session") == 1


def test_an_export_without_optional_columns_and_a_column_gained_later_are_processed(scenario):
    _, tables = scenario
    columns = tables["filtered_events"].columns
    assert "page_url" in columns, "optional columns are there, null"
    assert tables["filtered_events"].where("page_url IS NOT NULL").count() == 0
    [gained] = tables["filtered_events"].where("event_id = 'gained'").collect()
    assert gained.experiment == "b", "a column the source gains reaches filtered_events"
    assert tables["filtered_events"].where("experiment IS NULL").count() == 7, "null in the rows stored before"


def test_an_empty_load_is_a_successful_run_that_changes_nothing(scenario):
    reports, _ = scenario
    assert reports[2] and all(s.success and not s.value("filtered_events", "rows_inserted", 0) for s in reports[2])


def test_a_future_event_date_is_stored_under_its_day_which_waits_for_its_partition(scenario):
    _, tables = scenario
    [future] = tables["filtered_events"].where("event_id = 'future'").collect()
    assert future.event_date > utcnow().date()


# -- the source table itself: refused before the run writes anything ----------------------------


def test_contract_problems_name_each_missing_or_mistyped_column():
    fields = {name: pa.string() for name in REQUIRED_COLUMNS}
    fields.update({name: pa.timestamp("us", "UTC") for name in REQUIRED_COLUMNS if name.endswith("tstamp")})
    good = pa.schema(fields)
    assert contract_problems(good, IncrementalSettings()) == []
    bad = pa.schema({**fields, "collector_tstamp": pa.string()}).remove(good.get_field_index("domain_userid"))
    settings = IncrementalSettings(session_identifiers=["domain_sessionid", "sid"])
    assert contract_problems(bad, settings) == [
        "column collector_tstamp is string, not timestamp",
        "required column domain_userid is missing",
        "column 'sid' (named in the settings) is missing",
    ]


def test_the_load_day_column_must_be_a_date_and_there_when_configured():
    fields = {name: pa.timestamp("us", "UTC") if name.endswith("tstamp") else pa.string() for name in REQUIRED_COLUMNS}
    assert contract_problems(pa.schema(fields), IncrementalSettings()) == [], "without load_date: read whole"
    as_text = pa.schema({**fields, "load_date": pa.string()})
    assert contract_problems(as_text, IncrementalSettings()) == ["column load_date (source_load_date_column) is string, not a date"]
    lake = IncrementalSettings(source_load_date_column="date_load_tstamp")
    assert contract_problems(pa.schema(fields), lake) == ["column 'date_load_tstamp' (source_load_date_column) is missing"]


def _valid_source(spark, uri):
    write_events(spark, spark.createDataFrame(as_arrow(loads()[0][:3])), uri)


def _mislabelled_source(spark, uri):
    """Load days a day after the loads' own: a column holding another date than load_tstamp's."""
    rows = as_arrow(loads()[0][:3])
    shifted = pa.array([day + timedelta(days=1) for day in rows["load_date"].to_pylist()], pa.date32())
    write_events(spark, spark.createDataFrame(rows.set_column(rows.schema.get_field_index("load_date"), "load_date", shifted)), uri)


def _corrupted_source(spark, uri):
    """A valid table whose only commit was cut off mid-write."""
    _valid_source(spark, uri)
    (Path(uri) / "_delta_log" / "00000000000000000000.json").write_text('{"protocol": {"minReaderVersion"')


@pytest.mark.parametrize(
    "make_source, settings, message",
    [
        (lambda spark, uri: None, {}, "No source events table at"),
        (_corrupted_source, {}, "cannot be read"),
        (lambda spark, uri: spark.createDataFrame([("e1", "2024-01-01 10:00:00")], "event_id string, collector_tstamp string")
         .write.format("delta").save(uri), {}, "collector_tstamp is string, not timestamp"),
        (_valid_source, {"session_identifier_sql": "concat(domain_sessionid, no_such_column)"}, "session_identifier_sql"),
        (_valid_source, {"user_identifier_sql": "domain_userid; DROP TABLE events"}, "user_identifier_sql"),
        (_valid_source, {"source_load_date_column": "date_load_tstamp"}, "'date_load_tstamp' (source_load_date_column) is missing"),
        (_mislabelled_source, {}, "load_date (source_load_date_column) does not hold the UTC date of load_tstamp in"),
    ],
    ids=[
        "missing", "corrupted", "wrong types", "unknown column in identifier sql", "injection-shaped identifier sql",
        "configured load day column missing", "load day column not the date of load_tstamp",
    ],
)
def test_a_source_that_cannot_be_processed_fails_the_run_before_it_writes_anything(
    spark, warehouse, tmp_path, monkeypatch, make_source, settings, message
):
    uri = str(tmp_path / "export")
    make_source(spark, uri)
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", uri)
    summary = run_incremental(IncrementalSettings(**settings), instance=DagsterInstance.ephemeral())
    assert not summary.success and message in summary.error
    assert os.listdir(warehouse) == [], "no run record, no lease, no table"
