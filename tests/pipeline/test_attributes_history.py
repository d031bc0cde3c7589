"""attributes_history over a sample stream with late and out-of-order loads, held against an oracle
computed with pandas straight from filtered_events (not from the project's partials): for every day
and key, the row valid that day holds the values as of the end of that day."""

import shutil
from datetime import date, datetime, timedelta

import pandas as pd
import pyarrow as pa
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from incremental_assets.cli import main
from incremental_assets.cli.runner import run_days, run_incremental
from incremental_assets.lib.delta import read as delta_read
from incremental_assets.lib.delta.compare import differing_keys
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import append_hours, generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.transforms.daily import as_of_day_before
from tests.warehouse_tables import scenario_environment

PARAMS = SampleParams(users=12, days=4, events_per_day=240, start_date=date(2024, 3, 1), seed=17, late_share=0.3)
NAMES = ["page_views", "page_views_7d", "sessions_7d", "first_seen", "last_seen", "last_page_url", "distinct_apps", "carts_added"]


def settings(reference_day: date) -> IncrementalSettings:
    return IncrementalSettings(
        start_date="2024-03-01", backfill_limit_days=2, reprocess_days=30, min_rows_to_process=1,
        attributes_reference_date=reference_day.isoformat(),
    )


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """A warehouse kept by a run a day (the reference day moving with it), the last a week past the
    stream's end, so that its 7-day values age out: the history kept incrementally throughout."""
    root = tmp_path_factory.mktemp("history")
    warehouse, source = root / "warehouse", root / "source"
    instance = DagsterInstance.ephemeral()
    with scenario_environment(warehouse, source, {}):
        generate_stream(spark, str(source), PARAMS, hours=2 * 24)
        for day in range(3, 6):
            if day > 3:
                append_hours(spark, str(source), 24)
            assert run_incremental(settings(date(2024, 3, day - 1)), now=f"2024-03-{day:02d}T00:00:00", instance=instance).success
        last = date(2024, 3, 12)
        assert run_days(settings(last), date(2024, 3, 4), date(2024, 3, 4), instance).success
    return warehouse, source, instance, last


def events(warehouse) -> pd.DataFrame:
    frame = DeltaTable(f"{warehouse}/filtered_events").to_pandas()
    return frame.assign(event_date=pd.to_datetime(frame.event_date).dt.date)


def oracle(events: pd.DataFrame, day: date) -> dict[str, tuple]:
    """Every sample attribute of every key seen by the end of `day`, from its events alone."""
    seen = events[events.event_date <= day]
    keys = seen.user_identifier.dropna().unique()
    by_key = seen.groupby("user_identifier")
    week = seen[seen.event_date > day - timedelta(days=7)]
    views = seen.event_name == "page_view"
    pages = seen[views & seen.page_url.notna()].sort_values(["derived_tstamp", "page_url"])
    columns = [
        views.groupby(seen.user_identifier).sum(),
        (week.event_name == "page_view").groupby(week.user_identifier).sum().reindex(keys, fill_value=0),
        week.groupby("user_identifier").session_identifier.nunique().reindex(keys, fill_value=0),
        by_key.derived_tstamp.min().map(moment),
        by_key.derived_tstamp.max().map(moment),
        pages.groupby("user_identifier").page_url.last().reindex(keys),
        seen[seen.app_id.notna()].groupby("user_identifier").app_id.unique().map(sorted).reindex(keys),
        (seen.event_name == "add_to_cart").groupby(seen.user_identifier).sum(),
    ]
    table = pd.concat([column.reindex(keys) for column in columns], axis=1)
    return {key: (int(a), int(b), int(c), d, e, None if pd.isna(f) else f, g if isinstance(g, list) else [], int(h))
            for key, (a, b, c, d, e, f, g, h) in zip(table.index, table.itertuples(index=False))}


