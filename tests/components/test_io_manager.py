"""The Delta IO manager on real Delta tables: every write mode, twice, and the refusals; an
ordinary asset's values (pandas, Arrow, anything picklable)."""


import pickle
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from dagster import (
    AssetExecutionContext,
    AssetIn,
    DagsterInstance,
    DailyPartitionsDefinition,
    asset,
    materialize,
)
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.delta.io_manager import DeltaIOManager
from incremental_assets.lib.delta.log import UnreadableTableError, table_exists, table_version
from incremental_assets.lib.delta.read import inserted_rows, read_table
from incremental_assets.lib.delta.spec import DeltaWriteError, Rows, Window, WriteMode, delta_table
from incremental_assets.lib.delta.write import NO_COMMIT, Txn, WriteRequest, create_with_change_feed, last_commit, write

DAILY = DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-02-01")


def _rows(spark, uri, *columns):
    return sorted(tuple(r) for r in read_table(spark, uri).select(*columns).collect())


def _io(spark_resource, warehouse):
    return DeltaIOManager(spark=spark_resource, warehouse_root=warehouse)


def _run(spark_resource, warehouse, assets, instance=None, **kwargs):
    result = materialize(
        assets,
        resources={"spark": spark_resource, "io_manager": _io(spark_resource, warehouse)},
        instance=instance,
        **kwargs,
    )
    assert result.success
    return result


def _metadata(result, name):
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[-1] == name]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def _keyed_asset(spark, mode, rows):
    @asset(name="keyed", metadata=delta_table(mode, keys=["id"]))
    def keyed():
        return spark.createDataFrame(rows, "id int, value string")

    return keyed


def test_replace_twice_is_idempotent(spark, spark_resource, warehouse):
    @asset(metadata=delta_table("replace"))
    def whole():
        return spark.createDataFrame([(1, "a"), (2, "b")], "id int, value string")

    first = _metadata(_run(spark_resource, warehouse, [whole]), "whole")
    second = _metadata(_run(spark_resource, warehouse, [whole]), "whole")
    uri = f"{warehouse}/whole"
    assert _rows(spark, uri, "id", "value") == [(1, "a"), (2, "b")]
    assert (first["dagster/row_count"], second["dagster/row_count"]) == (2, 2)
    assert second["delta_version"] == first["delta_version"] + 1
    assert [c.name for c in second["dagster/column_schema"].columns] == ["id", "value"]
    assert second["dagster/uri"] == uri


def test_append_adds_each_time(spark, spark_resource, warehouse):
    @asset(metadata=delta_table("append"))
    def log():
        return spark.createDataFrame([(1,)], "id int")

    _run(spark_resource, warehouse, [log])
    meta = _metadata(_run(spark_resource, warehouse, [log]), "log")
    assert _rows(spark, f"{warehouse}/log", "id") == [(1,), (1,)]
    assert meta["rows_inserted"] == 1 and meta["dagster/row_count"] == 2


def test_an_append_of_no_row_says_it_committed_nothing(spark, spark_resource, warehouse):
    """Delta commits no append of an empty frame: the write's metadata must not be the last commit's."""
    frames = [spark.createDataFrame([(1,), (2,)], "id int"), spark.createDataFrame([], "id int")]

    @asset(metadata=delta_table("append"))
    def log():
        return frames.pop(0)

    first = _metadata(_run(spark_resource, warehouse, [log]), "log")
    second = _metadata(_run(spark_resource, warehouse, [log]), "log")
    assert first["rows_inserted"] == 2 and second["rows_inserted"] == 0
    assert second["delta_version"] == first["delta_version"] and second["write_mode_operation"] == NO_COMMIT
    assert _rows(spark, f"{warehouse}/log", "id") == [(1,), (2,)]


def test_merge_insert_never_overwrites_or_duplicates(spark, spark_resource, warehouse):
    _run(spark_resource, warehouse, [_keyed_asset(spark, "merge_insert", [(1, "old"), (2, "old")])])
    later = _keyed_asset(spark, "merge_insert", [(2, "new"), (3, "new"), (3, "new")])
    meta = _metadata(_run(spark_resource, warehouse, [later]), "keyed")
    again = _metadata(_run(spark_resource, warehouse, [later]), "keyed")
    assert _rows(spark, f"{warehouse}/keyed", "id", "value") == [(1, "old"), (2, "old"), (3, "new")]
    assert (meta["rows_inserted"], meta["rows_updated"]) == (1, 0)
    assert (again["rows_inserted"], again["dagster/row_count"]) == (0, 3)


def test_upsert_updates_and_inserts(spark, spark_resource, warehouse):
    _run(spark_resource, warehouse, [_keyed_asset(spark, "upsert", [(1, "old"), (2, "old")])])
    later = _keyed_asset(spark, "upsert", [(2, "new"), (3, "new")])
    meta = _metadata(_run(spark_resource, warehouse, [later]), "keyed")
    _run(spark_resource, warehouse, [later])
    assert _rows(spark, f"{warehouse}/keyed", "id", "value") == [(1, "old"), (2, "new"), (3, "new")]
    assert (meta["rows_inserted"], meta["rows_updated"]) == (1, 1)


