"""The asset checks: what each looks for on hand-made rows, what it reads on real Delta tables,
and the stranded-late-events warning."""

import random
from datetime import date, datetime, timedelta

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, AssetMaterialization, DagsterInstance, asset, build_op_context, materialize
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from incremental_assets.definitions import freshness_checks
from incremental_assets.defs.base.sessions import sessions_unique_and_within_cap
from incremental_assets.defs.daily.manifest import late_events_stranded_beyond_horizon
from incremental_assets.defs.incremental.filtered_events import (
    event_id_unique,
    events_within_session_cap,
    manifest_consistent_with_tables,
)
from incremental_assets.lib.catalog import DAILY_AGGREGATES, FILTERED_EVENTS
from incremental_assets.lib.checks import from_offending_rows, sums_by
from incremental_assets.lib.catalog import LIFECYCLE as LIFECYCLE_NAME
from incremental_assets.lib.delta.log import stored_max
from incremental_assets.lib.delta.spec import Stored, WriteMode
from incremental_assets.lib.delta.write import WriteRequest, create_with_change_feed, write
from incremental_assets.lib.incremental.days import mismatched_days
from incremental_assets.lib.incremental.limits import BatchStats, Cursor, RunLimits, RunState
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.records import BEYOND_HORIZON, PROCESSED, DayStatus
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms import sessions as T
from tests.spark.test_transforms import LIFECYCLE, frame
from tests.warehouse_tables import built_under, found_rows


def test_stranded_late_events_warn(spark, warehouse):
    state = StateStore()
    state.save_days([DayStatus(date(2024, 3, 1), processed_events=10, status=PROCESSED)], consumed_version=1)
    assert late_events_stranded_beyond_horizon(state=state).passed

    state.save_days([DayStatus(date(2024, 2, 1), pending_late_events=7, status=BEYOND_HORIZON)])
    result = late_events_stranded_beyond_horizon(state=state)
    assert not result.passed and result.severity == AssetCheckSeverity.WARN
    assert result.metadata["pending_late_events"].value == 7
    assert result.description.startswith("7 late events on 1 day(s) wait for a backfill (2024-02-01): "
                                         "incremental-assets backfill --start 2024-02-01 --end 2024-02-01")
    assert state.consumed_version() == 1


# What the blocking checks look for, on hand-made rows (max_session_days 3; times in January 2021).

def _t(text: str) -> datetime:
    return datetime.fromisoformat(f"2021-01-{text}")


# A check hands the violations Spark's DataFrame, or the Arrow deltalake read for it (read_to_check).
ENGINES = ["spark", "arrow"]


def _handed(engine: str, rows):
    return rows if engine == "spark" else rows.toArrow()