def moment(value) -> datetime:
    value = pd.Timestamp(value)
    return (value.tz_convert("UTC") if value.tzinfo else value.tz_localize("UTC")).to_pydatetime()


def history_rows(warehouse, version: int | None = None) -> list[dict]:
    return DeltaTable(f"{warehouse}/attributes_history", version=version).to_pyarrow_table().to_pylist()


def valid_on(rows: list[dict], day: date) -> dict[str, tuple]:
    found = {}
    for row in rows:
        if row["valid_from"] <= day and (row["valid_to"] is None or day < row["valid_to"]):
            assert row["attribute_key"] not in found, f"two rows of {row['attribute_key']} valid on {day}"
            found[row["attribute_key"]] = tuple(
                moment(row[n]) if isinstance(row[n], datetime) else row[n] for n in NAMES
            )
    return found


def assert_oracle_holds(warehouse, last: date) -> None:
    rows, filtered = history_rows(warehouse), events(warehouse)
    day = PARAMS.start_date
    while day <= last:
        assert valid_on(rows, day) == oracle(filtered, day), f"as of {day}"
        day += timedelta(days=1)


def test_the_row_valid_on_each_day_holds_that_days_values_for_every_key(built):
    warehouse, _, _, last = built
    assert_oracle_holds(warehouse, last)
    rows = history_rows(warehouse)
    # a row starts only where a value changes, and the 7-day values aged out after the stream ended
    assert len(rows) < len({r["attribute_key"] for r in rows}) * ((last - PARAMS.start_date).days + 1)
    assert all(r["page_views_7d"] == 0 for r in rows if r["valid_to"] is None and r["page_views"])


def copied(built, tmp_path):
    """The module's warehouse and source copied for a test that changes them, with an instance of its own."""
    base, source_base, _, last = built
    warehouse, source = tmp_path / "warehouse", tmp_path / "source"
    shutil.copytree(base, warehouse)
    shutil.copytree(source_base, source)
    return warehouse, source, DagsterInstance.ephemeral(), last


def load_a_late_session(spark, source, day: date) -> str:
    """A session of three page views of one user on `day`, loaded on 03-05 (copies of that user's
    page views of the day, in a session of their own); returns the user."""
    stream = spark.read.format("delta").load(str(source))
    user_views = stream.where((F.to_date("derived_tstamp") == F.lit(day)) & (F.col("event_name") == "page_view"))
    user = user_views.first()["domain_userid"]
    loaded = datetime(2024, 3, 5, 0, 30)
    late = (
        user_views.where(F.col("domain_userid") == user).limit(3)
        .withColumn("event_id", F.concat(F.lit("late-"), "event_id"))
        .withColumn("domain_sessionid", F.lit("late-session"))
        .withColumn("load_tstamp", F.lit(loaded)).withColumn("load_date", F.lit(loaded.date()))
    )
    write_events(spark, late, str(source), "append")
    return user


def test_a_late_batch_rewrites_its_key_from_its_day_on_and_a_rerun_writes_nothing(spark, built, tmp_path):
    warehouse, source, instance, last = copied(built, tmp_path)
    with scenario_environment(warehouse, source, {}):
        day = date(2024, 3, 2)
        user = load_a_late_session(spark, source, day)
        before = DeltaTable(f"{warehouse}/attributes_history").version()
        old = history_rows(warehouse)
        assert run_incremental(settings(last), now="2024-03-05T01:00:00", instance=instance).success
        table = DeltaTable(f"{warehouse}/attributes_history")
        assert table.version() > before
        new = history_rows(warehouse)
        changed = [r for r in old if r not in new] + [r for r in new if r not in old]
        assert changed and {r["attribute_key"] for r in changed} == {user}, "only the late user's rows"
        assert all(r["valid_to"] is None or r["valid_to"] > day for r in changed), "only its rows from that day on"
        assert_oracle_holds(warehouse, last)

        # the daily job again over the same days, nothing new: no commit to attributes_history
        written = table.version()
        assert run_days(settings(last), day, day, instance).success
        assert run_incremental(settings(last), now="2024-03-05T02:00:00", instance=instance).success
        assert DeltaTable(f"{warehouse}/attributes_history").version() == written


