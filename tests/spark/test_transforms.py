"""The session and daily transforms on a handful of hand-made rows, each expectation worked out by
hand beside it, and a transform's Arrow path against Spark's on generated rows. All times are UTC in
January 2021: t("02 10:00") is 2021-01-02 10:00."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta

import pytest
from pyspark.sql import Observation, Row
from pyspark.sql import functions as F

from incremental_assets.lib.attributes import parse_attributes
from incremental_assets.lib.delta.spec import DELETED
from incremental_assets.lib.incremental.batch import Found, RunBatch
from incremental_assets.lib.incremental.days import DayArrivals
from incremental_assets.lib.incremental.limits import RunLimits, RunState
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA
from incremental_assets.lib.transforms import sessions as T
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms.daily import (
    as_of_day_before,
    attribute_changes,
    attributes_from_daily,
    current_attributes,
    daily_partials,
    day_arrivals,
    first_partial_day,
    history_changes,
)
from incremental_assets.lib.utc import aware_row

LIFECYCLE = "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp"


def t(text: str) -> datetime:
    return datetime.fromisoformat(f"2021-01-{text}")


def event(event_id, loaded, **columns) -> tuple:
    """A source row of session S1, user U1, loaded at t(loaded), collected and sent a minute
    before, created a second before that. `columns` override any column; load_date follows
    load_tstamp, as the loader derives it."""
    collected = t(loaded) - timedelta(minutes=1)
    row = {
        "event_id": event_id, "app_id": "web", "event_name": "page_view",
        "collector_tstamp": collected, "dvce_created_tstamp": collected - timedelta(seconds=1),
        "dvce_sent_tstamp": collected, "derived_tstamp": collected, "load_tstamp": t(loaded),
        "domain_sessionid": "S1", "domain_userid": "U1", **columns,
    }
    load = row["load_tstamp"]
    return (*[row.get(c) for c in SAMPLE_SCHEMA.fieldNames()], load.date() if load else None)


def frame(spark, schema: str, rows: list[tuple]):
    """A DataFrame of hand-made rows, naive (UTC) datetimes marked UTC for PySpark."""
    return spark.createDataFrame([aware_row(row) for row in rows], schema)


def ids(df) -> set:
    return {r.event_id for r in df.select("event_id").collect()}


LOAD_CURSOR = IncrementalSettings(start_date="2021-01-01")
COLLECTOR_CURSOR = IncrementalSettings(start_date="2021-01-01", session_timestamp="collector_tstamp")


# in_cursor_range: which source rows a window [L, U] holds


def test_cursor_range_bounds_are_inclusive(spark):
    # Window [02 00:00, 03 00:00] on load_tstamp: loads exactly on either bound are in.
    source = events_frame(spark, [
        event("before", "01 23:59:59"), event("on_lower", "02 00:00"),
        event("on_upper", "03 00:00"), event("after", "03 00:00:01"),
    ])
    assert ids(T.in_cursor_range(source, LOAD_CURSOR, t("02 00:00"), t("03 00:00"))) == {"on_lower", "on_upper"}


def test_events_with_null_load_tstamp_are_kept_with_the_collector_cursor(spark):
    # An older loader left load_tstamp, so load_date, null; its collector_tstamp (02 09:59) is in
    # the window, so pruning on load_date must not drop it.
    source = events_frame(spark, [event("loaded", "02 09:00"), event("old_loader", "02 10:00", load_tstamp=None)])
    assert ids(T.in_cursor_range(source, COLLECTOR_CURSOR, t("02 00:00"), t("03 00:00"))) == {"loaded", "old_loader"}


def test_the_window_scan_also_holds_the_null_cursor_rows_of_its_load_days(spark):
    # Window [02 00:00, 03 00:00] on collector_tstamp. A row without collector_tstamp can never be
    # in a window: it is counted (once, in the window's own scan) if loaded within the window's days
    # (02 and 03) or without a load day, and classified NULL_CURSOR, never eligible.
    source = events_frame(spark, [
        event("in_window", "02 09:00"),
        event("null_loaded_03", "03 09:00", collector_tstamp=None),
        event("null_no_load_day", "02 09:00", collector_tstamp=None, load_tstamp=None),
        event("null_loaded_05", "05 09:00", collector_tstamp=None),
        event("later", "05 09:00"),
    ])
    scanned = T.window_and_null_cursor_rows(source, COLLECTOR_CURSOR, t("02 00:00"), t("03 00:00"))
    assert ids(scanned) == {"in_window", "null_loaded_03", "null_no_load_day"}
    classified = T.classify_window(scanned, frame(spark, "session_identifier string", []), COLLECTOR_CURSOR)
    assert {r.event_id: r.drop_reason for r in classified.collect()} == {
        "in_window": None, "null_loaded_03": T.NULL_CURSOR, "null_no_load_day": T.NULL_CURSOR,
    }


def test_a_source_with_another_load_day_column_is_read_by_the_one_configured(spark):
    # Snowplow's Lake Loader names the load day date_load_tstamp. Window [02 00:00, 03 00:00] on
    # load_tstamp. "mislabelled" was loaded in the window but its load day says the 5th: pruning
    # reads the configured column, so it is not read (which is why require_processable refuses a
    # source whose load days disagree with load_tstamp). Without the setting the source, lacking
    # load_date, is read whole.
    source = events_frame(spark, [event("in_window", "02 10:00"), event("mislabelled", "02 11:00")])
    source = source.withColumn("load_date", F.when(F.col("event_id") == "mislabelled", F.lit(date(2021, 1, 5))).otherwise(F.col("load_date")))
    lake = source.withColumnRenamed("load_date", "date_load_tstamp")
    configured = IncrementalSettings(start_date="2021-01-01", source_load_date_column="date_load_tstamp")
    assert ids(T.in_cursor_range(lake, configured, t("02 00:00"), t("03 00:00"))) == {"in_window"}
    assert ids(T.in_cursor_range(lake, LOAD_CURSOR, t("02 00:00"), t("03 00:00"))) == {"in_window", "mislabelled"}


# next_event_after: where the run after an empty window [.., U] resumes

UPPER, NOW = t("03 00:00"), t("09 00:00")


def test_the_next_run_resumes_at_the_first_event_after_upper(spark):
    # The event on U was in the window; of the two after it, 05 10:00 comes first.
    source = events_frame(spark, [event("on_upper", "03 00:00"), event("later", "07 10:00"), event("next", "05 10:00")])
    assert T.next_event_after(source, LOAD_CURSOR, UPPER, NOW) == t("05 10:00")


def test_no_event_after_upper_means_caught_up(spark):
    source = events_frame(spark, [event("old", "02 10:00"), event("on_upper", "03 00:00")])
    assert T.next_event_after(source, LOAD_CURSOR, UPPER, NOW) is None


def test_an_event_in_the_future_is_not_a_place_to_resume_to(spark):
    # Stamped a second after now: a bad clock, not a gap to jump over.
    source = events_frame(spark, [event("future", "09 00:00:01")])
    assert T.next_event_after(source, LOAD_CURSOR, UPPER, NOW) is None


def test_the_next_event_is_found_among_rows_with_null_load_tstamp(spark):
    # Collector cursor; the only later event has no load_date (collected 05 09:59).
    source = events_frame(spark, [event("old_loader", "05 10:00", load_tstamp=None)])
    assert T.next_event_after(source, COLLECTOR_CURSOR, UPPER, NOW) == t("05 09:59")


# classify_window: why an event of the window is not eligible


def test_classify_window_names_each_drop_reason(spark):
    settings = IncrementalSettings(start_date="2021-01-01", app_ids=["web"], days_late_allowed=3)
    source = events_frame(spark, [
        event("kept", "02 10:00"),
        event(None, "02 10:00"),
        event("no_session", "02 10:00", domain_sessionid=None),
        event("other_app", "02 10:00", app_id="mobile"),
        event("no_app", "02 10:00", app_id=None),
        event("no_sent_time", "02 10:00", dvce_sent_tstamp=None),
        # Both sent at 05 09:59 (collected then); created 3 days before is in time, a second more is late.
        event("sent_in_time", "05 10:00", dvce_created_tstamp=t("02 09:59")),
        event("sent_late", "05 10:00", dvce_created_tstamp=t("02 09:58:59")),
        event("bot", "02 10:00", domain_sessionid="Q"),
    ])
    quarantined = frame(spark, "session_identifier string, quarantined_at timestamp", [("Q", t("01 00:00"))])
    reasons = {r.event_id: r.drop_reason for r in T.classify_window(source, quarantined, settings).collect()}
    assert reasons == {
        "kept": None, None: "null_event_id", "no_session": "null_session_id", "other_app": "app_filtered",
        "no_app": "app_filtered", "no_sent_time": "null_dvce_tstamps", "sent_late": "late_sent",
        "sent_in_time": None, "bot": "quarantined_session",
    }


def test_the_rows_of_an_erased_user_are_dropped_by_the_hash_of_their_user_id(spark):
    """The tombstone (lib/upkeep/erasure.py): Spark's hash of a user id is the erasure log's, for
    any string; the user's rows are dropped whatever their session, another user's are kept."""
    from incremental_assets.lib.upkeep.erasure import hashed, key_hash

    settings = IncrementalSettings(start_date="2021-01-01")
    erased_user = "Zoë-名前"
    source = events_frame(spark, [
        event("theirs", "02 10:00", domain_userid=erased_user),
        event("theirs_too", "02 11:00", domain_userid=erased_user, domain_sessionid="S2"),
        event("someone_else", "02 10:00", domain_userid="U2"),
    ])
    erased = hashed(T.USER, "salt").isin([key_hash("salt", erased_user)])
    reasons = {r.event_id: r.drop_reason for r in T.classify_window(source, None, settings, erased).collect()}
    assert reasons == {"theirs": "erased_user", "theirs_too": "erased_user", "someone_else": None}


def test_the_rows_of_an_erased_attribute_key_are_dropped_from_any_device(spark, warehouse, tmp_path):
    """With attributes per user_id (the user identifier stays domain_userid), the tombstones of a
    request hold the person's user identifiers and attribute keys: a device of theirs first seen
    after the erasure is dropped by its user_id; a row without one is not."""
    from incremental_assets.lib.state.store import StateStore
    from incremental_assets.lib.upkeep.erasure import key_hash, salt, tombstones

    settings = IncrementalSettings(start_date="2021-01-01", attribute_key="user_id", erasure_salt_file=str(tmp_path / "salt"))
    secret, state = salt(settings), StateStore()
    assert tombstones(settings, state, ["user_id"]) is None  # nobody erased yet
    state.open_erasure("erasure-1", "user_id", [key_hash(secret, "zoe")], [key_hash(secret, "D1")], [key_hash(secret, "zoe")], "test")
    source = events_frame(spark, [
        event("theirs", "02 10:00", domain_userid="D1", user_id="zoe"),
        event("their_new_device", "02 11:00", domain_userid="D9", domain_sessionid="S9", user_id="zoe"),
        event("someone_else", "02 10:00", domain_userid="U2", user_id="ann"),
        event("anonymous", "02 10:00", domain_userid="U3"),
    ])
    erased = tombstones(settings, state, source.columns)
    reasons = {r.event_id: r.drop_reason for r in T.classify_window(source, None, settings, erased).collect()}
    assert reasons == {"theirs": "erased_user", "their_new_device": "erased_user", "someone_else": None, "anonymous": None}


def test_missing_device_timestamps_fall_back_to_the_collector_when_allowed(spark):
    # sent := collector 02 09:59 <= created := collector + 3 days: in time.
    settings = IncrementalSettings(start_date="2021-01-01", allow_null_dvce_tstamps=True)
    source = events_frame(spark, [event("no_device_times", "02 10:00", dvce_created_tstamp=None, dvce_sent_tstamp=None)])
    [row] = T.classify_window(source, frame(spark, "session_identifier string", []), settings).collect()
    assert row.drop_reason is None


# new_session_candidates and merge_lifecycle (max_session_days 3)


def test_candidates_span_the_eligible_events_of_each_session(spark):
    # S1: eligible 10:00..12:00, greatest user U2; its late-sent 08:00 (user U3) counts for
    # nothing. S2 has no eligible event, so no candidate. S3's user is U5 where an event has one
    # (its earliest has none); S4 has no user at all.
    schema = "session_identifier string, user_identifier string, load_tstamp timestamp, drop_reason string"
    classified = frame(spark, schema, [
        ("S1", "U1", t("02 10:00"), None),
        ("S1", "U2", t("02 12:00"), None),
        ("S1", "U1", t("02 11:00"), None),
        ("S1", "U3", t("02 08:00"), "late_sent"),
        ("S2", "U4", t("02 09:00"), "app_filtered"),
        ("S3", None, t("02 09:00"), None),
        ("S3", "U5", t("02 09:30"), None),
        ("S4", None, t("02 13:00"), None),
    ])
    groups = T.window_groups(classified, "load_tstamp")
    drops = {reason: n for reason, n in groups.groupBy("drop_reason").sum("events").collect()}
    assert drops == {None: 6, "late_sent": 1, "app_filtered": 1}
    rows = sorted(tuple(r) for r in T.new_session_candidates(groups).collect())
    assert rows == [
        ("S1", "U2", t("02 10:00"), t("02 12:00")),
        ("S3", "U5", t("02 09:00"), t("02 09:30")),
        ("S4", None, t("02 13:00"), t("02 13:00")),
    ]


def test_sessions_capped_before_the_windows_sessions_are_found_from_the_first_changed_day(spark):
    # Window from 05 12:00, max_session_days 3: its sessions start from 02 12:00 on. "same_day"
    # starts on that day but before it; "recent" is one of the window's own (quarantined as such).
    schema = "session_identifier string, start_tstamp timestamp, end_tstamp timestamp, start_date date"
    lifecycle = frame(spark, schema, [
        ("old_capped", t("01 10:00"), t("04 10:00"), date(2021, 1, 1)),
        ("old_open", t("01 12:00"), t("02 12:00"), date(2021, 1, 1)),
        ("same_day", t("02 09:00"), t("05 09:00"), date(2021, 1, 2)),
        ("recent", t("02 13:00"), t("05 13:00"), date(2021, 1, 2)),
    ])
    def capped(first_day):
        rows = T.capped_before_window(lifecycle, first_day, t("05 12:00"), 3).collect()
        return {r.session_identifier for r in rows}
    assert capped(date(2021, 1, 1)) == {"old_capped", "same_day"}
    assert capped(date(2021, 1, 2)) == {"same_day"}  # the days before the first change are not read


@pytest.fixture(scope="module")
def lifecycle_merge(spark) -> list:
    """merge_lifecycle's output: one session per rule."""
    stored = frame(spark, LIFECYCLE, [
        ("sticky", "U1", t("01 10:00"), t("01 11:00")),
        ("anonymous", None, t("02 10:00"), t("02 11:00")),
        ("earlier", "U1", t("02 10:00"), t("02 12:00")),
        ("long", "U1", t("01 10:00"), t("02 10:00")),
        ("capped", "U1", t("01 10:00"), t("04 10:00")),
        ("unchanged", "U1", t("02 10:00"), t("02 12:00")),
    ])
    candidates = frame(spark, LIFECYCLE, [
        ("new", "U1", t("02 10:00"), t("02 11:00")),
        ("sticky", "U9", t("02 09:00"), t("02 10:00")),
        ("anonymous", "U5", t("02 10:00"), t("02 11:00")),
        ("earlier", "U1", t("02 08:00"), t("02 09:00")),
        ("long", "U1", t("04 09:00"), t("05 10:00")),
        ("capped", "U1", t("04 11:00"), t("04 12:00")),
        ("unchanged", "U1", t("02 11:00"), t("02 11:30")),
    ])
    return T.merge_lifecycle(candidates, stored, 3).collect()


