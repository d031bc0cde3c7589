"""The sample stream generator: deterministic, consistent across windows, and holding every anomaly."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from incremental_assets.lib.sample.generator import (
    APP_IDS,
    ARROW_SCHEMA,
    BOT_SESSION_MIN,
    COLUMNS,
    LATE_AFTER,
    LATE_SENT_MIN,
    OFFLINE_SEND_MAX,
    SESSION_TIMEOUT,
    SampleParams,
    generate_events,
    generate_table,
)
from incremental_assets.lib.sample.stream import STREAM_SCHEMA
from incremental_assets.lib.utc import aware

START = date(2024, 1, 1)
PARAMS = SampleParams(start_date=START)
DAY = timedelta(days=1)
MAX_SESSION_DAYS = timedelta(days=3)
DAYS_LATE_ALLOWED = timedelta(days=3)


def window(params: SampleParams, from_hour: float, until_hour: float) -> list[tuple]:
    """The rows loaded between two hours counted from the stream's start."""
    return generate_events(params, params.start + timedelta(hours=from_hour), params.start + timedelta(hours=until_hour))


def table(params: SampleParams, from_hour: float, until_hour: float) -> pa.Table:
    """The same window as a pyarrow Table."""
    return generate_table(params, params.start + timedelta(hours=from_hour), params.start + timedelta(hours=until_hour))


@pytest.fixture(scope="module")
def events() -> list[dict]:
    """The default 5-day stream, rows as dicts."""
    return [dict(zip((*COLUMNS, "load_date"), row)) for row in window(PARAMS, 0, 5 * 24)]


def human_sessions(events: list[dict]) -> dict[str, list[dict]]:
    """Events with device timestamps grouped by session, bots (sessions over a day) left out."""
    sessions = defaultdict(list)
    for event in events:
        if event["dvce_created_tstamp"] is not None:
            sessions[event["domain_sessionid"]].append(event)
    return {sid: rows for sid, rows in sessions.items() if span(rows) < DAY}


def span(rows: list[dict]) -> timedelta:
    created = [row["dvce_created_tstamp"] for row in rows if row["dvce_created_tstamp"] is not None]
    return max(created) - min(created)


def test_same_params_give_identical_rows_and_another_seed_differs():
    assert window(PARAMS, 0, 30) == window(SampleParams(start_date=START), 0, 30)
    assert window(PARAMS, 0, 30) != window(SampleParams(start_date=START, seed=7), 0, 30)


@pytest.mark.parametrize(
    "cuts",
    [
        (0, 50, 96),
        (0, 200, 201, 240),  # past the stream's days and across a bot cycle
        (7.25, 31, 31.001, 130.5),  # cut anywhere, not only on the hour
        (150, 170, 171, 260),  # far from the start, where a window skips the early event days
    ],
)
def test_windows_are_consistent(cuts):
    """[a, c) == [a, b) + [b, c) for any cut points."""
    windows = list(zip(cuts, cuts[1:]))
    assert pa.concat_tables([table(PARAMS, *hours) for hours in windows]).equals(table(PARAMS, cuts[0], cuts[-1]))


def test_the_table_is_the_stream_schema_in_arrow_and_the_rows_are_its_values_in_naive_utc():
    generated = table(PARAMS, 0, 30)
    assert generated.schema == ARROW_SCHEMA == to_arrow_schema(STREAM_SCHEMA)
    rows = window(PARAMS, 0, 30)
    assert all(value.tzinfo is None for row in rows for value in row if isinstance(value, datetime))
    marked_utc = [tuple(aware(value) for value in row) for row in rows]
    assert marked_utc == [tuple(row.values()) for row in generated.to_pylist()]


def test_ids_are_version_4_uuids(events):
    ids = {row[name] for row in events for name in ("event_id", "domain_sessionid", "domain_userid")} - {None}
    assert all(str(uuid.UUID(text)) == text and uuid.UUID(text).version == 4 for text in ids)


def test_a_window_before_the_stream_is_empty_and_a_reversed_one_is_refused():
    assert table(PARAMS, -48, 0).equals(ARROW_SCHEMA.empty_table())
    with pytest.raises(ValueError, match="before"):
        table(PARAMS, 10, 9)


def test_rows_follow_the_schema_and_load_hours(events):
    first = events[0]
    assert first["event_vendor"] == "com.snowplowanalytics.snowplow"
    assert all(row["load_date"] == row["load_tstamp"].date() for row in events)
    assert all(PARAMS.start <= row["load_tstamp"] < PARAMS.start + 5 * DAY for row in events)
    assert [row["load_tstamp"] for row in events] == sorted(row["load_tstamp"] for row in events)