def test_reading_the_keys_a_run_touches_by_name_leaves_the_tables_reading_them_whole_does(spark, built, tmp_path, monkeypatch):
    """The lifecycle's step reads the stored sessions of its window by name, attributes and
    attributes_history the rows of the keys they recompute (up to KEYS_NAMED keys; the whole tables
    above): a late session and the reference day moved on, run both ways over copies of one
    warehouse, leave the same tables."""
    kept = {}
    for reads, named in (("by name", delta_read.KEYS_NAMED), ("whole", 0)):
        monkeypatch.setattr(delta_read, "KEYS_NAMED", named)
        warehouse, source, instance, last = copied(built, tmp_path / reads)
        with scenario_environment(warehouse, source, {}):
            load_a_late_session(spark, source, date(2024, 3, 2))
            append_hours(spark, str(source), 2)  # sessions stored before go on
            assert run_incremental(settings(last + timedelta(days=1)), now="2024-03-05T03:00:00", instance=instance).success
        kept[reads] = {table: sorted(map(repr, DeltaTable(f"{warehouse}/{table}").to_pyarrow_table().to_pylist()))
                       for table in ("sessions_lifecycle_manifest", "quarantined_sessions", "sessions", "attributes", "attributes_history")}
    assert kept["by name"] == kept["whole"]
    assert kept["by name"]["attributes_history"] != sorted(map(repr, history_rows(built[0])))  # the run changed it


def test_the_daily_rows_a_run_changed_are_those_pythons_comparison_of_every_row_finds(built):
    """changed_keys compares two versions of daily_aggregates in Arrow: held against Python's
    comparison of every row, for every pair of versions the runs left."""
    uri = f"{built[0]}/daily_aggregates"
    keys = ["attribute_key", "event_date"]
    tables = [DeltaTable(uri, version=version).to_pyarrow_table() for version in range(DeltaTable(uri).version() + 1)]
    found = []
    for was, before in enumerate(tables):
        for after in tables[was + 1:]:
            old, new = ({tuple(row[k] for k in keys): row for row in table.to_pylist()} for table in (before, after))
            expected = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
            assert differing_keys(before, after, keys) == expected
            found.append(len(expected) / len(old.keys() | new.keys()))
    assert len(found) >= 3 and any(0 < share < 1 for share in found), "some rewrites changed some rows and kept others"


def test_a_point_in_time_lookup_gives_each_example_the_values_of_the_day_before(spark, built):
    assert_lookups_match_the_oracle(spark, built, 100_000, 14)  # to 03-15


def test_a_point_in_time_lookup_in_a_tokyo_session_takes_the_utc_day_and_leaks_nothing(spark, built):
    """The docs' training set from a user's own session, whose time zone is not UTC: each example
    still gets the values as of the end of the UTC day before it (Tokyo's day starts 9 hours
    earlier: 'its' day before counted the events of the example's own UTC day)."""
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        assert_lookups_match_the_oracle(spark, built, 20_000, 61)  # to 03-13, at every hour of the day
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")


