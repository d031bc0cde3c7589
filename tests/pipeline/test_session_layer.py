"""A hand-written event set through six incremental runs; every expectation is worked out by hand.

Settings: start_date 2021-01-01, backfill_limit_days 1, lookback_window_hours 6, max_session_days
3, days_late_allowed 3, cursor load_tstamp; now pinned to 2021-01-10. Each event's collector and
derived timestamps are one minute before its load, its device was created one second before that.

    run  state       window [lower, upper]                 new in window             position after
    1    first_run   01-01 00:00 .. 01-02 00:00            a0 a1 a2 a2' b1 (n1 l1)   ls 01-01 12:00
    2    standard    01-01 06:00 .. 01-02 12:00            a3 b2 c1                  ls 01-02 12:00
    3    standard    01-02 06:00 .. 01-03 12:00            a4 b3 c2 (c0 too old)     ls 01-03 12:00
    4    standard    01-03 06:00 .. 01-04 12:00            nothing new: jump to b4   lu 01-04 13:00
    5    standard    01-04 07:00 .. 01-05 13:00            b4 (beyond S2's cap)      lu 01-05 13:00
    6    standard    01-05 07:00 .. 01-06 13:00            b5 (S2 quarantined)       lu 01-06 13:00
"""

from datetime import date, datetime, timedelta

import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets.definitions import build_definitions
from incremental_assets.lib.catalog import INCREMENTAL_JOB
from incremental_assets.lib.delta.read import inserted_rows, read_table
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA
from incremental_assets.lib.source.loader import write_events

SETTINGS = dict(start_date="2021-01-01", backfill_limit_days=1, lookback_window_hours=6)
NOW = "2021-01-10T00:00:00"


def t(text: str) -> datetime:
    return datetime.fromisoformat(f"2021-{text}")


def event(event_id, session, user, load, page="/", created=None, derived=None, sent=None):
    collector = t(load) - timedelta(minutes=1)
    row = {
        "event_id": event_id, "app_id": "website", "event_name": "page_view",
        "collector_tstamp": collector, "dvce_created_tstamp": created or collector - timedelta(seconds=1),
        "dvce_sent_tstamp": sent or collector, "derived_tstamp": derived or collector, "load_tstamp": t(load),
        "domain_sessionid": session, "domain_userid": user, "page_url": page,
    }
    return tuple(row.get(f.name) for f in SAMPLE_SCHEMA.fields) + (t(load).date(),)


FIRST_LOADS = [
    event("a0", "S1", "U1", "01-01 10:05", created=t("01-01 10:04") - timedelta(hours=11),
          derived=datetime(2020, 12, 31, 23, 4)),  # happened before start_date
    event("a1", "S1", "U1", "01-01 10:00"),
    event("a2", "S1", "U1", "01-01 10:10", page="/first"),
    event("a2", "S1", "U1", "01-01 10:20", page="/dup"),  # duplicate: the earliest wins
    event("b1", "S2", "B", "01-01 12:00"),
    event(None, "S1", "U1", "01-01 11:00"),  # null event_id: counted, never processed
    event("l1", "S1", "U1", "01-01 09:00", created=datetime(2020, 12, 25)),  # sent 7 days late
    event("a3", "S1", "U1-other", "01-02 09:00"),  # another user: the first one sticks
    event("b2", "S2", "B", "01-02 12:00"),  # exactly on run 2's upper limit
    event("c1", "S5", "U5", "01-02 05:00"),
    event("a4", "S1", "U1", "01-03 11:00"),
    event("b3", "S2", "B", "01-03 12:00"),
    event("c2", "S5", "U5", "01-03 10:00"),
    event("b4", "S2", "B", "01-04 13:00"),  # beyond S2's cap (01-04 12:00)
]


def without_load_tstamp(row):
    """The row with a null cursor (load_tstamp) and so no load_date either."""
    values = list(row)
    values[SAMPLE_SCHEMA.fieldNames().index("load_tstamp")] = values[-1] = None
    return tuple(values)