@pytest.mark.parametrize("params", [
    PARAMS,
    SampleParams(users=533, events_per_day=20_000, start_date=START),
    # a real site's shapes: thousands of users with a few events each (the benches', the oracle test's)
    SampleParams(users=2857, events_per_day=20_000, start_date=START),
    SampleParams(users=3000, events_per_day=6000, start_date=START, bot_share=0.01),
], ids=["default", "large", "site", "sparse site"])
def test_volume_is_about_events_per_day(params):
    """Findings: at 3,000 users every session kept its first page whole whatever its budget, and the
    days held 1.5 times the volume asked for at 20,000 a day, 4.9 times at 6,000."""
    per_day = pc.value_counts(table(params, 0, 5 * 24)["load_date"]).field("counts").to_pylist()
    assert len(per_day) == 5
    for count in per_day:
        assert 0.8 * params.events_per_day <= count <= 1.2 * params.events_per_day
    assert 0.9 * params.events_per_day <= sum(per_day[1:]) / 4 <= 1.1 * params.events_per_day  # the first day fills up


def test_at_a_sparse_site_users_come_back_on_some_days():
    """Over ten days of a month-long stream: most users are seen, each on a few of the days."""
    params = SampleParams(users=3000, days=30, events_per_day=6000, start_date=START, bot_share=0.01)
    rows = table(params, 10 * 24, 20 * 24).select(["domain_userid", "load_date"])
    user_days = rows.group_by(["domain_userid", "load_date"]).aggregate([])
    days_each = user_days.group_by("domain_userid").aggregate([("load_date", "count")])["load_date_count"]
    assert len(days_each) > 0.6 * params.users
    assert 1.5 < pc.mean(days_each).as_py() < 4  # of 10


def test_more_bots_than_the_volume_holds_are_refused_by_name():
    with pytest.raises(ValueError, match="events_per_day must be more than the bots send .* lower bot_share"):
        SampleParams(users=3000, events_per_day=6000)  # 150 bots, about 48 events a day each


def test_timestamps_chain_from_device_to_load(events):
    normal = [row for row in events if row["dvce_created_tstamp"] is not None]
    for row in normal:
        assert row["dvce_created_tstamp"] < row["dvce_sent_tstamp"] < row["collector_tstamp"] < row["load_tstamp"]
        drift = row["dvce_sent_tstamp"] - row["dvce_created_tstamp"]
        assert row["derived_tstamp"] == row["collector_tstamp"] - drift


def test_late_loads_and_offline_devices(events):
    late_loads = [row for row in events if row["load_tstamp"] - row["collector_tstamp"] > LATE_AFTER]
    offline = [
        row
        for row in events
        if row["dvce_sent_tstamp"] is not None
        and LATE_AFTER < row["dvce_sent_tstamp"] - row["dvce_created_tstamp"] <= OFFLINE_SEND_MAX
    ]
    assert 0.01 * len(events) < len(late_loads) < 0.06 * len(events)
    assert max(row["load_tstamp"] - row["collector_tstamp"] for row in late_loads) > DAY
    assert 0.01 * len(events) < len(offline) < 0.05 * len(events)
    assert all(row["load_tstamp"] - row["derived_tstamp"] > LATE_AFTER for row in offline)


def test_late_sent_events_exceed_days_late_allowed(events):
    late_sent = [
        row
        for row in events
        if row["dvce_sent_tstamp"] is not None and row["dvce_sent_tstamp"] > row["dvce_created_tstamp"] + LATE_SENT_MIN
    ]
    assert late_sent
    assert all(row["dvce_sent_tstamp"] > row["dvce_created_tstamp"] + DAYS_LATE_ALLOWED + DAY for row in late_sent)


def test_duplicates_in_the_same_hour_and_reloaded_later(events):
    copies = defaultdict(list)
    for row in events:
        if row["event_id"] is not None:
            copies[row["event_id"]].append(row)
    duplicated = [rows for rows in copies.values() if len(rows) > 1]
    same_hour = [rows for rows in duplicated if load_hour(rows[0]) == load_hour(rows[1])]
    reloaded = [rows for rows in duplicated if load_hour(rows[0]) < load_hour(rows[1])]
    assert same_hour and reloaded
    assert all(rows[0] == rows[1] for rows in same_hour)
    assert all(without_load(rows[0]) == without_load(rows[1]) for rows in reloaded)
    assert 0.005 * len(events) < len(duplicated) < 0.04 * len(events)