def assert_lookups_match_the_oracle(spark, built, count: int, seconds_apart: int):
    warehouse, _, _, last = built
    filtered = events(warehouse)
    keys = sorted(filtered.user_identifier.unique()) + ["never-seen"]
    start = datetime(2024, 2, 28)  # naive: UTC, as this process's clock is (pyspark takes it as local)
    examples = [(i, keys[i % len(keys)], start + timedelta(seconds=seconds_apart * i)) for i in range(count)]
    frame = spark.createDataFrame(examples, "example int, user string, at timestamp")
    history = spark.read.format("delta").load(f"{warehouse}/attributes_history")
    looked = as_of_day_before(frame, history, key="user", at="at").collect()
    assert sorted(row.example for row in looked) == list(range(len(examples)))
    by_day = {}
    for row in looked:
        day = min(row.at.date() - timedelta(days=1), last)  # the history runs through its last reference day
        if day not in by_day:
            by_day[day] = oracle(filtered, day)
        expected = by_day[day].get(row.user, (None,) * len(NAMES))
        got = tuple(moment(row[n]) if isinstance(row[n], datetime) else row[n] for n in NAMES)
        assert got == expected, f"{row.user} at {row.at}"


def test_the_command_prints_one_keys_values_as_of_a_day(built, capsys):
    warehouse, source, _, last = built
    filtered = events(warehouse)
    key = sorted(filtered.user_identifier.unique())[0]
    day = date(2024, 3, 3)
    with scenario_environment(warehouse, source, {}):
        assert main(["attributes", "--key", key, "--as-of", day.isoformat()]) == 0
        shown = capsys.readouterr().out
        assert main(["attributes", "--key", key, "--as-of", "2024-02-20"]) == 1
        before = capsys.readouterr().out
        assert main(["attributes", "--key", key, "--as-of", "2024-04-01"]) == 0
        beyond = capsys.readouterr().out
    expected = dict(zip(NAMES, oracle(filtered, day)[key]))
    lines = {line.split()[0]: line.split(None, 1)[1].strip() for line in shown.splitlines()[1:]}
    assert lines["page_views"] == str(expected["page_views"]) and lines["carts_added"] == str(expected["carts_added"])
    assert lines["last_page_url"] == str(expected["last_page_url"])
    assert f"{key}: no event by the end of 2024-02-20" in before
    assert f"the history runs through {last}" in beyond


@pytest.mark.parametrize("read", ["small", "big"])
def test_the_tiling_check_reads_every_interval_of_the_keys_a_run_recomputed(spark, built, tmp_path, monkeypatch, read, python_workers_refused):
    """A gap stored before the day a run recomputes a key from is found: the check reads all the
    intervals of the keys it recomputed (by name, not the whole history). The same gap in a key
    the run did not recompute is not that run's to report. Found in Arrow when deltalake reads
    those intervals, and by Spark when the read is too big for it. The run's keys changed and the
    keys read by name start no Python worker."""
    if read == "big":
        monkeypatch.setattr(delta_read, "is_small", lambda rows: False)
    warehouse, source, instance, last = copied(built, tmp_path)
    with scenario_environment(warehouse, source, {}):
        user = load_a_late_session(spark, source, date(2024, 3, 2))
        first = {}
        for row in sorted(history_rows(warehouse), key=lambda row: row["valid_from"]):
            first.setdefault(row["attribute_key"], row)
        other = sorted(key for key in first if key not in (user, None))[0]
        # Each key gains an interval that ends two days before its first one starts.
        gaps = [{**first[key], "valid_from": date(2024, 2, 26), "valid_to": date(2024, 2, 27)} for key in (user, other)]
        history = DeltaTable(f"{warehouse}/attributes_history")
        write_deltalake(history, pa.Table.from_pylist(gaps, schema=pa.schema(history.schema().to_arrow())), mode="append")
        run = run_incremental(settings(last), now="2024-03-05T01:00:00", instance=instance)
        assert run.success
        check = AssetCheckKey(AssetKey("attributes_history"), "intervals_tile_each_key")
        [record] = instance.event_log_storage.get_asset_check_execution_history(check, limit=1)
        evaluation = record.event.dagster_event.event_specific_data
        assert record.run_id in {daily.run_id for daily in run.daily_runs} and not evaluation.passed
        found = evaluation.metadata["examples"].value
        assert {(row["attribute_key"], row["valid_from"]) for row in found} == {(user, str(first[user]["valid_from"]))}