NULL_CURSOR = without_load_tstamp(event("z1", "S1", "U1", "01-01 10:30"))
LATE_COMMITTED = [event("c0", "S5", "U5", "01-02 03:00")]  # lands after run 2, older than S5's start
AFTER_QUARANTINE = [event("b5", "S2", "B", "01-05 15:00")]


@pytest.fixture
def pipeline(spark, warehouse, monkeypatch, tmp_path):
    source = str(tmp_path / "source_events")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    defs = build_definitions(IncrementalSettings(**SETTINGS))
    instance = DagsterInstance.ephemeral()

    def run(**limits_config):
        result = defs.resolve_job_def(INCREMENTAL_JOB).execute_in_process(
            instance=instance, run_config={"ops": {"new_event_limits": {"config": {"now": NOW, **limits_config}}}}
        )
        assert result.success
        return {
            e.asset_key.path[-1]: {k: v.value for k, v in e.materialization.metadata.items()}
            for e in result.get_asset_materialization_events()
        }

    def load(rows):
        write_events(spark, events_frame(spark, rows), source, "append")

    def table(name, *columns):
        return sorted(tuple(r) for r in read_table(spark, f"{warehouse}/{name}").select(*columns).collect())

    def state():
        return {m: (ls, lu) for m, ls, lu in table("incremental_manifest", "model", "last_success", "last_upper")}

    load(FIRST_LOADS + [NULL_CURSOR])
    def snapshot():
        names = ("filtered_events", "sessions", "sessions_lifecycle_manifest", "quarantined_sessions")
        return {name: sorted(map(tuple, read_table(spark, f"{warehouse}/{name}").collect())) for name in names}

    return run, load, table, state, snapshot


def both(last_success, last_upper=None):
    return {"filtered_events": (last_success, last_upper), "sessions": (last_success, last_upper)}