def load_hour(row: dict) -> datetime:
    return row["load_tstamp"].replace(minute=0, second=0, microsecond=0)


def without_load(row: dict) -> dict:
    return {key: value for key, value in row.items() if key not in ("load_tstamp", "load_date")}


def test_bot_sessions_outlast_max_session_days(events):
    by_session = defaultdict(list)
    for row in events:
        by_session[row["domain_sessionid"]].append(row)
    bots = {sid: rows for sid, rows in by_session.items() if span(rows) > MAX_SESSION_DAYS}
    assert len(bots) == len(PARAMS.bot_users) == 2
    for rows in bots.values():
        assert len({row["domain_userid"] for row in rows}) == 1
        assert span(rows) >= BOT_SESSION_MIN - DAY  # the 5-day window cuts the session short
        assert len(rows) > 3 * 24 * 60 / 40


def test_null_device_timestamps_and_null_event_ids(events):
    null_dvce = [row for row in events if row["dvce_created_tstamp"] is None]
    assert 0.002 * len(events) < len(null_dvce) < 0.01 * len(events)
    assert all(row["dvce_sent_tstamp"] is None for row in null_dvce)
    assert all(row["derived_tstamp"] == row["collector_tstamp"] for row in null_dvce)
    null_ids = [row for row in events if row["event_id"] is None]
    assert {row["collector_tstamp"].date() for row in null_ids} == {START + i * DAY for i in range(5)}
    assert len(null_ids) < 0.005 * len(events)


def test_apps_platforms_and_event_names(events):
    assert {row["app_id"] for row in events} == set(APP_IDS)
    assert {row["platform"] for row in events} == {"web", "mob"}
    names = Counter(row["event_name"] for row in events)
    assert {"page_view", "page_ping", "screen_view", "add_to_cart", "link_click", "submit_form"} <= set(names)
    assert names["page_ping"] > names["page_view"]
    views = [row for row in events if row["event_name"] == "page_view"]
    assert all(row["page_url"].startswith("https://") and row["page_title"] for row in views)
    assert any(row["page_referrer"] for row in views)


def test_sessions_split_after_30_minutes_of_inactivity(events):
    sessions = human_sessions(events)
    by_user = defaultdict(list)
    for rows in sessions.values():
        times = sorted(row["dvce_created_tstamp"] for row in rows)
        assert all(later - earlier < SESSION_TIMEOUT for earlier, later in zip(times, times[1:]))
        by_user[rows[0]["domain_userid"]].append((times[0], times[-1], rows[0]["domain_sessionidx"]))
    for user_sessions in by_user.values():
        user_sessions.sort()
        assert [index for _, _, index in user_sessions] == list(range(1, len(user_sessions) + 1))
        assert all(nxt[0] - prev[1] >= SESSION_TIMEOUT for prev, nxt in zip(user_sessions, user_sessions[1:]))


def test_user_id_for_some_users_sometimes_only_from_the_second_session(events):
    logins = defaultdict(dict)
    for row in events:
        logins[row["domain_userid"]][row["domain_sessionidx"]] = row["user_id"]
    with_user_id = [user for user, by_index in logins.items() if any(by_index.values())]
    later = [user for user, by_index in logins.items() if by_index.get(1) is None and by_index.get(2)]
    assert 0 < len(with_user_id) < PARAMS.users
    assert later


@pytest.mark.parametrize(
    "field, value",
    [
        ("users", 0),
        ("days", 0),
        ("events_per_day", 0),
        ("events_per_day", 40 * 500 + 1),
        ("late_share", 0.9),
        ("duplicate_share", -0.1),
        ("bot_share", 0.6),
        ("seed", -1),
        ("users", 2.5),
        ("start_date", "2024-01-01"),
        ("start_date", datetime(2024, 1, 1)),
    ],
)
def test_invalid_params_name_the_parameter(field, value):
    with pytest.raises(ValueError, match=field):
        SampleParams(**{field: value})


def test_params_round_trip_through_json():
    params = SampleParams(users=7, days=3, start_date=START, seed=3, late_share=0.1)
    assert SampleParams.from_json(params.to_json()) == params
    assert SampleParams().start_date == datetime.now(timezone.utc).date() - timedelta(days=5)