@pytest.fixture(scope="module")
def merged(lifecycle_merge) -> dict:
    """The rows to write (not flagged at their stored cap), keyed by session."""
    return {r.session_identifier: tuple(r)[1:5] for r in lifecycle_merge if not r[T.STORED_AT_CAP]}


def test_a_new_session_is_inserted_as_found(merged):
    assert merged["new"] == ("U1", t("02 10:00"), t("02 11:00"), date(2021, 1, 2))


def test_the_first_user_of_a_session_sticks(merged):
    # Stored U1 wins over U9; start 01 10:00 (stored), end 02 10:00 (candidate).
    assert merged["sticky"] == ("U1", t("01 10:00"), t("02 10:00"), date(2021, 1, 1))


def test_a_user_found_later_fills_a_session_stored_without_one(merged):
    # Same start and end: only the user changed.
    assert merged["anonymous"] == ("U5", t("02 10:00"), t("02 11:00"), date(2021, 1, 2))


def test_the_least_start_and_the_greatest_end_are_kept(merged):
    # Candidate 08:00..09:00 extends the stored 10:00..12:00 backwards only.
    assert merged["earlier"] == ("U1", t("02 08:00"), t("02 12:00"), date(2021, 1, 2))


def test_the_end_is_capped_at_start_plus_max_session_days(merged):
    # Start 01 10:00 + 3 days = 04 10:00, before the candidate's end 05 10:00.
    assert merged["long"] == ("U1", t("01 10:00"), t("04 10:00"), date(2021, 1, 1))


