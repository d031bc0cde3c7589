"""Quiet hours and a stream that ended long ago: runs over them succeed, say so, and move on.

One shared scenario runs the pipeline the way a user with a real export would: events from an
older loader (null load_tstamp) read with the collector_tstamp cursor, a stream whose last event
is ten months old, caught up with `--until-caught-up`, then run again and again with nothing new.
"""

import logging
import os
from datetime import timedelta

import pytest
from dagster import DagsterInstance

from incremental_assets.cli.runner import run_incremental, run_until_caught_up
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow

STREAM_START = (utcnow() - timedelta(days=300)).replace(hour=0, minute=0, second=0, microsecond=0)
LOAD_TSTAMP = SAMPLE_SCHEMA.fieldNames().index("load_tstamp")


def export_rows() -> list[tuple]:
    """Two days of page views by four users, two sessions a day each; every other event comes
    from an older loader that wrote no load_tstamp (and so no load_date)."""
    rows = []
    for day in range(2):
        for user in range(4):
            for session in range(2):
                start = STREAM_START + timedelta(days=day, hours=8 + 6 * session, minutes=user)
                for hit in range(3):
                    collector = start + timedelta(minutes=hit)
                    loaded = collector + timedelta(minutes=2)
                    values = {
                        "event_id": f"e-{day}-{user}-{session}-{hit}", "app_id": "website", "event_name": "page_view",
                        "collector_tstamp": collector, "dvce_created_tstamp": collector - timedelta(seconds=2),
                        "dvce_sent_tstamp": collector - timedelta(seconds=1), "derived_tstamp": collector,
                        "load_tstamp": loaded, "domain_sessionid": f"s-{day}-{user}-{session}",
                        "domain_userid": f"u-{user}", "page_url": f"/page/{hit}",
                    }
                    old_loader = hit % 2 == 1
                    row = [values.get(name) for name in SAMPLE_SCHEMA.fieldNames()] + [loaded.date()]
                    if old_loader:
                        row[LOAD_TSTAMP] = row[-1] = None
                    rows.append(tuple(row))
    return rows


EXPORT = export_rows()
SETTINGS = IncrementalSettings(start_date=STREAM_START.date().isoformat(), session_timestamp="collector_tstamp")


@pytest.fixture(scope="module")
def quiet_stream(spark, tmp_path_factory):
    """The whole scenario, run once: catch-up, then three runs with nothing new."""
    root = tmp_path_factory.mktemp("quiet")
    saved = {name: os.environ.get(name) for name in ("INCREMENTAL_ASSETS_WAREHOUSE", "INCREMENTAL_ASSETS_SOURCE")}
    os.environ["INCREMENTAL_ASSETS_WAREHOUSE"] = str(root / "warehouse")
    os.environ["INCREMENTAL_ASSETS_SOURCE"] = str(root / "export")
    write_events(spark, events_frame(spark, EXPORT), str(root / "export"), "append")
    instance = DagsterInstance.ephemeral()
    catch_up = run_until_caught_up(SETTINGS, report=lambda line: None, instance=instance)
    positions = [StateStore().entries()["filtered_events"].position]
    quiet = []
    for _ in range(3):
        quiet.append(run_incremental(SETTINGS, instance=instance))
        positions.append(StateStore().entries()["filtered_events"].position)
    stored = {r.event_id for r in read_table(spark, f"{root}/warehouse/filtered_events").collect()}
    assert read_table(spark, f"{root}/warehouse/events_this_run").count() == 0, "scratch holds this run only"
    yield catch_up, quiet, positions, stored, instance
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def test_events_with_null_load_tstamp_are_processed_with_the_collector_cursor(quiet_stream):
    *_, stored, _ = quiet_stream
    assert sum(1 for row in EXPORT if row[LOAD_TSTAMP] is None) == len(EXPORT) // 3
    assert stored == {row[0] for row in EXPORT}


def test_catch_up_on_a_stream_that_ended_months_ago_stops_once_every_event_was_in_a_window(quiet_stream):
    catch_up, *_ = quiet_stream
    assert len(catch_up) <= 3 and all(s.success for s in catch_up)
    assert catch_up[-1].caught_up


def test_quiet_hours_are_successful_runs_that_say_so_and_move_the_manifest(quiet_stream):
    _, quiet, positions, *_ = quiet_stream
    assert [s.success for s in quiet] == [True, True, True]
    for summary in quiet:
        assert summary.value("filtered_events", "rows_inserted", 0) == 0
        assert "no new events" in summary.describe()
    assert positions == sorted(positions) and positions[-1] > positions[0], "each empty window moves it on"


def test_runs_that_did_their_work_log_no_warning(quiet_stream):
    """A catch-up that inserted every event and quiet hours that moved the manifest on are healthy
    runs: nothing in their logs asks a person to act (the UI showed a yellow WARNING on each)."""
    catch_up, quiet, *_, instance = quiet_stream
    warned = [(run.run_id, entry.user_message) for run in (*catch_up, *quiet) for daily in (run, *run.daily_runs)
              for entry in instance.all_logs(daily.run_id) if entry.level >= logging.WARNING]
    assert warned == []


def test_a_first_run_over_an_empty_window_succeeds_and_moves_on_to_the_first_event(spark, warehouse, monkeypatch, tmp_path):
    source = str(tmp_path / "export")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    write_events(spark, events_frame(spark, EXPORT), source, "append")
    early = IncrementalSettings(
        start_date=(STREAM_START - timedelta(days=60)).date().isoformat(), session_timestamp="collector_tstamp",
        backfill_limit_days=10,
    )
    summary = run_incremental(early, instance=DagsterInstance.ephemeral())
    assert summary.success and summary.value("events_this_run", "events_found") == 0
    first_event = min(row[SAMPLE_SCHEMA.fieldNames().index("collector_tstamp")] for row in EXPORT)
    assert StateStore().entries()["filtered_events"].position == first_event
    for table in ("sessions_lifecycle_manifest", "quarantined_sessions", "events_this_run"):
        assert read_table(spark, f"{warehouse}/{table}").count() == 0