@pytest.mark.parametrize("engine", ENGINES)
def test_duplicated_names_each_key_held_twice(spark, engine):
    rows = _handed(engine, spark.createDataFrame([("a",), ("b",), ("b",), ("c",), ("c",), ("c",)], "event_id string"))
    assert found_rows(V.duplicated(rows, ["event_id"])) == [("b", 2), ("c", 3)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("every_hash_shared", [False, True])
def test_duplicated_event_ids_count_by_id_what_their_hashes_flag(spark, monkeypatch, every_hash_shared, engine):
    """Hashes only narrow the search: as if every id shared one hash (a collision), still the ids
    held twice, and none of a table without them."""
    if every_hash_shared:
        monkeypatch.setattr(F, "xxhash64", lambda *columns: F.lit(7).cast("long"))
    rows = spark.createDataFrame([("a",), ("b",), ("b",), ("c",), ("c",), ("c",)], "event_id string")
    assert found_rows(V.duplicated_event_ids(_handed(engine, rows))) == [("b", 2), ("c", 3)]
    assert found_rows(V.duplicated_event_ids(_handed(engine, rows.distinct()))) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_lifecycle_violations_find_each_broken_rule(spark, engine):
    lifecycle = frame(spark, LIFECYCLE, [
        ("ok", "u", _t("01 00:00"), _t("04 00:00")),       # end exactly at start + 3 days: allowed
        ("twice", "u", _t("01 00:00"), _t("01 01:00")),
        ("twice", "u", _t("01 00:00"), _t("01 02:00")),
        ("backwards", "u", _t("02 00:00"), _t("01 23:00")),
        ("too_long", "u", _t("01 00:00"), _t("04 00:00:01")),  # a second past the cap
        ("no_end", "u", _t("01 00:00"), None),
    ])
    found = {(row[0], row[3]) for row in found_rows(V.lifecycle_violations(_handed(engine, lifecycle), 3))}
    assert found == {
        ("twice", "stored more than once"), ("backwards", "start after end"),
        ("too_long", "end beyond start + max_session_days"), ("no_end", "missing start or end"),
    }


@pytest.mark.parametrize("seed", range(3))
def test_what_a_check_finds_in_arrow_is_what_spark_finds(spark, seed):
    """The violations and the sums of a check's rows in Arrow against Spark's, on generated rows:
    sessions held once, twice and under a null id; ends a microsecond either side of the cap and of
    the start, or missing; ids and days repeated or null; events of sessions held, unknown or
    null, at times around their sessions' bounds or missing. Each rule is broken somewhere."""
    rng, base = random.Random(seed), datetime(2024, 3, 1)
    edges = [timedelta(days=3), timedelta(days=3, microseconds=1), timedelta(days=3, microseconds=-1), timedelta(0),
             timedelta(microseconds=-1)]

    def moment() -> datetime:
        return base + timedelta(microseconds=rng.randrange(5 * 86_400_000_000))

    sessions = []
    for _ in range(400):
        start = None if rng.random() < 0.03 else moment()
        offset = rng.choice([*edges, timedelta(microseconds=rng.randrange(-86_400_000_000, 4 * 86_400_000_000))])
        end = None if rng.random() < 0.03 else (start or base) + offset
        sessions.append((rng.choice([None, *(f"s{i}" for i in range(300))]), "u", start, end))
    lifecycle = frame(spark, LIFECYCLE, sessions)
    in_spark = found_rows(V.lifecycle_violations(lifecycle, 3))
    assert found_rows(V.lifecycle_violations(lifecycle.toArrow(), 3)) == in_spark
    assert {row[3] for row in in_spark} == {
        "stored more than once", "missing start or end", "start after end", "end beyond start + max_session_days"}
    events = spark.createDataFrame(
        [(rng.choice([None, *(f"e{i}" for i in range(500))]), rng.choice([None, *range(20)]), date(2024, 3, rng.randrange(1, 6)))
         for _ in range(800)], "event_id string, events long, event_date date")
    assert found_rows(V.duplicated_event_ids(events.toArrow())) == found_rows(V.duplicated_event_ids(events)) != []
    pairs = [["event_id", "event_date"]]
    assert found_rows(V.duplicated(events.toArrow(), *pairs)) == found_rows(V.duplicated(events, *pairs)) != []
    for key in ("event_date", "event_id"):
        assert sums_by(events.toArrow(), key, "events") == sums_by(events, key, "events")

    def event(i: int) -> tuple:  # of a stored session (or none: unknown, null), at its start or cap to the microsecond, or anywhere
        held, _, start, _ = rng.choice(sessions) if rng.random() < 0.8 else (rng.choice([None, "unknown"]), "u", None, None)
        at = rng.choice([None, moment(), (start or base) + rng.choice([*edges, timedelta(days=-1)])])
        return f"e{i}", held, at

    inserted = frame(spark, "event_id string, session_identifier string, load_tstamp timestamp", [event(i) for i in range(600)])
    beyond = [V.events_beyond_cap(rows, held, "load_tstamp", 3)
              for rows, held in ((inserted, lifecycle), (inserted.toArrow(), lifecycle.toArrow()))]
    assert found_rows(beyond[1]) == found_rows(beyond[0]) != []


def test_a_failed_checks_examples_read_alike_from_either_engine(spark):
    """What a failed check shows of its rows: the same text whether they were found in Arrow or in Spark."""
    lifecycle = frame(spark, LIFECYCLE, [("s", "u", _t("02 00:00"), _t("01 23:00:00.000001"))])
    shown = [from_offending_rows(V.lifecycle_violations(rows, 3), "rows", "all") for rows in (lifecycle, lifecycle.toArrow())]
    assert shown[0].metadata["examples"].value == shown[1].metadata["examples"].value == [
        {"session_identifier": "s", "start_tstamp": "2021-01-02 00:00:00", "end_tstamp": "2021-01-01 23:00:00.000001",
         "problem": "start after end"}]
    assert not shown[1].passed and shown[0].description == shown[1].description


@pytest.mark.parametrize("engine", ENGINES)
def test_events_beyond_cap_are_outside_their_session_span(spark, engine):
    lifecycle = frame(spark, LIFECYCLE, [("S1", "u", _t("01 00:00"), _t("03 00:00"))])
    events = frame(spark, "event_id string, session_identifier string, load_tstamp timestamp", [
        ("start", "S1", _t("01 00:00")), ("at_cap", "S1", _t("04 00:00")),
        ("past_cap", "S1", _t("04 00:00:01")), ("before_start", "S1", _t("01 00:00") - timedelta(seconds=1)),
        ("orphan", "S9", _t("02 00:00")),
    ])
    beyond = V.events_beyond_cap(_handed(engine, events), _handed(engine, lifecycle), "load_tstamp", 3)
    assert {row[0] for row in found_rows(beyond)} == {"past_cap", "before_start", "orphan"}


@pytest.mark.parametrize("engine", ENGINES)
def test_interval_violations_name_gaps_overlaps_open_rows_and_repeated_values(spark, engine):
    # K1 is in shape. K2: a gap (01-02..01-03), then an open row followed by another. K3: a
    # row with the values of the one before, and one that ends before it starts.
    rows = spark.createDataFrame([
        ("K1", date(2021, 1, 1), date(2021, 1, 2), 1), ("K1", date(2021, 1, 2), None, 2),
        ("K2", date(2021, 1, 1), date(2021, 1, 2), 1), ("K2", date(2021, 1, 3), None, 2), ("K2", date(2021, 1, 4), None, 3),
        ("K3", date(2021, 1, 1), date(2021, 1, 2), 1), ("K3", date(2021, 1, 2), date(2021, 1, 1), 1),
    ], "attribute_key string, valid_from date, valid_to date, n int")
    found = {(row[0], row[1].day) for row in found_rows(V.interval_violations(_handed(engine, rows), ["n"]))}
    assert found == {("K2", 3), ("K2", 4), ("K3", 2)}


@pytest.mark.parametrize("engine", ENGINES)
def test_interval_violations_hold_nulls_nans_and_lists_equal_as_spark_does(spark, engine):
    """A value is repeated when both rows hold null, both NaN, or equal lists; a list in another
    order, or a null beside a value (a null list beside an empty one, a null element beside one), is
    a change. Rows of the null key follow each other as one key; a row without valid_from comes
    first in its key and is followed by nothing."""
    d = lambda day: date(2021, 1, day)  # noqa: E731
    rows = spark.createDataFrame([
        ("nulls", d(1), d(2), None, None, None), ("nulls", d(2), None, None, None, None),
        ("nan", d(1), d(2), 1, float("nan"), ["a"]), ("nan", d(2), None, 1, float("nan"), ["a"]),
        ("lists", d(1), d(2), 1, 0.5, ["a", "b"]), ("lists", d(2), d(3), 1, 0.5, ["b", "a"]),
        ("lists", d(3), d(4), 1, 0.5, ["b", "a", None]), ("lists", d(4), None, 1, 0.5, ["b", "a", None]),
        ("a null", d(1), d(2), 1, None, []), ("a null", d(2), None, None, None, []),
        (None, d(1), d(2), 1, 0.5, []), (None, d(2), None, 1, 0.5, []),
        ("no start", None, d(2), 1, 0.5, []), ("no start", d(2), d(1), 2, 0.5, []), ("no start", d(5), None, 3, 0.5, []),
        ("no list", d(1), d(2), 1, 0.5, None), ("no list", d(2), d(3), 1, 0.5, None), ("no list", d(3), d(4), 1, 0.5, []),
        ("no list", d(4), d(5), 1, 0.5, ["a", None]), ("no list", d(5), None, 1, 0.5, ["a", "b"]),
    ], "attribute_key string, valid_from date, valid_to date, n int, x double, apps array<string>")
    found = {(row[0], row[1]) for row in found_rows(V.interval_violations(_handed(engine, rows), ["n", "x", "apps"]))}
    assert found == {("nulls", d(2)), ("nan", d(2)), ("lists", d(4)), (None, d(2)), ("no start", d(2)), ("no start", d(5)),
                     ("no list", d(2))}


@pytest.mark.parametrize("seed", range(3))
def test_the_tiling_check_finds_in_arrow_what_spark_finds(spark, seed):
    """interval_violations on generated histories: keys (one null) whose intervals tile, or have a
    gap, an overlap, an open row before the last, an end before the start, no start, or the values
    of the row before; values of every kind an attribute has (counts, doubles with NaN, strings,
    lists), null or not."""
    rng = random.Random(seed)
    value = {
        "n": lambda: rng.choice([None, 0, 1, 2]),
        "x": lambda: rng.choice([None, float("nan"), 0.0, -0.0, 1.5]),
        "page": lambda: rng.choice([None, "/a", "/b"]),
        "apps": lambda: rng.choice([None, [], ["a"], ["a", "b"], ["b", "a"], [None]]),
    }
    rows = []
    for key in [None, *(f"k{i}" for i in range(150))]:
        day = date(2024, 1, 1) + timedelta(days=rng.randrange(30))
        for _ in range(rng.randrange(1, 6)):
            length = rng.choice([1, 2, 5])
            end = day + timedelta(days=length + rng.choice([0, 0, 0, 1, -1, -length - 1]))
            rows.append([key, None if rng.random() < 0.02 else day, end, *(make() for make in value.values())])
            day = end if rng.random() < 0.9 else day + timedelta(days=length)
        if rng.random() < 0.8:
            rows[-1][2] = None  # the current row
        if rng.random() < 0.1:
            rows.append([key, day + timedelta(days=rng.randrange(1, 4)), None, *rows[-1][3:]])  # repeated values, open twice
    history = spark.createDataFrame(
        [tuple(row) for row in rows],
        "attribute_key string, valid_from date, valid_to date, n int, x double, page string, apps array<string>")
    starts = [(row[0], row[1]) for row in rows]
    history = history.dropDuplicates(["attribute_key", "valid_from"]) if len(set(starts)) < len(starts) else history
    in_spark = found_rows(V.interval_violations(history, list(value)))
    assert found_rows(V.interval_violations(history.toArrow(), list(value))) == in_spark
    assert 10 < len(in_spark) < history.count() / 2


def test_daily_mismatches_compare_each_day_both_ways():
    # Day 1: 3 aggregated, 3 held (agrees); day 2: 5 vs 4; day 3: none aggregated, 1 held; day 4: 1 vs none.
    aggregated = {date(2021, 1, 1): 3, date(2021, 1, 2): 5, date(2021, 1, 4): 1}
    held = {date(2021, 1, 1): 3, date(2021, 1, 2): 4, date(2021, 1, 3): 1}
    assert [tuple(row.values()) for row in mismatched_days(aggregated, held)] == [
        (date(2021, 1, 2), 5, 4), (date(2021, 1, 3), 0, 1), (date(2021, 1, 4), 1, 0)
    ]


# The checks on real Delta tables: they read what the latest write changed, and fail on a planted fault,
# both when deltalake reads their rows (looked at in Arrow) and when the read is too big for it (Spark's).

@pytest.fixture(params=["small", "big"])
def read_size(request, monkeypatch) -> str:
    if request.param == "big":
        from incremental_assets.lib.delta import read as delta_read

        monkeypatch.setattr(delta_read, "is_small", lambda rows: False)
    return request.param


def _materialized(instance, asset: str, **metadata) -> None:
    instance.report_runless_asset_event(AssetMaterialization(asset, metadata=metadata))


def test_filtered_events_checks_read_the_latest_insert_and_catch_a_foreign_duplicate_and_an_uncapped_event(
    spark, spark_resource, warehouse, read_size
):
    """Session S1 starts on 1 March at 00:00 (max_session_days 3); events e1, e2 are inside it. S0
    started on 20 February, before any session the check reads while the rows it meets pass."""
    uri = f"{warehouse}/filtered_events"
    schema = "event_id string, session_identifier string, load_tstamp timestamp, event_date date"
    lifecycle = frame(spark, LIFECYCLE + ", start_date date", [
        ("S1", "u", datetime(2024, 3, 1), datetime(2024, 3, 2), date(2024, 3, 1)),
        ("S0", "u", datetime(2024, 2, 20), datetime(2024, 2, 21), date(2024, 2, 20)),
    ])
    write(spark, lifecycle, WriteRequest(f"{warehouse}/{LIFECYCLE_NAME}", WriteMode.UPSERT, [T.SESSION], ["start_date"]))
    create_with_change_feed(spark, uri, spark.createDataFrame([], schema).schema, ["event_date"])
    old = frame(spark, schema, [("e1", "S1", datetime(2024, 3, 1, 1), date(2024, 3, 1)), ("e2", "S1", datetime(2024, 3, 1, 2), date(2024, 3, 1))])
    first = write(spark, old, WriteRequest(uri, WriteMode.MERGE_INSERT, ["event_id"], ["event_date"]))
    instance = DagsterInstance.ephemeral()
    context = build_op_context(instance=instance)
    assert all(r.passed for r in _checked(context, spark_resource).values())  # nothing materialized yet: nothing read

    _materialized(instance, FILTERED_EVENTS, rows_inserted=2, delta_version=first.version, **{"dagster/uri": uri})
    assert all(r.passed for r in _checked(context, spark_resource).values())

    # An event at its session's cap, the earliest its write inserted: the sessions read start from
    # the cap (and a day) before it, S1 among them, so it passes on that read alone.
    edge = frame(spark, schema, [("e_edge", "S1", datetime(2024, 3, 4), date(2024, 3, 4))])
    edged = write(spark, edge, WriteRequest(uri, WriteMode.MERGE_INSERT, ["event_id"], ["event_date"]))
    _materialized(instance, FILTERED_EVENTS, rows_inserted=1, delta_version=edged.version, **{"dagster/uri": uri})
    capped = _checked(context, spark_resource)["events_within_session_cap"]
    assert capped.passed and capped.metadata["checked"].value == (
        f"rows inserted by version {edged.version}, against the sessions started from 2024-02-29 on")

    # Another writer appends a second copy of e2 into its day, an event of S1 a second past its
    # cap and one of S0 days past its cap (plain Spark, no MERGE): the next checks catch them, and
    # name them, each beside its session's start as the whole manifest holds it.
    foreign_rows = [("e2", "S1", datetime(2024, 3, 1, 3), date(2024, 3, 1)), ("e3", "S1", datetime(2024, 3, 4, 0, 0, 1), date(2024, 3, 4)),
                    ("e4", "S0", datetime(2024, 3, 1, 3), date(2024, 3, 1))]
    foreign = write(spark, frame(spark, schema, foreign_rows), WriteRequest(uri, WriteMode.APPEND, partition_by=["event_date"]))
    _materialized(
        instance, FILTERED_EVENTS, rows_inserted=3, delta_version=foreign.version, merge_target_floor="2024-02-01",
        **{"dagster/uri": uri},
    )
    results = _checked(context, spark_resource)
    unique, capped = results["event_id_unique"], results["events_within_session_cap"]
    assert not unique.passed and unique.metadata["examples"].value == [{"event_id": "e2", "count": "2"}]
    # The days that write added files to (1 and 4 March), read from its commit in the log.
    assert unique.metadata["checked"].value == f"every id in the 2 day(s) version {foreign.version} inserted into"
    assert not capped.passed and sorted((e["event_id"], e["session_start"]) for e in capped.metadata["examples"].value) == [
        ("e3", "2024-03-01 00:00:00"), ("e4", "2024-02-20 00:00:00")]
    assert capped.metadata["checked"].value.endswith("against the sessions started on any day")

    # A write that changed nothing passes without reading (the quiet hour's cost).
    _materialized(instance, FILTERED_EVENTS, rows_inserted=0, delta_version=foreign.version, **{"dagster/uri": uri})
    assert all(r.metadata["checked"].value.startswith("nothing") for r in _checked(context, spark_resource).values())


def _checked(context, spark_resource) -> dict:
    settings = IncrementalSettings(session_timestamp="load_tstamp")
    return {
        "event_id_unique": event_id_unique(context, spark=spark_resource),
        "events_within_session_cap": events_within_session_cap(context, spark=spark_resource, settings=settings),
    }


def test_lifecycle_check_reads_from_the_write_floor_on(spark, spark_resource, warehouse, read_size):
    uri = f"{warehouse}/sessions_lifecycle_manifest"
    rows = frame(spark, LIFECYCLE + ", start_date date", [
        ("old_bad", "u", _t("01 00:00"), _t("09 00:00"), date(2021, 1, 1)),   # before the floor: not read
        ("new_bad", "u", _t("10 00:00"), _t("09 00:00"), date(2021, 1, 10)),
    ])
    written = write(spark, rows, WriteRequest(uri, WriteMode.UPSERT, [T.SESSION], ["start_date"]))
    instance = DagsterInstance.ephemeral()
    _materialized(
        instance, LIFECYCLE_NAME, rows_inserted=2, delta_version=written.version, merge_target_floor="2021-01-05",
        **{"dagster/uri": uri},
    )
    result = sessions_unique_and_within_cap(build_op_context(instance=instance), spark=spark_resource, settings=IncrementalSettings())
    assert not result.passed
    assert [e["session_identifier"] for e in result.metadata["examples"].value] == ["new_bad"]


@pytest.mark.parametrize("hours, fresh", [(1.0, True), (1e-9, False)])
def test_freshness_checks_take_their_thresholds_from_the_settings(hours, fresh):
    """Just materialized: fresh within an hour, stale with a threshold of a few microseconds."""

    @asset(name=FILTERED_EVENTS)
    def stub_events():
        return 1

    @asset(name=DAILY_AGGREGATES)
    def stub_daily():
        return 1

    settings = IncrementalSettings(filtered_events_fresh_hours=hours, daily_aggregates_fresh_hours=hours)
    result = materialize([stub_events, stub_daily, *freshness_checks(settings)], instance=DagsterInstance.ephemeral())
    evaluations = {e.asset_key.path[-1]: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == {FILTERED_EVENTS: fresh, DAILY_AGGREGATES: fresh}


def _advanced_to(state: StateStore, model: str, batch_max: datetime) -> None:
    limits = RunLimits(RunState.STANDARD, batch_max - timedelta(hours=6), batch_max, batch_max)
    state.save_entry(Cursor(model, state.entries().get(model), BatchStats(limits, 1, batch_max, None)).advanced(), "run")


def test_manifest_consistency_fails_once_a_position_is_past_the_stored_data(spark, warehouse):
    """Sessions end at 2 March 10:00 at the latest: a manifest at that moment agrees, one a second later does not."""
    state = StateStore()
    assert manifest_consistent_with_tables(state=state).passed  # nothing stored, nothing claimed

    latest_end = datetime(2024, 3, 2, 10, 0, 0, 500)  # Delta's statistics keep 10:00:00.000 of it
    lifecycle = frame(spark, LIFECYCLE + ", start_date date", [
        ("S1", "u", datetime(2024, 3, 1), datetime(2024, 3, 1, 5), date(2024, 3, 1)),
        ("S2", "u", datetime(2024, 3, 2), latest_end, date(2024, 3, 2)),
    ])
    write(spark, lifecycle, WriteRequest(f"{warehouse}/{LIFECYCLE_NAME}", WriteMode.UPSERT, [T.SESSION], ["start_date"]))
    _advanced_to(state, FILTERED_EVENTS, latest_end)
    _advanced_to(state, "sessions", datetime(2024, 3, 1, 5))
    clean = manifest_consistent_with_tables(state=state)
    assert clean.passed and clean.metadata["greatest_cursor_value_stored"].value == "2024-03-02 10:00:00"

    _advanced_to(state, "sessions", latest_end + timedelta(milliseconds=1))  # a position no stored event backs
    result = manifest_consistent_with_tables(state=state)
    assert not result.passed and result.severity == AssetCheckSeverity.ERROR
    assert result.metadata["ahead_of_the_tables"].value == [{"model": "sessions", "last_success": "2024-03-02 10:00:00.001500"}]


def test_stored_max_reads_the_statistics_or_else_the_column(spark, warehouse):
    uri = f"{warehouse}/times"
    rows = frame(spark, "t timestamp, day date", [(datetime(2024, 1, 1), date(2024, 1, 1)), (datetime(2024, 1, 3), date(2024, 1, 3))])
    write(spark, rows, WriteRequest(uri, WriteMode.APPEND, partition_by=["day"]))
    assert stored_max(uri, "t").replace(tzinfo=None) == datetime(2024, 1, 3)
    # A table that keeps no statistics: the column itself is read.
    bare = f"{warehouse}/bare"
    write(spark, rows, WriteRequest(bare, WriteMode.APPEND, properties={"delta.dataSkippingNumIndexedCols": "0"}))
    assert stored_max(bare, "t").replace(tzinfo=None) == datetime(2024, 1, 3)
    assert stored_max(f"{warehouse}/none", "t") is None


def test_daily_reconcile_fails_when_the_stored_aggregates_disagree_with_filtered_events(spark, spark_resource, warehouse, read_size):
    """The check inside daily_aggregates reads back what is stored for the run's days: here a table
    planted before (invoked directly, no IO manager writes), 3 events on 1 March against the 2 that
    filtered_events holds (as its log counts them)."""
    from dagster import build_asset_context

    from incremental_assets.defs.daily.aggregates import build_daily_assets

    settings = IncrementalSettings(start_date="2024-03-01", attributes=[])
    events = frame(spark, "event_id string, user_identifier string, event_date date, derived_tstamp timestamp", [
        ("e1", "u1", date(2024, 3, 1), datetime(2024, 3, 1, 1)), ("e2", "u2", date(2024, 3, 1), datetime(2024, 3, 1, 2)),
    ])
    write(spark, events, WriteRequest(f"{warehouse}/{FILTERED_EVENTS}", WriteMode.APPEND, partition_by=["event_date"]))
    daily = build_daily_assets(date(2024, 3, 1))
    built_under(settings)

    def reconcile(stored_counts):
        rows = spark.createDataFrame(stored_counts, "attribute_key string, event_date date, events long")
        write(spark, rows, WriteRequest(f"{warehouse}/{DAILY_AGGREGATES}", WriteMode.REPLACE))
        outputs = list(daily(build_asset_context(partition_key="2024-03-01"), filtered_events=Stored(lambda: events),
                             settings=settings, state=StateStore(), spark=spark_resource))
        return outputs[-1]

    clean = reconcile([("u1", date(2024, 3, 1), 1), ("u2", date(2024, 3, 1), 1)])
    assert clean.passed
    corrupted = reconcile([("u1", date(2024, 3, 1), 2), ("u2", date(2024, 3, 1), 1)])
    assert not corrupted.passed
    assert corrupted.metadata["examples"].value == [{"event_date": "2024-03-01", "aggregated": "3", "filtered_events": "2"}]


def test_one_row_per_attribute_key_fails_on_a_key_stored_twice(spark, spark_resource, warehouse, read_size):
    from incremental_assets.defs.daily.aggregates import one_row_per_attribute_key

    uri = f"{warehouse}/attributes"
    instance = DagsterInstance.ephemeral()
    for rows in ([("u1",), ("u2",)], [("u1",)]):  # the second write, a foreign append, repeats u1
        written = write(spark, spark.createDataFrame(rows, "attribute_key string"), WriteRequest(uri, WriteMode.APPEND))
        _materialized(instance, "attributes", rows_inserted=len(rows), delta_version=written.version, **{"dagster/uri": uri})
        result = one_row_per_attribute_key(build_op_context(instance=instance), spark=spark_resource)
        assert result.passed == (rows != [("u1",)])
    assert result.metadata["examples"].value == [{"attribute_key": "u1", "count": "2"}]


# What a check reads of what a step has just committed: small reads through deltalake's Arrow,
# larger ones through Spark's Delta reader; the same rows either way.

def _plan(frame) -> str:
    return frame._jdf.queryExecution().analyzed().toString()


def test_a_checks_read_is_deltalakes_when_small_sparks_beyond_and_the_same_rows_either_way(spark, warehouse, monkeypatch):
    from incremental_assets.lib.delta import read as delta_read
    from incremental_assets.lib.delta.read import read_just_written

    uri = f"{warehouse}/lifecycle"
    rows = frame(spark, "session_identifier string, start_tstamp timestamp, start_date date, n long", [
        ("s1", datetime(2024, 3, 1, 23, 30), date(2024, 3, 1), 1), ("s2", datetime(2024, 3, 2, 0, 30), date(2024, 3, 2), 2),
        ("s4", datetime(2024, 3, 2, 1), date(2024, 3, 2), None),
        ("s3", datetime(2024, 3, 3, 12), date(2024, 3, 3), 3), (None, datetime(2024, 3, 3, 13), date(2024, 3, 3), 5),
    ])
    write(spark, rows, WriteRequest(uri, WriteMode.APPEND, partition_by=["start_date"]))
    since = [("start_date", ">=", date(2024, 3, 2)), ("n", "<", 3)]  # a partition, then a column the files bound
    named = [("start_date", ">=", date(2024, 3, 2)), ("session_identifier", "in", ["s2", "s3", "s9", None])]  # keys by name
    small = [read_just_written(spark, uri, ["session_identifier", "start_tstamp"], kept) for kept in (since, named)]
    assert "parquet" not in _plan(small[0]), _plan(small[0])  # the rows deltalake read, handed over as Arrow
    # Four rows from 2 March on are not few here; the two named are: scanned batch by batch in Arrow.
    monkeypatch.setattr(delta_read, "is_small", lambda rows: rows is not None and rows < 3)
    scanned = read_just_written(spark, uri, ["session_identifier", "start_tstamp"], named)
    assert "parquet" not in _plan(scanned), _plan(scanned)
    monkeypatch.setattr(delta_read, "is_small", lambda rows: False)
    beyond = [read_just_written(spark, uri, ["session_identifier", "start_tstamp"], kept) for kept in (since, named)]
    assert all("parquet" in _plan(read) for read in beyond), _plan(beyond[1])  # Spark's scan of the table's files
    assert small[0].schema == beyond[0].schema and scanned.schema == beyond[1].schema
    assert small[0].collect() == beyond[0].collect() == [("s2", datetime(2024, 3, 2, 0, 30))]
    assert sorted(small[1].collect()) == sorted(scanned.collect()) == sorted(beyond[1].collect()) == [
        ("s2", datetime(2024, 3, 2, 0, 30)), ("s3", datetime(2024, 3, 3, 12))]


@pytest.mark.parametrize("engine", ["deltalake", "spark"])
def test_the_rows_a_commit_inserted_read_alike_from_deltalakes_change_feed_and_sparks(spark, warehouse, monkeypatch, engine):
    """inserted_as_read (deltalake's change feed, in Arrow) against Spark's (inserted_rows), for
    each commit a step or another writer makes into a partitioned table with a change feed, written
    by either engine: an insert-only MERGE of new ids, one of an id held already and a new one, a
    foreign append of a copy, and a MERGE of ids all held; and a delete, which inserts nothing."""
    from deltalake import DeltaTable

    from incremental_assets.lib.delta.log import rows_added
    from incremental_assets.lib.delta.read import inserted_rows, inserted_as_read
    from incremental_assets.lib.environment import WRITE_ENGINE_ENV

    if engine == "spark":
        monkeypatch.setenv(WRITE_ENGINE_ENV, "spark")
    uri, columns = f"{warehouse}/filtered_events", ["event_id", "session_identifier", "load_tstamp"]
    schema = "event_id string, session_identifier string, load_tstamp timestamp, event_date date"
    create_with_change_feed(spark, uri, spark.createDataFrame([], schema).schema, ["event_date"])
    merge, by_deltalake = WriteMode.MERGE_INSERT, []
    for mode, rows in (
        (merge, [("e1", "S1", datetime(2024, 3, 1, 1), date(2024, 3, 1)), ("e2", None, datetime(2024, 3, 2, 0, 0, 0, 1), date(2024, 3, 2))]),
        (merge, [("e2", "S1", datetime(2024, 3, 2, 5), date(2024, 3, 2)), ("e3", "S2", datetime(2024, 3, 3, 23, 59), date(2024, 3, 3))]),
        (WriteMode.APPEND, [("e2", "S3", datetime(2024, 3, 1, 2), date(2024, 3, 1))]),
        (merge, [("e1", "S1", datetime(2024, 3, 1, 1), date(2024, 3, 1))]),
    ):
        request = WriteRequest(uri, mode, ["event_id"] if mode == merge else [], ["event_date"], rows_at_most=len(rows))
        written = write(spark, frame(spark, schema, rows), request)
        in_arrow = inserted_as_read(spark, uri, written.version, columns, len(rows))
        assert isinstance(in_arrow, pa.Table)
        assert found_rows(in_arrow) == found_rows(inserted_rows(spark, uri, written.version).select(*columns)), (mode, rows)
        by_deltalake.append(DeltaTable(uri).history(1)[0].get("engineInfo", "").startswith("delta-rs"))
    assert any(by_deltalake) == (engine == "deltalake"), by_deltalake  # a first MERGE into no rows is Spark's either way
    DeltaTable(uri).delete("event_id = 'e3'")  # an erasure's delete: its change feed holds the row deleted, no insert
    erased = DeltaTable(uri).version()
    assert found_rows(inserted_as_read(spark, uri, erased, columns, 1)) == found_rows(inserted_rows(spark, uri, erased).select(*columns)) == []
    assert isinstance(inserted_as_read(spark, uri, written.version, columns, None), DataFrame)  # not counted: Spark's
    # What the daily manifest reads: every commit's inserts since one it counted, bounded by the rows they added.
    for first in range(1, erased + 1):
        bound = rows_added(uri, first, erased)
        in_arrow = inserted_as_read(spark, uri, first, columns, bound, erased)
        assert isinstance(in_arrow, pa.Table) and bound >= in_arrow.num_rows, first
        assert found_rows(in_arrow) == found_rows(inserted_rows(spark, uri, first, erased).select(*columns)), first


def test_rows_read_in_arrow_reach_spark_whole_past_a_batch_of_none(spark):
    """pyspark (4.0.1) drops the batches after one of no rows: a file whose rows an Arrow filter all
    left out. Found when a check's read named its keys: its rows went missing and it passed."""
    from incremental_assets.lib.delta.arrow import to_spark

    kind = pa.schema([("k", pa.string())])
    rows = pa.Table.from_batches([pa.record_batch([pa.array(keys, pa.string())], schema=kind) for keys in (["a"], [], ["b", "c"], [])])
    schema = StructType([StructField("k", StringType())])
    assert sorted(row.k for row in to_spark(spark, rows, schema).collect()) == ["a", "b", "c"]
    assert to_spark(spark, rows.slice(1, 0), schema).collect() == []


def test_a_filter_the_read_cannot_give_spark_is_refused_on_the_small_path_too(spark, warehouse):
    """Refused before the size decides the path: a small table must not hide what a large one refuses."""
    from incremental_assets.lib.delta.read import read_just_written

    uri = f"{warehouse}/few"
    write(spark, frame(spark, "id string, day date", [("a", date(2024, 3, 1))]), WriteRequest(uri, WriteMode.APPEND, partition_by=["day"]))
    with pytest.raises(ValueError, match=r"no filter \['='\]"):
        read_just_written(spark, uri, ["id"], [("day", "=", date(2024, 3, 1))])


def test_a_checks_small_read_keeps_the_instants_under_a_session_zone_other_than_utc(spark, warehouse):
    """A session set to another zone (a notebook's, say): the rows handed over as Arrow are the same
    instants Spark's Delta reader gives, and a day taken from them is that zone's day for both."""
    from incremental_assets.lib.delta.read import read_just_written, read_table

    uri = f"{warehouse}/events"
    rows = frame(spark, "event_id string, at timestamp", [("e1", datetime(2024, 3, 1, 23, 30)), ("e2", datetime(2024, 3, 2, 4, 30))])
    write(spark, rows, WriteRequest(uri, WriteMode.APPEND))
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        def days(read):
            return sorted((r.event_id, r.at, r.day) for r in read.select("event_id", "at", F.to_date("at").alias("day")).collect())

        by_spark = days(read_table(spark, uri))
        assert days(read_just_written(spark, uri, ["event_id", "at"])) == by_spark
        assert [day for _, _, day in by_spark] == [date(2024, 3, 1), date(2024, 3, 1)]  # 18:30 and 23:30 in New York
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