def test_a_stored_session_at_its_cap_is_left_alone_and_comes_out_as_stored(merged, lifecycle_merge):
    # Not written; flagged with its stored values, so the run can still quarantine it.
    assert "capped" not in merged
    at_cap = {r.session_identifier: tuple(r)[1:5] for r in lifecycle_merge if r[T.STORED_AT_CAP]}
    assert at_cap == {"capped": ("U1", t("01 10:00"), t("04 10:00"), date(2021, 1, 1))}


def test_a_session_the_candidate_does_not_change_is_not_rewritten(merged):
    assert "unchanged" not in merged


# sessions_this_run and newly_quarantined (max_session_days 3)


def test_sessions_this_run_overlap_the_window_with_their_end_capped_at_upper(spark):
    # Window [05 00:00, 06 00:00]: start in [02 00:00, 06 00:00], end >= 05 00:00, all inclusive.
    lifecycle = frame(spark, f"{LIFECYCLE}, start_date date", [
        (session, "U1", start, end, start.date()) for session, start, end in [
            ("from_lower_minus_msd", t("02 00:00"), t("05 00:00")),
            ("ended_before", t("04 10:00"), t("04 23:59")),
            ("starts_on_upper", t("06 00:00"), t("06 00:00")),
            ("starts_after", t("06 00:01"), t("06 01:00")),
            ("runs_past_upper", t("05 10:00"), t("07 00:00")),
        ]
    ])
    active = T.sessions_this_run(lifecycle, t("05 00:00"), t("06 00:00"), 3).collect()
    assert {r.session_identifier: (r.start_tstamp, r.lifecycle_end_tstamp, r.end_tstamp) for r in active} == {
        "from_lower_minus_msd": (t("02 00:00"), t("05 00:00"), t("05 00:00")),
        "starts_on_upper": (t("06 00:00"), t("06 00:00"), t("06 00:00")),
        "runs_past_upper": (t("05 10:00"), t("07 00:00"), t("06 00:00")),
    }