def test_six_runs_over_hand_written_events(pipeline, spark, warehouse):
    run, load, table, state, snapshot = pipeline

    first = run()
    limits = first["new_event_limits"]
    assert (limits["run_state"], limits["lower_limit"], limits["upper_limit"]) == (
        "first_run", "2021-01-01 00:00:00", "2021-01-02 00:00:00")
    assert state() == both(t("01-01 12:00"))
    lifecycle = first["sessions_lifecycle_manifest"]
    assert (lifecycle["dropped_null_event_id"], lifecycle["dropped_late_sent"]) == (1, 1)
    assert lifecycle["null_cursor_rows"] == 1
    assert table("sessions_lifecycle_manifest", "session_identifier", "user_identifier", "start_tstamp", "end_tstamp") == [
        ("S1", "U1", t("01-01 10:00"), t("01-01 10:20")),
        ("S2", "B", t("01-01 12:00"), t("01-01 12:00")),
    ]
    assert first["events_this_run"]["events_found"] == 4  # a0 a1 a2 b1
    assert first["events_this_run"]["duplicates_dropped"] == 1  # the later copy of a2
    assert first["filtered_events"]["rows_inserted"] == 3  # a0 is before start_date
    assert first["filtered_events"]["before_start_date_dropped"] == 1
    assert table("filtered_events", "event_id", "page_url") == [("a1", "/"), ("a2", "/first"), ("b1", "/")]

    second = run()
    assert (second["new_event_limits"]["lower_limit"], second["new_event_limits"]["upper_limit"]) == (
        "2021-01-01 06:00:00", "2021-01-02 12:00:00")
    assert second["new_event_limits"]["run_state"] == "standard"
    assert state() == both(t("01-02 12:00"))
    assert (second["filtered_events"]["rows_inserted"], second["filtered_events"]["events_offered"]) == (3, 6)
    new_rows = inserted_rows(spark, f"{warehouse}/filtered_events", second["filtered_events"]["delta_version"])
    assert sorted(r.event_id for r in new_rows.collect()) == ["a3", "b2", "c1"]

    load(LATE_COMMITTED)
    third = run()
    assert state() == both(t("01-03 12:00"))
    assert table("sessions_lifecycle_manifest", "session_identifier", "user_identifier", "start_tstamp", "end_tstamp") == [
        ("S1", "U1", t("01-01 10:00"), t("01-03 11:00")),
        ("S2", "B", t("01-01 12:00"), t("01-03 12:00")),
        ("S5", "U5", t("01-02 05:00"), t("01-03 10:00")),
    ]
    assert third["events_this_run"]["events_found"] == 10  # S1 a0-a4, S2 b1-b3, S5 c1 c2 (not c0)
    # sessions, by start day (S1 starts with a0, derived 2020-12-31): the upsert reads from the
    # batch's first day (a0's) minus upsert_lookback_days (30) on.
    assert third["sessions"]["merge_target_floor"] == "2020-12-01"
    assert DeltaTable(f"{warehouse}/sessions").metadata().partition_columns == ["start_date"]
    assert table("sessions", "session_identifier", "start_date", "events") == [
        ("S1", date(2020, 12, 31), 5), ("S2", date(2021, 1, 1), 3), ("S5", date(2021, 1, 2), 2),
    ]

    fourth = run()  # nothing after 01-03 12:00 until b4: the gap costs this one run
    assert (fourth["new_event_limits"]["lower_limit"], fourth["new_event_limits"]["upper_limit"]) == (
        "2021-01-03 06:00:00", "2021-01-04 12:00:00")
    assert state() == both(t("01-03 12:00"), t("01-04 13:00"))
    assert table("quarantined_sessions", "session_identifier") == []

    fifth = run()
    assert (fifth["new_event_limits"]["lower_limit"], fifth["new_event_limits"]["upper_limit"]) == (
        "2021-01-04 07:00:00", "2021-01-05 13:00:00")
    assert table("quarantined_sessions", "session_identifier") == [("S2",)]
    assert fifth["quarantined_sessions"]["rows_inserted"] == 1
    assert ("S2", t("01-01 12:00"), t("01-04 12:00")) in table(
        "sessions_lifecycle_manifest", "session_identifier", "start_tstamp", "end_tstamp")
    assert fifth["events_this_run"]["events_found"] == 3  # b1 b2 b3; b4 is beyond the cap
    assert state() == both(t("01-03 12:00"), t("01-05 13:00"))

    load(AFTER_QUARANTINE)
    sixth = run()
    assert sixth["sessions_lifecycle_manifest"]["dropped_quarantined_session"] == 1
    assert sixth["events_this_run"]["events_found"] == 0
    assert state() == both(t("01-03 12:00"), t("01-06 13:00"))

    assert table("filtered_events", "event_id", "user_identifier") == [
        ("a1", "U1"), ("a2", "U1"), ("a3", "U1"), ("a4", "U1"),
        ("b1", "B"), ("b2", "B"), ("b3", "B"), ("c1", "U5"), ("c2", "U5"),
    ]
    assert table("sessions", "session_identifier", "user_identifier", "events", "page_views") == [
        ("S1", "U1", 5, 5), ("S2", "B", 3, 3), ("S5", "U5", 2, 2),
    ]

    # Re-running run 3's window (a keyhole backfill) changes no table and does not move the manifest.
    before, positions = snapshot(), state()
    keyhole = run(lower="2021-01-02T06:00:00", upper="2021-01-03T12:00:00")
    assert keyhole["new_event_limits"]["run_state"] == "keyhole"
    assert keyhole["events_this_run"]["events_found"] == 10
    assert keyhole["filtered_events"]["rows_inserted"] == 0
    assert (snapshot(), state()) == (before, positions)

    # A load back-dated behind the manifest (its load_tstamp before last_upper): the cursor has
    # passed it, so no incremental run sees it; a keyhole backfill over its load window does.
    load([event("d1", "S9", "U9", "01-03 09:00")])
    assert run()["events_this_run"]["events_found"] == 0
    assert ("d1",) not in table("filtered_events", "event_id")
    recovered = run(lower="2021-01-03T06:00:00", upper="2021-01-03T12:00:00")
    assert recovered["filtered_events"]["rows_inserted"] == 1
    assert ("S9", "U9", 1) in table("sessions", "session_identifier", "user_identifier", "events")