def test_upsert_refuses_duplicate_keys_and_writes_nothing(spark, spark_resource, warehouse):
    _run(spark_resource, warehouse, [_keyed_asset(spark, "upsert", [(1, "old")])])
    clash = _keyed_asset(spark, "upsert", [(1, "x"), (1, "y")])
    with pytest.raises(DeltaWriteError, match="several rows share the key"):
        materialize([clash], resources={"io_manager": _io(spark_resource, warehouse)})
    assert _rows(spark, f"{warehouse}/keyed", "id", "value") == [(1, "old")]


def _daily_asset(spark, rows_per_day=None):
    """Two rows per day of the run's window (or rows_per_day[day]), dated by event_date."""

    @asset(
        name="daily",
        partitions_def=DAILY,
        metadata=delta_table("replace_partition", partition_by=["event_date"], partition_column="event_date"),
    )
    def daily(context: AssetExecutionContext):
        window = context.partition_time_window
        days = spark.range((window.end - window.start).days).select(
            F.date_add(F.lit(window.start.date()), F.col("id").cast("int")).alias("event_date")
        )
        per_day = F.lit(2)
        if rows_per_day:
            per_day = F.coalesce(
                *[F.when(F.col("event_date") == F.lit(d), F.lit(n)) for d, n in rows_per_day.items()], F.lit(2)
            )
        return days.withColumn("n", F.explode(F.sequence(F.lit(1), per_day))).withColumn(
            "run", F.lit(context.run.run_id)
        )

    return daily


def test_range_write_then_one_day_rewrite(spark, spark_resource, warehouse):
    instance = DagsterInstance.ephemeral()
    uri = f"{warehouse}/daily"
    tags = {"dagster/asset_partition_range_start": "2024-01-01", "dagster/asset_partition_range_end": "2024-01-05"}
    result = _run(spark_resource, warehouse, [_daily_asset(spark, {date(2024, 1, 3): 5})], instance, tags=tags)
    assert last_commit(uri).version == 0  # five days, one write
    events = result.get_asset_materialization_events()
    counts = {e.materialization.partition: e.materialization.metadata["dagster/row_count"].value for e in events}
    assert counts == {"2024-01-01": 2, "2024-01-02": 2, "2024-01-03": 5, "2024-01-04": 2, "2024-01-05": 2}

    rewrite = _daily_asset(spark, {date(2024, 1, 2): 3})
    meta = _metadata(_run(spark_resource, warehouse, [rewrite], instance, partition_key="2024-01-02"), "daily")
    assert meta["dagster/row_count"] == 3
    again = _metadata(_run(spark_resource, warehouse, [rewrite], instance, partition_key="2024-01-02"), "daily")
    assert again["dagster/row_count"] == 3
    table = read_table(spark, uri).groupBy("event_date").count().collect()
    assert {str(r.event_date): r["count"] for r in table} == {
        "2024-01-01": 2, "2024-01-02": 3, "2024-01-03": 5, "2024-01-04": 2, "2024-01-05": 2
    }


@pytest.mark.parametrize("kind", [DataFrame, pd.DataFrame], ids=["spark", "pandas"])
def test_partitioned_input_is_filtered_to_its_window(spark, spark_resource, warehouse, kind):
    tags = {"dagster/asset_partition_range_start": "2024-01-01", "dagster/asset_partition_range_end": "2024-01-03"}
    _run(spark_resource, warehouse, [_daily_asset(spark)], tags=tags)
    seen = {}

    @asset(partitions_def=DAILY, ins={"daily": AssetIn()})
    def downstream(daily: kind):
        days = daily["event_date"] if kind is pd.DataFrame else [r.event_date for r in daily.select("event_date").collect()]
        seen["days"] = sorted({str(day) for day in days})

    materialize(
        [downstream, _daily_asset(spark).to_source_asset()],
        resources={"io_manager": _io(spark_resource, warehouse)},
        partition_key="2024-01-02",
    )
    assert seen["days"] == ["2024-01-02"]


def test_refuses_whole_table_overwrite_from_a_partitioned_asset(spark, spark_resource, warehouse):
    _run(spark_resource, warehouse, [_daily_asset(spark)], partition_key="2024-01-01")

    @asset(name="daily", partitions_def=DAILY, metadata=delta_table("replace"))
    def daily():
        return spark.createDataFrame([(date(2024, 1, 1),)], "event_date date")

    with pytest.raises(DeltaWriteError, match="Refusing to overwrite all of"):
        materialize([daily], resources={"io_manager": _io(spark_resource, warehouse)}, partition_key="2024-01-01")
    assert last_commit(f"{warehouse}/daily").version == 0