def test_a_session_whose_lifecycle_end_reached_its_cap_is_quarantined(spark):
    # Both ends are capped at U (03 00:00) this run; the lifecycle end decides: "bot" reached
    # 01 10:00 + 3 days, "human" stopped a minute short.
    schema = "session_identifier string, start_tstamp timestamp, lifecycle_end_tstamp timestamp, end_tstamp timestamp"
    active = frame(spark, schema, [
        ("bot", t("01 10:00"), t("04 10:00"), t("03 00:00")),
        ("human", t("01 10:00"), t("04 09:59"), t("03 00:00")),
    ])
    rows = T.newly_quarantined(active, 3, t("03 00:05")).collect()
    assert [tuple(r) for r in rows] == [("bot", t("03 00:05"), t("04 10:00"))]  # quarantined at, and its cap


# session_events: S1 from 02 10:00 (cap 05 10:00), S2 from 04 00:00; the scan reads 02 10:00..06 00:00


@pytest.fixture(scope="module")
def session_source(spark):
    """The batch's source rows on the load_tstamp cursor, the run's sessions, their span, settings."""
    settings = IncrementalSettings(start_date="2021-01-01", session_timestamp="load_tstamp", max_session_days=3)
    sessions = frame(spark, LIFECYCLE, [
        ("S1", "U1", t("02 10:00"), t("05 10:00")),
        ("S2", "U2", t("04 00:00"), t("06 00:00")),
    ])
    source = events_frame(spark, [
        event("a1", "02 10:00", domain_userid="someone_else"),
        event("a2", "02 12:00", page_url="/second"),
        event("a2", "02 11:00", page_url="/first"),
        event("a3", "02 13:00", page_url="/created_later", dvce_created_tstamp=t("02 12:55")),
        event("a3", "02 13:00", page_url="/created_first", dvce_created_tstamp=t("02 12:50")),
        event("a5", "05 10:00"),
        event("a5", "05 10:30", page_url="/beyond_the_cap"),  # a copy, but not one of the run's events
        event("a6", "05 10:01"),
        event("b1", "05 12:00", domain_sessionid="S2", domain_userid="U2"),
        event("x1", "03 00:00", domain_sessionid="S9"),
    ])
    sessions = sessions.withColumn("lifecycle_end_tstamp", F.col("end_tstamp"))
    span = T.sessions_span(sessions, 3)
    assert (span["sessions"], span["at_cap"], span["lo"], span["hi"]) == (2, 1, t("02 10:00"), t("06 00:00"))
    return source, sessions, span, settings


@pytest.fixture(scope="module")
def session_inputs(session_source):
    """session_events' inputs: its candidates, the run's sessions, settings."""
    source, sessions, span, settings = session_source
    return T.candidate_events(source, settings, span), sessions, settings


def test_the_candidates_of_named_sessions_leave_out_the_other_sessions_rows_outside_the_window(spark, session_source, session_events):
    """Given the run's sessions, the scan keeps their rows and the window's, and drops the rest
    before classifying it: S9's x1 (03 00:00) is neither; its x2, in the window, stays (the batch
    counts every row of its window). The run's events are the same either way."""
    source, sessions, span, settings = session_source
    source = source.unionByName(events_frame(spark, [event("x2", "05 12:30", domain_sessionid="S9")]))
    window = (t("05 12:00"), t("05 13:00"))
    every = T.candidate_events(source, settings, span, window=window)
    named = T.candidate_events(source, settings, span, window=window, sessions=sessions)
    assert ids(every) - ids(named) == {"x1"}
    assert ids(named) == {"a1", "a2", "a3", "a5", "a6", "b1", "x2"}
    events = T.session_events(named, F.broadcast(sessions), settings)
    assert sorted(map(Row.asDict, events.collect()), key=str) == sorted(map(Row.asDict, session_events.collect()), key=str)


@pytest.fixture(scope="module", params=["every row ranked", "duplicated ids broadcast"])
def session_events(request, session_inputs):
    """Both ways session_batch calls it, with its sessions broadcast: a small batch ranks every
    row; a big one, with few duplicated ids, broadcasts them so only their rows are shuffled."""
    candidates, sessions, settings = session_inputs
    if request.param == "every row ranked":
        return T.session_events(candidates, F.broadcast(sessions), settings)
    return T.session_events(candidates, F.broadcast(sessions), settings, F.broadcast(T.duplicated_ids(candidates)))


def test_broadcast_sessions_reach_the_events_without_a_shuffle_of_them(spark, session_inputs):
    # Spark's own size thresholds off: only session_batch's hint can make the join a broadcast.
    # Without it the events (every wide row of the batch) are shuffled for a sort-merge join.
    candidates, sessions, settings = session_inputs
    thresholds = ("spark.sql.autoBroadcastJoinThreshold", "spark.sql.adaptive.autoBroadcastJoinThreshold")
    before = {key: spark.conf.get(key) for key in thresholds}
    for key in thresholds:
        spark.conf.set(key, "-1")
    try:
        hinted = T.session_events(candidates, F.broadcast(sessions), settings, F.broadcast(T.duplicated_ids(candidates)))
        plain = T.session_events(candidates, sessions, settings, F.broadcast(T.duplicated_ids(candidates)))
        joins = [str(df._jdf.queryExecution().executedPlan()) for df in (hinted, plain)]
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)
    assert "SortMergeJoin" not in joins[0]
    assert "SortMergeJoin" in joins[1]


@pytest.fixture(scope="module")
def run_events(session_events) -> dict:
    return {r.event_id: r for r in session_events.collect()}


def test_session_events_are_this_runs_sessions_within_their_caps(run_events):
    # a5 is exactly on S1's cap (05 10:00), a6 a minute past it; S9 is not a session of this run.
    assert set(run_events) == {"a1", "a2", "a3", "a5", "b1"}


def test_the_earliest_copy_of_a_duplicate_wins_and_copies_are_counted(run_events):
    assert (run_events["a2"].page_url, run_events["a2"][T.COPIES]) == ("/first", 2)
    assert run_events["a1"][T.COPIES] == 1