def test_stream_in_batches_equals_one_generation(spark, warehouse):
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from incremental_assets.lib.environment import table_uri
    from incremental_assets.lib.sample.stream import append_hours, generate_stream, read_stream_state

    uri = table_uri("atomic_events")
    params = SampleParams(users=10, days=2, events_per_day=300, start_date=START)
    with pytest.raises(FileNotFoundError, match="generate"):
        append_hours(spark, uri, 1)

    written = generate_stream(spark, uri, params) + append_hours(spark, uri, 20) + append_hours(spark, uri, 4)

    expected = window(params, 0, 72)
    stored = spark.read.format("delta").load(uri)
    assert written == stored.count() == len(expected)
    # build_spark_session puts the process in UTC, so collected timestamps are naive UTC too.
    assert sorted(map(tuple, stored.collect()), key=repr) == sorted(expected, key=repr)
    last_load = max(row[COLUMNS.index("load_tstamp")] for row in expected)
    epoch_micros = (last_load - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    assert stored.select(F.unix_micros(F.max("load_tstamp"))).first()[0] == epoch_micros
    assert (Path(uri) / "_delta_log").is_dir()
    assert DeltaTable.forPath(spark, uri).detail().first()["partitionColumns"] == ["load_date"]
    assert read_stream_state(uri) == (params, params.start + timedelta(hours=72))


def test_a_quiet_hour_moves_the_stream_on(spark, warehouse):
    """Spark commits no append of no row: the hour's marker is committed alone, and the next
    append continues after it instead of writing the same quiet hour again."""
    from incremental_assets.lib.delta.log import table_version
    from incremental_assets.lib.environment import table_uri
    from incremental_assets.lib.sample.stream import append_hours, generate_stream, read_stream_state

    uri = table_uri("atomic_events")
    params = SampleParams(users=3, days=2, events_per_day=40, start_date=START)
    quiet = next(hour for hour in range(1, 48) if not window(params, hour, hour + 1))  # a night hour
    generate_stream(spark, uri, params, hours=quiet)
    version = table_version(uri)

    assert append_hours(spark, uri, 1) == 0
    assert table_version(uri) == version + 1 and read_stream_state(uri) == (params, params.start + timedelta(hours=quiet + 1))
    busy = next(hour for hour in range(quiet + 1, 48) if window(params, hour, hour + 1))
    assert append_hours(spark, uri, busy - quiet) == len(window(params, quiet + 1, busy + 1)) > 0
    assert spark.read.format("delta").load(uri).count() == len(window(params, 0, busy + 1))


def test_next_batch_writes_nothing_and_continues_from_the_recorded_marker(spark, warehouse):
    from incremental_assets.lib.environment import table_uri
    from incremental_assets.lib.sample.stream import generate_stream, next_batch

    uri = table_uri("atomic_events")
    params = SampleParams(users=10, days=2, events_per_day=300, start_date=START)
    frame, loaded_until = next_batch(spark, uri, hours=10, params=params)
    assert loaded_until == params.start + timedelta(hours=10)
    assert frame.count() == len(window(params, 0, 10)) > 0
    assert not Path(uri).exists()

    generate_stream(spark, uri, params, hours=10)
    # The stream's own parameters win over any given later, so the rows continue what is there.
    frame, loaded_until = next_batch(spark, uri, hours=3, params=SampleParams(seed=9))
    assert loaded_until == params.start + timedelta(hours=13)
    assert frame.count() == len(window(params, 10, 13)) > 0


def test_a_big_new_stream_is_written_in_parts_that_add_up_to_the_same_rows(spark, warehouse, monkeypatch):
    """Millions of generated rows at once exhaust the driver's heap: they are written a part at a time."""
    from deltalake import DeltaTable

    from incremental_assets.lib.sample import stream
    from incremental_assets.lib.sample.stream import generate_stream, read_stream_state

    params = SampleParams(users=10, days=2, events_per_day=240, start_date=date(2024, 3, 1), seed=5)
    monkeypatch.setattr(stream, "_ROWS_PER_WRITE", 100)  # 10 hours of ~10 events an hour per part
    uri = f"{warehouse}/atomic_events"
    written = generate_stream(spark, uri, params, hours=30)
    expected = generate_table(params, datetime(2024, 3, 1), datetime(2024, 3, 2, 6))
    stored = spark.read.format("delta").load(uri)
    assert written == expected.num_rows == stored.count()
    assert sorted(r.event_id or "" for r in stored.select("event_id").collect()) == sorted(
        e or "" for e in expected.column("event_id").to_pylist()
    )
    assert len(DeltaTable(uri).history()) == 3  # hours 0-9, 10-19, 20-29
    assert read_stream_state(uri)[1] == datetime(2024, 3, 2, 6)