@pytest.mark.parametrize(
    "schema, row, message",
    [
        ("day date", (date(2024, 1, 1),), r"lacks column\(s\) \['event_date'\]"),
        ("event_date string", ("2024-01-01",), "must be a date or timestamp, not string"),
    ],
)
def test_bad_partition_column_fails_loudly(spark, spark_resource, warehouse, schema, row, message):
    @asset(name="daily", partitions_def=DAILY, metadata=delta_table("replace_partition", partition_column="event_date"))
    def daily():
        return spark.createDataFrame([row], schema)

    with pytest.raises(DeltaWriteError, match=message):
        materialize([daily], resources={"io_manager": _io(spark_resource, warehouse)}, partition_key="2024-01-01")
    assert not table_exists(f"{warehouse}/daily")


def test_rows_outside_the_window_are_refused(spark, spark_resource, warehouse):
    @asset(name="daily", partitions_def=DAILY, metadata=delta_table("replace_partition", partition_column="event_date"))
    def daily():
        return spark.createDataFrame([(date(2024, 1, 9), 1)], "event_date date, n int")

    _run(spark_resource, warehouse, [_daily_asset(spark)], partition_key="2024-01-01")
    with pytest.raises(Exception, match="(?i)replaceWhere|does not conform|predicate"):
        materialize([daily], resources={"io_manager": _io(spark_resource, warehouse)}, partition_key="2024-01-01")
    assert last_commit(f"{warehouse}/daily").version == 0


def test_declaring_a_keyed_mode_without_keys_fails_at_definition():
    with pytest.raises(DeltaWriteError, match="needs key columns"):
        delta_table("upsert")
    with pytest.raises(DeltaWriteError, match="needs partition_column"):
        delta_table("replace_partition")


@pytest.mark.parametrize("mode", ["merge_insert", "upsert", "append"])
def test_a_write_repeated_with_its_transaction_id_changes_nothing(spark, warehouse, mode):
    """What makes re-executing a step whose write committed a no-op (Delta's own idempotency)."""
    uri = f"{warehouse}/keyed"
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id int, value string")
    write(spark, rows, WriteRequest(uri, WriteMode(mode), keys=["id"], txn=Txn("run-1")))
    later = spark.createDataFrame([(2, "changed"), (3, "c")], "id int, value string")
    first = write(spark, later, WriteRequest(uri, WriteMode(mode), keys=["id"], txn=Txn("run-2")))
    again = write(spark, later, WriteRequest(uri, WriteMode(mode), keys=["id"], txn=Txn("run-2")))
    assert not first.skipped and again.skipped and again.version == first.version
    assert table_version(uri) == first.version
    expected = {"merge_insert": 3, "upsert": 3, "append": 4}[mode]
    assert read_table(spark, uri).count() == expected