def test_a_copy_beyond_its_sessions_cap_neither_wins_nor_counts(run_events):
    assert (run_events["a5"].page_url, run_events["a5"][T.COPIES]) == (None, 1)


def test_the_dedupe_is_the_same_when_the_duplicated_ids_are_joined_by_a_shuffle(session_inputs, session_events):
    """Too many duplicated ids to broadcast: the same rows as either way the fixture takes."""
    candidates, sessions, settings = session_inputs
    shuffled = T.session_events(candidates, sessions, settings, T.duplicated_ids(candidates))
    assert sorted(map(Row.asDict, shuffled.collect()), key=str) == sorted(map(Row.asDict, session_events.collect()), key=str)


def test_an_id_flagged_by_a_hash_it_shares_with_another_is_deduplicated_alone(session_inputs, session_events):
    """duplicated_ids flags hashes: two ids sharing one (a collision) are both ranked. As if every
    hash collided, with every candidate's hash flagged: the same rows, each unique id kept once."""
    candidates, sessions, settings = session_inputs
    every_hash = candidates.select(F.xxhash64("event_id").alias(T.ID_HASH)).distinct().withColumn("_dup", F.lit(True))
    flagged = T.session_events(candidates, F.broadcast(sessions), settings, F.broadcast(every_hash))
    assert sorted(map(Row.asDict, flagged.collect()), key=str) == sorted(map(Row.asDict, session_events.collect()), key=str)


def test_a_sessions_row_counts_its_events_and_picks_its_first_app_and_pages_by_time(spark):
    # S1: first event e1 (web, page /a); e3 and e4 are page views at the same moment, so the last
    # page is the one of the greater event_id (e4: /c); e2 is not a page view. S2 starts with two
    # events at once, from mobile and ios: the least app_id (ios); it has no page view at all.
    schema = "session_identifier string, user_identifier string, app_id string, event_id string, event_name string, derived_tstamp timestamp, page_url string"
    events = frame(spark, schema, [
        ("S1", "U1", "web", "e1", "page_view", t("02 10:00"), "/a"),
        ("S1", None, "mobile", "e2", "page_ping", t("02 10:05"), "/x"),
        ("S1", "U1", "web", "e4", "page_view", t("02 10:10"), "/c"),
        ("S1", "U1", "web", "e3", "page_view", t("02 10:10"), "/b"),
        ("S2", None, "mobile", "f1", "page_ping", t("02 09:00"), None),
        ("S2", "U2", "ios", "f2", "page_ping", t("02 09:00"), None),
    ])
    rows = sorted(tuple(r) for r in T.session_rows(events).collect())
    assert rows == [
        ("S1", "U1", "web", t("02 10:00"), t("02 10:10"), 4, 3, "/a", "/c", 600, t("02 10:00").date()),
        ("S2", "U2", "ios", t("02 09:00"), t("02 09:00"), 2, 0, None, None, 0, t("02 09:00").date()),
    ]


def test_copies_loaded_together_go_to_the_one_created_first(run_events):
    assert run_events["a3"].page_url == "/created_first"


def test_the_user_of_a_session_event_comes_from_the_lifecycle(run_events):
    assert run_events["a1"][T.USER] == "U1"


def test_the_batch_is_counted_by_its_write(session_events, tmp_path):
    """a1, a2, a3, a5, b1; the last loaded is b1 (05 12:00); a2 and a3 had a second copy each.
    Without a write that ran (an earlier attempt committed it), the stored rows are counted."""
    limits = RunLimits(RunState.STANDARD, t("05 06:00"), t("06 00:00"), t("06 00:00"))
    observation = Observation()
    events = session_events.observe(observation, *T.batch_counts("load_tstamp")).drop(T.COPIES)
    batch = RunBatch(events, limits, None, observation, "load_tstamp")
    uri = str(tmp_path / "events_this_run")
    events.write.format("delta").save(uri)
    stored = lambda: events.sparkSession.read.format("delta").load(uri)  # noqa: E731
    assert batch.counted(written=True, stored=stored).found == Found(5, t("05 12:00"), 2)
    assert batch.counted(written=False, stored=stored).found == Found(5, t("05 12:00"), None)
    never_run = RunBatch(events, limits, None, Observation(), "load_tstamp")  # its metrics never come
    never_run.events.observe(never_run.found, F.count(F.lit(1)).alias("events"))
    assert never_run.counted(written=True, stored=stored, wait_seconds=0.5).found == Found(5, t("05 12:00"), None)


# daily_partials and attributes_from_daily

SPECS = parse_attributes([
    {"name": "page_views", "aggregation": "count", "event_names": ["page_view"]},
    {"name": "page_views_2d", "aggregation": "count", "event_names": ["page_view"], "period": "last 2 days"},
    {"name": "last_page", "aggregation": "last", "property": "page_url", "event_names": ["page_view"]},
    {"name": "apps", "aggregation": "count_distinct", "property": "app_id"},
])


FILTERED = [
    ("U1", "page_view", t("01 10:00"), "/a", "web"),
    ("U1", "page_view", t("01 11:00"), "/b", "mobile"),
    ("U1", "link_click", t("02 09:00"), None, "web"),
    ("U1", "page_view", t("03 08:00"), "/c", "web"),
    ("U1", "page_view", t("03 07:00"), "/d", "web"),
    ("U2", "page_view", t("01 12:00"), "/x", "web"),
]


def daily_of(spark, rows):
    schema = "user_identifier string, event_name string, derived_tstamp timestamp, page_url string, app_id string"
    filtered = frame(spark, schema, rows).withColumn("event_date", F.to_date("derived_tstamp"))
    return daily_partials(filtered, SPECS, "user_identifier")


@pytest.fixture(scope="module")
def daily(spark):
    return daily_of(spark, FILTERED)


def test_daily_partials_are_exact_per_key_and_day(daily):
    # U1 on 01-01: two page views, the last at 11:00 on /b, apps {mobile, web}; on 01-02 only a
    # click: no page view, so no last page.
    rows = {(r.attribute_key, r.event_date): tuple(r)[2:] for r in daily.collect()}
    assert rows[("U1", date(2021, 1, 1))] == (2, 2, 2, (t("01 11:00"), "/b"), ["mobile", "web"])
    assert rows[("U1", date(2021, 1, 2))] == (1, 0, 0, None, ["web"])
    assert len(rows) == 4  # U1 on three days, U2 on one


def test_attributes_combine_the_daily_partials(daily):
    # Reference day 01-03, so "last 2 days" is 01-02..01-03: U1 has 0 + 2 page views there, U2
    # none. U1's last page is /c (01-03 08:00, after /d at 07:00).
    rows = attributes_from_daily(daily, SPECS, date(2021, 1, 3)).collect()
    assert {r.attribute_key: tuple(r)[1:] for r in rows} == {"U1": (4, 2, "/c", 2), "U2": (1, 0, "/x", 1)}


def test_attributes_count_no_event_after_their_reference_day(daily):
    # Reference day 01-01: U1's page views of 01-03 are not counted yet, nor is /c its last page.
    rows = attributes_from_daily(daily, SPECS, date(2021, 1, 1)).collect()
    assert {r.attribute_key: tuple(r)[1:] for r in rows} == {"U1": (2, 2, "/b", 2), "U2": (1, 1, "/x", 1)}


def test_attribute_changes_write_the_recomputed_keys_that_differ_and_delete_the_keys_gone(spark, daily):
    # Stored as of 01-03: U1 (4, 2, /c, 2) is right; U2 holds a stale (9, 9, /old, 9); U3 is no longer
    # in daily (its events erased). Recomputing U1, U2 and U3 writes U2's (1, 0, /x, 1), deletes U3
    # and leaves U1 alone; U4, stale too but not recomputed, is left as it is.
    stored = spark.createDataFrame(
        [("U1", 4, 2, "/c", 2), ("U2", 9, 9, "/old", 9), ("U3", 1, 1, "/z", 1), ("U4", 7, 7, "/w", 7)],
        "attribute_key string, page_views long, page_views_2d long, last_page string, apps int")
    keys = spark.createDataFrame([("U1",), ("U2",), ("U3",)], "attribute_key string")
    fresh = attributes_from_daily(daily.join(keys, "attribute_key"), SPECS, date(2021, 1, 3))
    changes = attribute_changes(fresh, stored, keys).collect()
    assert {(r.attribute_key, r[DELETED]): tuple(r)[1:5] for r in changes} == {
        ("U2", False): (1, 0, "/x", 1), ("U3", True): (1, 1, "/z", 1)}
    first = attribute_changes(fresh, None, keys).collect()  # nothing stored: every key's row
    assert {r.attribute_key: tuple(r)[1:5] for r in first if not r[DELETED]} == {"U1": (4, 2, "/c", 2), "U2": (1, 0, "/x", 1)}


# attributes_history: values (page_views, page_views_2d, last_page, apps) as of the end of each day
# through 01-05, worked out by hand from FILTERED. U1: 01-01 (2, 2, /b, 2); 01-02 the same (last 2
# days 01-01..01-02: 2 + 0); 01-03 (4, 2, /c, 2); 01-04 the same; 01-05 (4, 0, /c, 2): 01-03 left
# the 2-day window. U2: 01-01 and 01-02 (1, 1, /x, 1); from 01-03 (1, 0, /x, 1).
HISTORY = {
    ("U1", date(2021, 1, 1)): (date(2021, 1, 3), 2, 2, "/b", 2),
    ("U1", date(2021, 1, 3)): (date(2021, 1, 5), 4, 2, "/c", 2),
    ("U1", date(2021, 1, 5)): (None, 4, 0, "/c", 2),
    ("U2", date(2021, 1, 1)): (date(2021, 1, 3), 1, 1, "/x", 1),
    ("U2", date(2021, 1, 3)): (None, 1, 0, "/x", 1),
}
THROUGH = date(2021, 1, 5)


def history_rows(frame_, deleted=False):
    rows = frame_.where(F.col("_deleted") == deleted).drop("_deleted").collect()
    return {(r.attribute_key, r.valid_from): tuple(r)[2:] for r in rows}


def from_days(spark, pairs):
    return spark.createDataFrame(pairs, "attribute_key string, from_day date")


@pytest.fixture(scope="module")
def history(spark, daily):
    built = history_changes(daily, None, from_days(spark, [("U1", date(2021, 1, 1)), ("U2", date(2021, 1, 1))]), SPECS, THROUGH)
    return built.where(~F.col("_deleted")).drop("_deleted").cache()


def test_history_has_a_row_per_key_and_run_of_days_with_the_same_values(history):
    assert history_rows(history.withColumn("_deleted", F.lit(False))) == HISTORY


def test_each_history_row_equals_attributes_with_its_days_as_reference_day(history, daily):
    for day in (date(2021, 1, d) for d in range(1, 6)):
        attributes = {r.attribute_key: tuple(r)[1:] for r in attributes_from_daily(daily, SPECS, day).collect()}
        valid = {key: values for (key, start), (end, *values) in HISTORY.items() if start <= day and (end is None or day < end)}
        assert {key: tuple(values) for key, values in valid.items()} == attributes


def test_current_attributes_are_the_open_intervals_of_the_keys_asked(spark, history):
    # Through 01-05, the open rows: U1 (4, 0, /c, 2), U2 (1, 0, /x, 1). Asked for U1 and U3 (no
    # history): U1's row alone, in the specs' order, without the interval's days.
    keys = spark.createDataFrame([("U1",), ("U3",)], "attribute_key string")
    current = current_attributes(history.select("attribute_key", *reversed(history.columns[1:])), keys, SPECS)
    assert current.columns == ["attribute_key", "page_views", "page_views_2d", "last_page", "apps"]
    assert [tuple(r) for r in current.collect()] == [("U1", 4, 0, "/c", 2)]


def test_current_attributes_equal_attributes_recomputed_from_every_partial_as_of_the_history_s_last_day(spark, daily, history):
    keys = spark.createDataFrame([("U1",), ("U2",)], "attribute_key string")
    current = current_attributes(history, keys, SPECS)
    recomputed = attributes_from_daily(daily, SPECS, THROUGH)
    assert current.dtypes == recomputed.dtypes
    assert sorted(map(tuple, current.collect())) == sorted(map(tuple, recomputed.collect())) == [
        ("U1", 4, 0, "/c", 2), ("U2", 1, 0, "/x", 1)]