def test_a_merge_with_nothing_stored_in_its_scope_appends_and_the_change_feed_sees_the_rows(spark, warehouse):
    """What a first backfill does to filtered_events: created empty with its change feed, then
    written. An append inserts exactly what the MERGE would, without its join."""
    uri = f"{warehouse}/by_day"
    schema = "id int, d date"
    create_with_change_feed(spark, uri, spark.createDataFrame([], schema).schema, ["d"])
    first = spark.createDataFrame([(1, date(2024, 1, 1)), (2, date(2024, 1, 2))], schema)
    created = write(spark, first, WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"], merge_floor=("d", date(2024, 1, 1))))
    assert created.operation == "WRITE" and created.rows_inserted == 2
    assert sorted(r.id for r in inserted_rows(spark, uri, created.version).collect()) == [1, 2]

    # Stored rows from the floor on: a real MERGE, so the stored key 2 is not inserted again.
    later = spark.createDataFrame([(2, date(2024, 1, 2)), (3, date(2024, 1, 3))], schema)
    merged = write(spark, later, WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"], merge_floor=("d", date(2024, 1, 2))))
    assert merged.operation == "MERGE" and merged.rows_inserted == 1

    # Nothing stored from the floor on: the MERGE would read no file, so the rows are appended.
    after_gap = spark.createDataFrame([(4, date(2024, 3, 1))], schema)
    appended = write(spark, after_gap, WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"], merge_floor=("d", date(2024, 2, 1))))
    assert appended.operation == "WRITE" and appended.rows_inserted == 1
    assert _rows(spark, uri, "id") == [(1,), (2,), (3,), (4,)]
    assert [r.id for r in inserted_rows(spark, uri, appended.version).collect()] == [4]


@pytest.mark.parametrize("bound", [None, 10], ids=["spark", "deltalake"])
def test_a_merge_floor_on_a_column_the_stored_table_is_not_partitioned_by_reads_the_whole_table(spark, warehouse, bound):
    """A table created before its asset declared a partition column (sessions, unpartitioned until
    it was partitioned by start_date): its stored rows have no value there, so a floor on it would
    match none of them and insert every key again. The MERGE reads the whole table instead."""
    uri = f"{warehouse}/created_unpartitioned"
    stored = spark.createDataFrame([(1, "old"), (2, "old")], "id int, value string")
    write(spark, stored, WriteRequest(uri, WriteMode.UPSERT, ["id"]))
    later = spark.createDataFrame([(2, "new", date(2024, 1, 2)), (3, "new", date(2024, 1, 3))], "id int, value string, d date")
    result = write(spark, later, WriteRequest(uri, WriteMode.UPSERT, ["id"], ["d"], merge_floor=("d", date(2024, 1, 2)), rows_at_most=bound))
    assert (result.rows_inserted, result.rows_updated) == (1, 1)
    assert _rows(spark, uri, "id", "value", "d") == [(1, "old", None), (2, "new", date(2024, 1, 2)), (3, "new", date(2024, 1, 3))]


@pytest.mark.parametrize("bound", [None, 10], ids=["spark", "deltalake"])
def test_a_row_without_a_partition_value_stays_in_every_pruned_merge(spark, warehouse, bound):
    """A session whose events have no time has no start day: its row sits in the null partition,
    which no floor excludes, so the next upsert updates it instead of storing it twice (also when
    it is the only stored row, where a MERGE with nothing in scope would append)."""
    schema = "id int, value string, d date"
    for stored_rows in ([(1, "old", None)], [(1, "old", None), (2, "old", date(2024, 1, 1))]):
        uri = f"{warehouse}/undated-{len(stored_rows)}"
        write(spark, spark.createDataFrame(stored_rows, schema), WriteRequest(uri, WriteMode.UPSERT, ["id"], ["d"]))
        later = spark.createDataFrame([(1, "new", None), (3, "new", date(2024, 1, 3))], schema)
        result = write(spark, later, WriteRequest(uri, WriteMode.UPSERT, ["id"], ["d"], merge_floor=("d", date(2024, 1, 2)), rows_at_most=bound))
        assert (result.operation, result.rows_inserted, result.rows_updated) == ("MERGE", 1, 1)
        assert _rows(spark, uri, "id", "value") == [(1, "new"), *[(2, "old")][: len(stored_rows) - 1], (3, "new")]


def test_statistics_are_kept_only_for_the_declared_columns(spark, spark_resource, warehouse):
    """Delta's per-file statistics cost a third of a write: a table keeps the ones its readers use."""

    @asset(metadata=delta_table("replace", stats_columns=[]))
    def scratch():
        return spark.createDataFrame([(1, "a")], "id int, value string")

    @asset(metadata=delta_table("merge_insert", keys=["id"], change_feed=True, stats_columns=["value", "absent"]))
    def kept():
        return spark.createDataFrame([(1, "a")], "id int, value string")

    _run(spark_resource, warehouse, [scratch, kept])
    files = {name: pa.table(DeltaTable(f"{warehouse}/{name}").get_add_actions(flatten=True)) for name in ("scratch", "kept")}
    assert not [c for c in files["scratch"].column_names if c.startswith(("min.", "max."))]
    assert [c for c in files["kept"].column_names if c.startswith(("min.", "max."))] == ["min.value", "max.value"]
    assert files["kept"].column("min.value").to_pylist() == ["a"]


@pytest.mark.parametrize("mode", ["merge_insert", "upsert"])
def test_a_small_merge_by_deltalake_leaves_what_sparks_merge_leaves(spark, warehouse, mode):
    """rows_at_most under SMALL_MERGE_ROWS: the same rows, metrics and transaction rule, without Spark's MERGE."""
    stored = spark.createDataFrame([(1, "old", date(2024, 1, 1)), (2, "old", date(2024, 1, 2))], "id int, value string, d date")
    later = spark.createDataFrame(
        [(2, "new", date(2024, 1, 2)), (3, "new", date(2024, 1, 3))] + ([(3, "new", date(2024, 1, 3))] if mode == "merge_insert" else []),
        "id int, value string, d date",
    )
    results = {}
    for engine, bound in (("spark", None), ("deltalake", 10)):
        uri = f"{warehouse}/{engine}"
        write(spark, stored, WriteRequest(uri, WriteMode(mode), ["id"], ["d"]))
        result = write(spark, later, WriteRequest(uri, WriteMode(mode), ["id"], ["d"], merge_floor=("d", date(2024, 1, 2)), txn=Txn("run-2"), rows_at_most=bound))
        again = write(spark, later, WriteRequest(uri, WriteMode(mode), ["id"], ["d"], txn=Txn("run-2"), rows_at_most=bound))
        assert again.skipped and table_version(uri) == result.version
        results[engine] = (_rows(spark, uri, "id", "value", "d"), result.rows_inserted, result.rows_updated)
    assert results["deltalake"] == results["spark"]
    kept = "new" if mode == "upsert" else "old"
    assert results["spark"] == ([(1, "old", date(2024, 1, 1)), (2, kept, date(2024, 1, 2)), (3, "new", date(2024, 1, 3))], 1, int(mode == "upsert"))


def test_applied_changes_delete_update_and_insert_on_keys_alike_in_spark_and_deltalake(spark, warehouse):
    """apply_changes: a row marked deleted deletes its stored row (one not stored: nothing), the
    others update or insert; the marker lands in the commit; into no table, the rows not deleted."""
    schema = "k string, start int, value string"
    stored = spark.createDataFrame([("a", 1, "x"), ("a", 5, "y"), ("b", 1, "z")], schema)
    changes = spark.createDataFrame(
        [("a", 5, None, True), ("a", 1, "x2", False), ("a", 3, "w", False), ("c", 9, None, True)],
        f"{schema}, _deleted boolean",
    )
    results = {}
    for engine, bound in (("spark", None), ("deltalake", 10)):
        uri = f"{warehouse}/{engine}"
        write(spark, stored, WriteRequest(uri, WriteMode.REPLACE))
        result = write(spark, changes, WriteRequest(uri, WriteMode.APPLY_CHANGES, ["k", "start"], rows_at_most=bound, user_metadata='{"mark": 1}'))
        assert DeltaTable(uri).history(1)[0]["userMetadata"] == '{"mark": 1}'
        results[engine] = (_rows(spark, uri, "k", "start", "value"), result.rows_inserted, result.rows_updated, result.rows_deleted)
    assert results["deltalake"] == results["spark"] == ([("a", 1, "x2"), ("a", 3, "w"), ("b", 1, "z")], 1, 1, 1)
    created = f"{warehouse}/created"
    write(spark, changes, WriteRequest(created, WriteMode.APPLY_CHANGES, ["k", "start"]))
    assert _rows(spark, created, "k", "start", "value") == [("a", 1, "x2"), ("a", 3, "w")]
    with pytest.raises(DeltaWriteError, match="_deleted"):
        write(spark, stored, WriteRequest(created, WriteMode.APPLY_CHANGES, ["k", "start"]))


@pytest.mark.parametrize("mode", ["append", "replace", "replace_partition"])
def test_a_small_append_or_replace_by_deltalake_leaves_what_sparks_write_leaves(spark, warehouse, mode):
    """rows_at_most under SMALL_WRITE_ROWS: the same rows, columns (one gained), metrics and
    transaction rule, without Spark's write; a window replaced keeps the other days and refuses a
    row outside it; an append of no row commits only its marker."""
    window = Window("d", datetime(2024, 1, 2), datetime(2024, 1, 3))
    stored = spark.createDataFrame([(1, "old", date(2024, 1, 1)), (2, "old", date(2024, 1, 2))], "id int, value string, d date")
    later = spark.createDataFrame([(3, "new", date(2024, 1, 2), 7)], "id int, value string, d date, extra int")
    results = {}
    for engine, bound in (("spark", None), ("deltalake", 10)):
        uri = f"{warehouse}/{engine}"
        write(spark, stored, WriteRequest(uri, WriteMode.REPLACE, partition_by=["d"]))
        request = WriteRequest(uri, WriteMode(mode), partition_by=["d"], window=window, txn=Txn("run-2"), rows_at_most=bound)
        result = write(spark, later, request)
        again = write(spark, later, request)
        assert again.skipped and table_version(uri) == result.version
        assert DeltaTable(uri).history(1)[0]["engineInfo"].startswith("delta-rs" if bound else "Apache-Spark")
        if mode == "replace_partition":
            outside = spark.createDataFrame([(4, "x", date(2024, 1, 9), 1)], later.schema)
            with pytest.raises(Exception, match="(?i)replaceWhere|does not conform|invalid data"):
                write(spark, outside, WriteRequest(uri, WriteMode(mode), partition_by=["d"], window=window, rows_at_most=bound))
        if mode == "append":
            marked = write(spark, later.limit(0), WriteRequest(uri, WriteMode(mode), partition_by=["d"], rows_at_most=bound and 0,
                                                               user_metadata='{"hour": 1}'))
            assert marked.version == result.version + 1 and DeltaTable(uri).history(1)[0]["userMetadata"] == '{"hour": 1}'
        columns = [field.name for field in DeltaTable(uri).schema().fields]
        results[engine] = (_rows(spark, uri, "id", "value", "d", "extra"), result.rows_inserted, columns, DeltaTable(uri).metadata().partition_columns)
    assert results["deltalake"] == results["spark"]
    kept = {"append": [(1, "old", date(2024, 1, 1), None), (2, "old", date(2024, 1, 2), None)], "replace": [],
            "replace_partition": [(1, "old", date(2024, 1, 1), None)]}[mode]
    assert results["spark"] == ([*kept, (3, "new", date(2024, 1, 2), 7)], 1, ["id", "value", "d", "extra"], ["d"])


@pytest.mark.parametrize(("columns", "bound", "engine"), [
    (2, 2_000_000, "delta-rs"),  # 4,000,000 cells: deltalake's, twenty times the rows a wide table may hold
    (40, 100_001, "Apache-Spark"),  # 4,000,040 cells: Spark's, though fewer rows than the narrow table's
])
def test_a_small_write_is_bounded_by_its_cells_not_its_rows(spark, warehouse, columns, bound, engine):
    """The rows deltalake writes are held in Python, and their bytes grow with their columns: the
    bound is on rows times columns (arrow.HELD_CELLS, 4,000,000)."""
    uri = f"{warehouse}/cells"
    rows = spark.range(3).select(*(F.col("id").alias(f"c{i}") for i in range(columns)))
    result = write(spark, rows, WriteRequest(uri, WriteMode.APPEND, rows_at_most=bound))
    assert result.rows_inserted == 3 and DeltaTable(uri).history(1)[0]["engineInfo"].startswith(engine)


def test_a_small_merge_refuses_an_upsert_with_a_shared_key_and_its_inserts_reach_the_change_feed(spark, warehouse):
    uri = f"{warehouse}/by_day"
    schema = "id int, d date"
    create_with_change_feed(spark, uri, spark.createDataFrame([], schema).schema, ["d"])
    write(spark, spark.createDataFrame([(1, date(2024, 1, 1))], schema), WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"]))
    later = spark.createDataFrame([(1, date(2024, 1, 1)), (2, date(2024, 1, 2))], schema)
    merged = write(spark, later, WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"], rows_at_most=2))
    assert merged.rows_inserted == 1
    assert [r.id for r in inserted_rows(spark, uri, merged.version).collect()] == [2]

    clash = spark.createDataFrame([(5, date(2024, 1, 5)), (5, date(2024, 1, 6))], schema)
    with pytest.raises(DeltaWriteError, match="several rows share the key"):
        write(spark, clash, WriteRequest(uri, WriteMode.UPSERT, ["id"], ["d"], rows_at_most=2))
    assert table_version(uri) == merged.version


def test_rows_declared_one_per_key_are_merged_without_the_shuffle_that_checks_them(spark, warehouse):
    """The declaration reaches the write through the asset's metadata, and the write then runs
    fewer Spark jobs: the key check is the only one left out (its result is the same here)."""
    from incremental_assets.lib.delta.spec import TableSpec

    spec = TableSpec.of(delta_table("upsert", keys=["id"], one_row_per_key=True))
    assert spec.one_row_per_key and not TableSpec.of(delta_table("upsert", keys=["id"])).one_row_per_key

    def jobs_of_upsert(uri: str, one_row_per_key: bool) -> int:
        write(spark, spark.createDataFrame([(1, "a")], "id int, value string"), WriteRequest(uri, WriteMode.UPSERT, ["id"]))
        rows = spark.createDataFrame([(1, "changed"), (2, "b")], "id int, value string")
        tracker, group = spark.sparkContext.statusTracker(), f"upsert-{one_row_per_key}"
        spark.sparkContext.setJobGroup(group, group)
        try:
            write(spark, rows, WriteRequest(uri, WriteMode.UPSERT, ["id"], one_row_per_key=one_row_per_key))
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        assert _rows(spark, uri, "id", "value") == [(1, "changed"), (2, "b")]
        return len(tracker.getJobIdsForGroup(group))

    assert jobs_of_upsert(f"{warehouse}/declared", True) < jobs_of_upsert(f"{warehouse}/checked", False)


@pytest.mark.parametrize("bound", [None, 10], ids=["spark", "deltalake"])
def test_a_merge_adds_the_columns_the_data_gains_even_where_the_path_holds_a_backtick(spark, warehouse, bound):
    """As an append's mergeSchema does; the path reaches Spark as a quoted name, never as SQL."""
    uri = f"{warehouse}/odd `name"
    write(spark, spark.createDataFrame([(1, "a")], "id int, value string"), WriteRequest(uri, WriteMode.UPSERT, ["id"]))
    wider = spark.createDataFrame([(1, "b", 1.5), (2, "c", None)], "id int, value string, score double")
    merged = write(spark, wider, WriteRequest(uri, WriteMode.UPSERT, ["id"], rows_at_most=bound))
    assert merged.operation == "MERGE" and (merged.rows_inserted, merged.rows_updated) == (1, 1)
    assert _rows(spark, uri, "id", "value", "score") == [(1, "b", 1.5), (2, "c", None)]


def test_a_table_whose_log_is_corrupted_is_refused_by_name_and_never_taken_for_missing(spark, warehouse):
    """Taken for missing, a keyed write would create the table afresh over the old rows."""
    uri = f"{warehouse}/keyed"
    rows = spark.createDataFrame([(1, "a")], "id int, value string")
    write(spark, rows, WriteRequest(uri, WriteMode.UPSERT, ["id"]))
    write(spark, rows, WriteRequest(uri, WriteMode.UPSERT, ["id"]))
    newest = sorted((Path(uri) / "_delta_log").glob("*.json"))[-1]
    newest.write_text('{"commitInfo": {"operation": "MERGE"')  # cut off mid-write by another tool
    with pytest.raises(UnreadableTableError, match="keyed"):
        write(spark, rows, WriteRequest(uri, WriteMode.UPSERT, ["id"]))
    assert newest.read_text() == '{"commitInfo": {"operation": "MERGE"' and len(list((Path(uri) / "_delta_log").glob("*.json"))) == 2


def test_a_commit_by_another_writer_during_a_merge_fails_it_whole_and_the_retry_merges_on_top(spark, warehouse, tmp_path):
    """Delta's optimistic concurrency. The other writer appends to the partition the MERGE reads,
    from inside the MERGE's own source (a UDF run while the MERGE executes), so the timing is exact."""
    uri, marker = f"{warehouse}/by_day", str(tmp_path / "other-writer-done")
    schema = "id int, d date"
    write(spark, spark.createDataFrame([(1, date(2024, 1, 1))], schema), WriteRequest(uri, WriteMode.APPEND, partition_by=["d"]))

    @F.udf("int")
    def meanwhile(value):  # in a Python worker: the other writer commits, once
        import os

        import deltalake
        import pyarrow

        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return value
        row = pyarrow.table({"id": pyarrow.array([9], pyarrow.int32()), "d": pyarrow.array([date(2024, 1, 1)])})
        deltalake.write_deltalake(uri, row, mode="append")
        return value

    later = spark.createDataFrame([(2, date(2024, 1, 1))], schema).withColumn("id", meanwhile("id"))
    with pytest.raises(Exception, match="DELTA_CONCURRENT_APPEND"):
        write(spark, later, WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"], one_row_per_key=True))
    assert _rows(spark, uri, "id") == [(1,), (9,)], "the other writer's row, and nothing of the failed MERGE"
    write(spark, later, WriteRequest(uri, WriteMode.MERGE_INSERT, ["id"], ["d"], one_row_per_key=True))
    assert _rows(spark, uri, "id") == [(1,), (2,), (9,)]


def test_an_ordinary_asset_returning_pandas_is_a_delta_table_its_readers_get_as_they_ask(spark, spark_resource, warehouse):
    """No JVM writes it (deltalake); a reader asks for pandas, Arrow or Spark by its annotation."""

    @asset(metadata=delta_table("replace"))
    def visits():
        return spark.createDataFrame([(1, "shop"), (2, "blog"), (3, "shop")], "id int, app_id string")

    @asset
    def visits_per_app(visits: pd.DataFrame) -> pd.DataFrame:
        return visits.groupby("app_id", as_index=False).size()

    seen = {}

    def reader(name, kind, rows):
        @asset(name=name, ins={"value": AssetIn("visits_per_app")})
        def read(value: kind):  # returns None: stores nothing
            seen[name] = sorted(rows(value))

        return read

    readers = [reader("as_pandas", pd.DataFrame, lambda frame: frame.itertuples(index=False, name=None)),
               reader("as_arrow", pa.Table, lambda table: (tuple(row.values()) for row in table.to_pylist())),
               reader("as_spark", DataFrame, lambda frame: (tuple(row) for row in frame.collect()))]
    result = _run(spark_resource, warehouse, [visits, visits_per_app, *readers])
    assert seen == dict.fromkeys(["as_pandas", "as_arrow", "as_spark"], [("blog", 1), ("shop", 2)])
    meta = _metadata(result, "visits_per_app")
    assert (meta["dagster/row_count"], meta["dagster/uri"]) == (2, f"{warehouse}/visits_per_app")
    assert [(c.name, c.type) for c in meta["dagster/column_schema"].columns] == [("app_id", "string"), ("size", "bigint")]
    assert DeltaTable(f"{warehouse}/visits_per_app").history(1)[0]["engineInfo"].startswith("delta-rs")
    assert not Path(warehouse, "as_pandas").exists() and not Path(warehouse, "_objects").exists(), "None stores nothing"


def test_an_ordinary_asset_returning_a_dict_is_pickled_and_loaded_back_equal(spark_resource, warehouse):
    value = {"apps": ["shop", "blog"], "days": 3}

    @asset
    def app_settings():
        return value

    seen = {}

    @asset
    def app_count(app_settings):  # no annotation
        seen["same run"] = app_settings
        return len(app_settings["apps"])

    meta = _metadata(_run(spark_resource, warehouse, [app_settings, app_count]), "app_settings")
    stored = Path(warehouse, "_objects", "app_settings")
    assert meta["path"] == str(stored) and pickle.loads(stored.read_bytes()) == value
    assert pickle.loads(Path(warehouse, "_objects", "app_count").read_bytes()) == 2

    @asset
    def later(app_settings: dict):
        seen["later run"] = app_settings

    _run(spark_resource, warehouse, [later, app_settings.to_source_asset()])
    assert seen == {"same run": value, "later run": value}

    @asset(name="app_settings", metadata=delta_table("replace"))
    def declared():
        return value

    with pytest.raises(DeltaWriteError, match="no handler stores a dict"):
        materialize([declared], resources={"io_manager": _io(spark_resource, warehouse)})


def test_a_partitioned_ordinary_asset_is_pickled_per_partition(spark_resource, warehouse):
    two_days = DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-03")

    @asset(partitions_def=two_days)
    def per_day(context: AssetExecutionContext):
        return {"day": context.partition_key}

    for day in ("2024-01-01", "2024-01-02"):
        _run(spark_resource, warehouse, [per_day], partition_key=day)
    assert pickle.loads(Path(warehouse, "_objects", "per_day", "2024-01-02").read_bytes()) == {"day": "2024-01-02"}
    seen = {}

    @asset
    def every_day(per_day: dict):
        seen.update(per_day)

    _run(spark_resource, warehouse, [every_day, per_day.to_source_asset()])
    assert seen == {"2024-01-01": {"day": "2024-01-01"}, "2024-01-02": {"day": "2024-01-02"}}


def test_a_run_that_writes_nothing_keeps_the_tables_columns_and_rows(spark, spark_resource, warehouse):
    """Read from the Delta log, not Spark, with the type names a Spark write shows."""
    schema = "id int, name string, at timestamp, day date, amount decimal(10,2), tags array<string>, extra map<string,bigint>, point struct<x:double,y:double>"
    rows = [(1, "a", datetime(2024, 1, 1, 10), date(2024, 1, 1), Decimal("1.50"), ["x"], {"k": 1}, (1.0, 2.0)),
            (2, "b", datetime(2024, 1, 2, 10), date(2024, 1, 2), Decimal("2.50"), [], {}, (3.0, 4.0))]
    frames = [spark.createDataFrame(rows, schema), None]

    @asset(metadata=delta_table("upsert", keys=["id"]))
    def quiet():
        return Rows(frames.pop(0))

    written = _metadata(_run(spark_resource, warehouse, [quiet]), "quiet")
    kept = _metadata(_run(spark_resource, warehouse, [quiet]), "quiet")
    assert kept["written"] is False and "delta_version" not in kept
    assert kept["dagster/row_count"] == written["dagster/row_count"] == 2
    assert kept["dagster/column_schema"] == written["dagster/column_schema"]


def test_the_batch_is_received_as_stored_read_by_deltalake_when_small_and_by_spark_otherwise(spark, warehouse, monkeypatch):
    """The incremental assets receive the run's batch (BatchHandler.load) as Spark's Delta reader
    reads it, schema and rows: the sample stream's events, with the generator's every anomaly. One
    whose cells may be held in Python is read by deltalake (no scan of Delta files in its plan);
    one cell more, by Spark."""
    from datetime import timedelta

    from incremental_assets.lib.delta import arrow
    from incremental_assets.lib.delta.io_manager import TableSlice
    from incremental_assets.lib.delta.spec import TableSpec
    from incremental_assets.lib.incremental.batch import BatchHandler, Found, RunBatch
    from incremental_assets.lib.incremental.limits import RunLimits, RunState
    from incremental_assets.lib.sample.generator import SampleParams, generate_table
    from incremental_assets.lib.sample.stream import STREAM_SCHEMA

    params = SampleParams(users=6, days=2, events_per_day=120, start_date=date(2024, 3, 1), bot_share=0.2, seed=5)
    events = spark.createDataFrame(generate_table(params, params.start, params.start + timedelta(days=2)), STREAM_SCHEMA)
    table = TableSlice("events_this_run", f"{warehouse}/events_this_run", TableSpec.of(delta_table("replace", stats_columns=[])),
                       None, "run-1")
    limits = RunLimits(RunState.STANDARD, datetime(2024, 3, 1), datetime(2024, 3, 3), datetime(2024, 3, 3))
    found = Found(events.count(), datetime(2024, 3, 3), 0)
    BatchHandler().store(None, table, RunBatch(events, limits, None, found, "collector_tstamp", "run-1"), lambda: spark)
    stored = read_table(spark, table.uri)
    expected = sorted(map(repr, stored.collect()))
    assert len(expected) == found.events > 100
    cells = len(expected) * len(stored.columns)
    for held_cells, small in ((arrow.HELD_CELLS, True), (cells - 1, False)):
        monkeypatch.setattr(arrow, "HELD_CELLS", held_cells)
        received = BatchHandler().load(None, table, lambda: spark).events
        assert received.schema == stored.schema, small
        assert sorted(map(repr, received.collect())) == expected, small
        plan = received._jdf.queryExecution().executedPlan().toString()
        assert ("FileScan" not in plan) == small, plan