def test_a_late_event_rewrites_its_key_from_its_day_on_and_nothing_else(spark, history):
    # A page view of U1 on 01-02 at 10:00 (/e, app tv), loaded late. U1 from 01-02: 01-02 (3, 3, /e,
    # 3); 01-03 (5, 3, /c, 3); 01-04 (5, 2, /c, 3); 01-05 (5, 0, /c, 3). Its interval from 01-01 keeps
    # its start and ends on 01-02; the rows of 01-03 and 01-05 are updated, 01-02 and 01-04 inserted.
    late = daily_of(spark, [*FILTERED, ("U1", "page_view", t("02 10:00"), "/e", "tv")])
    changes = history_changes(late, history, from_days(spark, [("U1", date(2021, 1, 2))]), SPECS, THROUGH)
    assert history_rows(changes) == {
        ("U1", date(2021, 1, 1)): (date(2021, 1, 2), 2, 2, "/b", 2),
        ("U1", date(2021, 1, 2)): (date(2021, 1, 3), 3, 3, "/e", 3),
        ("U1", date(2021, 1, 3)): (date(2021, 1, 4), 5, 3, "/c", 3),
        ("U1", date(2021, 1, 4)): (date(2021, 1, 5), 5, 2, "/c", 3),
        ("U1", date(2021, 1, 5)): (None, 5, 0, "/c", 3),
    }
    assert history_rows(changes, deleted=True) == {}


def test_events_gone_from_a_day_delete_the_rows_they_made(spark, history):
    # U1's page views of 01-03 gone (a refresh): from 01-03 U1 has (2, 0, /b, 2) for good, so its
    # row from 01-03 changes and its row from 01-05 goes.
    gone = daily_of(spark, [row for row in FILTERED if row[2].day != 3])
    changes = history_changes(gone, history, from_days(spark, [("U1", date(2021, 1, 3))]), SPECS, THROUGH)
    assert history_rows(changes) == {("U1", date(2021, 1, 3)): (None, 2, 0, "/b", 2)}
    assert set(history_rows(changes, deleted=True)) == {("U1", date(2021, 1, 5))}


def test_a_key_recomputed_without_change_yields_no_row(spark, daily, history):
    assert history_changes(daily, history, from_days(spark, [("U1", date(2021, 1, 1)), ("U2", date(2021, 1, 2))]), SPECS, THROUGH).count() == 0


# Every lifetime attribute here is carried: a recomputation from a key's from_day starts from its
# stored values of the day before, and reads no partial before from_day (a "last N days" one's, N - 1
# days before it).
CARRIED = parse_attributes([
    {"name": "page_views", "aggregation": "count", "event_names": ["page_view"]},
    {"name": "page_views_2d", "aggregation": "count", "event_names": ["page_view"], "period": "last 2 days"},
    {"name": "last_page", "aggregation": "last", "property": "page_url", "event_names": ["page_view"]},
    {"name": "first_page", "aggregation": "first", "property": "page_url", "event_names": ["page_view"]},
    {"name": "apps", "aggregation": "unique_list", "property": "app_id"},
    {"name": "last_seen", "aggregation": "max", "property": "derived_tstamp"},
])


def carried_daily(spark, rows):
    schema = "user_identifier string, event_name string, derived_tstamp timestamp, page_url string, app_id string"
    filtered = frame(spark, schema, rows).withColumn("event_date", F.to_date("derived_tstamp"))
    return daily_partials(filtered, CARRIED, "user_identifier")


def applied(history_, changes) -> dict:
    """The history's rows once `changes` are merged on (attribute_key, valid_from)."""
    rows = history_rows(history_.withColumn("_deleted", F.lit(False)))
    for key in history_rows(changes, deleted=True):
        del rows[key]
    return {**rows, **history_rows(changes)}


def test_a_late_event_carries_on_from_the_values_of_the_day_before(spark):
    # Stored for U1: from 01-01 (2, 2, /b, /a, [mobile, web], 01 11:00); from 01-02 the same but
    # last seen 02 09:00 (a click); from 01-03 (4, 2, /c, ...); from 01-05 the 2-day count 0. A late
    # page view of 01-03 09:00 (/e, app tv): from 01-03 (5, 3, /e, /a, [mobile, tv, web], 03 09:00),
    # from 01-05 (5, 0, ...). The partials of 01-01 are left out of the input: the lifetime values
    # come from the stored values of 01-02, and the 2-day count reads back to 01-02 only.
    everyone = from_days(spark, [("U1", date(2021, 1, 1)), ("U2", date(2021, 1, 1))])
    stored = history_changes(carried_daily(spark, FILTERED), None, everyone, CARRIED, THROUGH).where(~F.col("_deleted")).drop("_deleted")
    late = carried_daily(spark, [*FILTERED, ("U1", "page_view", t("03 09:00"), "/e", "tv")])
    from_01_02 = late.where(F.col("event_date") >= date(2021, 1, 2))
    changes = history_changes(from_01_02, stored, from_days(spark, [("U1", date(2021, 1, 3))]), CARRIED, THROUGH, date(2021, 1, 3))
    apps = ["mobile", "tv", "web"]
    assert history_rows(changes) == {
        ("U1", date(2021, 1, 3)): (date(2021, 1, 5), 5, 3, "/e", "/a", apps, t("03 09:00")),
        ("U1", date(2021, 1, 5)): (None, 5, 0, "/e", "/a", apps, t("03 09:00")),
    }
    assert history_rows(changes, deleted=True) == {}
    # And the history it leaves equals one built from scratch over every partial.
    rebuilt = history_changes(late, None, everyone, CARRIED, THROUGH).withColumn("_deleted", F.lit(False))
    assert applied(stored, changes) == history_rows(rebuilt)


def test_the_first_day_of_partials_a_recomputation_reads():
    # CARRIED: the longest window is 2 days, so from 01-03 on the partials of 01-02 on (what the test
    # above hands in). SPECS: a lifetime count_distinct needs every day. No earliest: every day.
    assert first_partial_day(CARRIED, date(2021, 1, 3)) == date(2021, 1, 2)
    assert first_partial_day(CARRIED[:1], date(2021, 1, 3)) == date(2021, 1, 3)  # lifetime and carried alone
    assert first_partial_day(SPECS, date(2021, 1, 3)) is None
    assert first_partial_day(CARRIED, None) is None


def test_a_lookup_gives_the_values_of_the_day_before_each_example(spark, history):
    # U1 on 01-03 at 09:00: as of the end of 01-02, (2, 2, /b, 2), not 01-03's page views. U1 on
    # 01-01: nothing before it (nulls). U2 on 01-10: its current row. U3: never seen. The same
    # example twice comes back twice.
    examples = spark.createDataFrame([
        (1, "U1", t("03 09:00")), (2, "U1", t("01 23:00")), (3, "U2", t("10 00:00")), (4, "U3", t("02 00:00")),
        (5, "U1", t("03 09:00")),
    ], "example int, user string, timestamp timestamp")
    looked = as_of_day_before(examples, history, key="user", at="timestamp")
    assert looked.columns == ["example", "user", "timestamp", "page_views", "page_views_2d", "last_page", "apps"]
    assert sorted((r.example, *tuple(r)[3:]) for r in looked.collect()) == [
        (1, 2, 2, "/b", 2), (2, None, None, None, None), (3, 1, 0, "/x", 1), (4, None, None, None, None), (5, 2, 2, "/b", 2),
    ]


@pytest.mark.parametrize("engine", ["spark", "arrow"])
def test_day_arrivals_count_rows_late_rows_latest_load_and_longest_delay(spark, engine):
    # 01-01: both late (one loaded on 01-03 after 48 h, one without a load time).
    # 01-02: one fresh, one loaded on 01-03 after 2 h: late 1, the day is still fresh.
    new_rows = frame(spark, "event_date date, derived_tstamp timestamp, load_tstamp timestamp", [
        (date(2021, 1, 1), t("01 08:00"), t("03 08:00")),
        (date(2021, 1, 1), t("01 12:00"), None),
        (date(2021, 1, 2), t("02 10:00"), t("02 10:30")),
        (date(2021, 1, 2), t("02 23:00"), t("03 01:00")),
    ])
    assert day_arrivals(new_rows if engine == "spark" else new_rows.toArrow()) == [
        DayArrivals(date(2021, 1, 1), 2, 2, t("03 08:00"), 48.0),
        DayArrivals(date(2021, 1, 2), 2, 1, t("03 01:00"), 2.0),
    ]


@pytest.mark.parametrize("seed", range(3))
def test_day_arrivals_in_arrow_are_sparks(spark, seed):
    """day_arrivals of rows in Arrow (a small insert, read from deltalake's change feed) against
    Spark's, on generated rows: loads on the event day, days after or a microsecond past midnight,
    before the event, or without a load time; events without a time; and a day whose one row was
    loaded before its time (its longest delay is negative)."""
    rng, base = random.Random(seed), datetime(2024, 3, 1)

    def row() -> tuple:
        day = base + timedelta(days=rng.randrange(4))
        derived = None if rng.random() < 0.05 else day + timedelta(microseconds=rng.randrange(86_400_000_000))
        after = rng.choice([timedelta(0), timedelta(minutes=30), timedelta(days=2, microseconds=7), timedelta(hours=-3),
                            timedelta(microseconds=rng.randrange(3 * 86_400_000_000))])
        loaded = None if rng.random() < 0.05 else (derived or day) + after
        return day.date(), derived, loaded

    new_rows = frame(spark, "event_date date, derived_tstamp timestamp, load_tstamp timestamp", [row() for _ in range(500)])
    skewed = frame(spark, "event_date date, derived_tstamp timestamp, load_tstamp timestamp",
                   [(date(2024, 3, 9), datetime(2024, 3, 9, 12), datetime(2024, 3, 9, 9))])  # loaded 3 h before its time
    new_rows = new_rows.unionByName(skewed)
    in_spark, in_arrow = day_arrivals(new_rows), day_arrivals(new_rows.toArrow())
    assert in_arrow[-1] == in_spark[-1] == DayArrivals(date(2024, 3, 9), 1, 0, datetime(2024, 3, 9, 9), -3.0)
    assert in_arrow == in_spark  # the delays to the last bit: a manifest's rows must not depend on the engine that counted
    assert len(in_spark) == 5 and all(0 < a.late_rows < a.rows for a in in_spark[:4])


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "America/Los_Angeles"])
def test_a_lookup_takes_its_day_in_utc_whatever_the_sessions_time_zone(spark, history, zone):
    # U1 at 01-03 20:00 UTC is 01-04 05:00 in Tokyo: the day before is 01-02 in UTC (2, 2, /b, 2),
    # not 01-03 (Tokyo's day before, whose values count later events). U1 at 01-04 03:00 UTC is
    # 01-03 19:00 in Los Angeles: 01-03's values (4, 2, /c, 2), not 01-02's, a day stale. A naive
    # timestamp is UTC, and a date its own day.
    examples = spark.createDataFrame([(1, "U1", t("03 20:00")), (2, "U1", t("04 03:00"))], "example int, user string, timestamp timestamp")
    naive = examples.select("example", "user", F.col("timestamp").cast("timestamp_ntz").alias("timestamp"))
    dates = examples.select("example", "user", F.to_date("timestamp").alias("timestamp"))
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        looked = [sorted((r.example, *tuple(r)[3:]) for r in as_of_day_before(frame, history, key="user", at="timestamp").collect())
                  for frame in (examples, naive)]
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert looked[0] == looked[1] == [(1, 2, 2, "/b", 2), (2, 4, 2, "/c", 2)]
    assert sorted((r.example, *tuple(r)[3:]) for r in as_of_day_before(dates, history, key="user", at="timestamp").collect()) == looked[0]


def test_current_attributes_type_a_list_as_attributes_from_daily_does_whatever_the_history_stored(spark):
    """attributes_history may store a list's elements as nullable (deltalake's writes did); the
    current attributes hold the same list, typed as the partials make it (no null element): Spark's
    MERGE into attributes casts no list of nullable elements into a column of non-null ones."""
    specs = parse_attributes([{"name": "apps", "aggregation": "unique_list", "property": "app_id"}])
    schema = "attribute_key string, valid_from date, valid_to date, apps array<string>"  # elements nullable
    history = spark.createDataFrame([("U1", date(2021, 1, 1), date(2021, 1, 3), ["web"]), ("U1", date(2021, 1, 3), None, ["tv", "web"]),
                                     ("U2", date(2021, 1, 2), None, [])], schema)
    assert history.schema["apps"].dataType.containsNull
    current = current_attributes(history, spark.createDataFrame([("U1",), ("U2",)], "attribute_key string"), specs)
    daily = daily_of(spark, [("U1", "page_view", t("01 10:00"), "/a", "web")])
    assert current.schema["apps"].dataType == attributes_from_daily(daily, specs, THROUGH).schema["apps"].dataType
    assert not current.schema["apps"].dataType.containsNull
    assert sorted(map(tuple, current.collect())) == [("U1", ["tv", "web"]), ("U2", [])]
