"""Both write engines, one behaviour: every write mode that has a small path through deltalake
leaves the table Spark's own write leaves, for frames of every column type the project writes,
shaped by real Spark jobs (several Arrow batches, filters, joins, aggregations) in a process where
Spark has run. Each table either engine leaves reads the same through the checks' small path
(deltalake's Arrow handed to Spark) as through Spark's Delta reader. `make test` writes 3 generated frames of each of the six modes (18 frames, each by
both engines) and the cut-down crash of each mode; `make soak` 40 frames of each mode."""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from incremental_assets.lib.delta import read as read_module
from incremental_assets.lib.delta.arrow import collect
from incremental_assets.lib.delta.read import read_just_written, read_table
from incremental_assets.lib.delta.spec import DELETED, DeltaWriteError, Window, WriteMode
from incremental_assets.lib.delta.write import WriteRequest, empty, write
from incremental_assets.lib.environment import WRITE_ENGINE_ENV

SCHEMA = "k string, d date, n bigint, s string, tags array<string>, last struct<at: timestamp, value: string>, at timestamp"
KEYS = ("k", "d")
DAYS = [date(2021, 2, 1) + timedelta(days=i) for i in range(3)]
WINDOW = Window("d", datetime(2021, 2, 2), datetime(2021, 2, 3))
MODES = ("append", "replace", "replace_partition", "upsert", "merge_insert", "apply_changes")
SHAPES = ("as_created", "batches", "filtered", "joined", "aggregated", "computed")
SCHEMA_COLUMNS = ["k", "d", "n", "s", "tags", "last", "at"]
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
EXAMPLES = 40 if os.environ.get("HYPOTHESIS_PROFILE") == "soak" else 3  # frames per mode

texts = st.one_of(
    st.none(), st.just(""), st.text(max_size=6), st.text(alphabet="äé漢字🙂\u0000", min_size=1, max_size=4),
    st.text(alphabet="ab", min_size=300, max_size=400),
)
moments = st.datetimes(datetime(1970, 1, 2), datetime(2100, 1, 1), timezones=st.just(timezone.utc))
rows = st.fixed_dictionaries({
    "k": st.sampled_from(["a", "b", "c", "", "ü", "long-" + "k" * 200]),
    "d": st.sampled_from(DAYS),
    "n": st.integers(-(2**63), 2**63 - 1),
    "s": texts,
    "tags": st.one_of(st.none(), st.just([]), st.lists(st.one_of(st.none(), st.text(max_size=5)), max_size=3)),
    "last": st.one_of(st.none(), st.fixed_dictionaries({"at": st.one_of(st.none(), moments), "value": texts})),
    "at": st.one_of(st.none(), moments),
})


def unique_keys(generated: list[dict]) -> list[dict]:
    return list({tuple(row[key] for key in KEYS): row for row in generated}.values())


# The stored rows before a write: no table (0), an emptied one (1), rows (the rest).
stored_rows = st.integers(0, 5).flatmap(lambda pick: st.just(None) if pick == 0 else st.just([]) if pick == 1 else st.lists(rows, min_size=1, max_size=6))


@pytest.fixture(scope="module")
def busy_spark(spark):
    """The session after real jobs (a shuffle, a join, a collect), as a run's process is."""
    numbers = spark.range(20_000).withColumn("g", F.col("id") % 7)
    numbers.join(numbers.groupBy("g").count(), "g").agg(F.sum("count")).collect()
    return spark


@pytest.fixture(scope="module")
def by_deltalake():
    """How many frames of each mode deltalake committed (the others went to Spark on both sides,
    as a MERGE into no table does): each mode searched compared it at least once."""
    committed: dict[str, int] = {}
    yield committed
    assert all(committed.values()), committed


def shaped(spark, generated: list[dict], shape: str, deleted: list[bool] | None = None):
    """The rows as a frame that a real Spark job made: its Arrow comes in several batches, sliced
    by a filter, or built by a join or an aggregation."""
    frame = spark.createDataFrame([tuple(row[c] for c in SCHEMA_COLUMNS) for row in generated], SCHEMA)
    if deleted is not None:
        flags = spark.createDataFrame([(row["k"], row["d"], flag) for row, flag in zip(generated, deleted)], f"k string, d date, {DELETED} boolean")
        frame = frame.join(flags, list(KEYS))
    if shape == "batches":
        frame = frame.repartition(4)
    elif shape == "filtered":
        frame = frame.repartition(3).where(F.col("k") != "b")
    elif shape == "joined":
        frame = frame.join(spark.createDataFrame([(k,) for k in ("a", "c", "", "ü")], "k string"), "k", "left_semi")
    elif shape == "aggregated":  # one row per key and day, lists flattened, first values kept
        columns = [c for c in frame.columns if c not in KEYS]
        frame = frame.repartition(3).groupBy(*KEYS).agg(*[F.first(c).alias(c) for c in columns])
    elif shape == "computed":  # typed non-null by how it is computed: a number, a set's elements, a struct of values
        frame = frame.withColumns({
            "n": F.coalesce("n", F.lit(0)),
            "tags": F.array_compact(F.coalesce("tags", F.array().cast("array<string>"))),
            "last": F.struct(F.coalesce("last.at", F.lit(EPOCH)).alias("at"), F.coalesce("last.value", F.lit("")).alias("value")),
        })
    return frame.select(*[c for c in (*SCHEMA_COLUMNS, DELETED) if c in frame.columns])


def table_state(spark, uri: str):
    """What a reader sees: columns and types, partition columns, and the rows (in a stable order);
    and the schema the log records, nullability at every depth included (what a later write must fit)."""
    frame = read_table(spark, uri)
    columns = [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
    return columns, sorted((repr(tuple(row)) for row in frame.collect())), DeltaTable(uri).schema().to_json()


FILTERS = (None, [("d", "in", [DAYS[0], DAYS[2]])], [("d", "<", DAYS[0])],
           [("k", "in", ["a", "ü", "long-" + "k" * 200])], [("d", ">=", DAYS[1]), ("k", "in", ["b", ""])])
KEEPS = {"in": lambda value, kept: value in kept, "<": lambda value, bound: value < bound, ">=": lambda value, bound: value >= bound}


def read_alike_for_checks(spark, uri: str) -> None:
    """read_just_written gives the schema and the rows of Spark's own read, for the whole table, for
    partition filters (one keeping none) and for filters on a string column (the keys of a check's
    rows; in files deltalake wrote, pyarrow reads them as views)."""
    whole = read_table(spark, uri)
    schema = [(f.name, f.dataType.simpleString(), f.nullable) for f in whole.schema.fields]
    rows = whole.collect()
    named = [kept for kept in FILTERS if kept and any(column == "k" for column, _, _ in kept)]
    # As reads go; then with the table's rows not few, and fewer rows few: the keys named are scanned for.
    for filters, few in ((FILTERS, None), (named, len(rows))):
        with pytest.MonkeyPatch.context() as patch:
            if few is not None:
                patch.setattr(read_module, "is_small", lambda n: n is not None and n < few)
            for kept in filters:
                expected = sorted(repr(tuple(row)) for row in rows if all(KEEPS[op](row[c], value) for c, op, value in kept or []))
                read = read_just_written(spark, uri, SCHEMA_COLUMNS, kept)
                assert [(f.name, f.dataType.simpleString(), f.nullable) for f in read.schema.fields] == schema, kept
                assert sorted(repr(tuple(row)) for row in read.collect()) == expected, kept


def written_by(spark, warehouse, engine: str, mode: str, stored: list[dict] | None, new: list[dict], shape: str, deleted=None):
    uri = f"{warehouse}/{engine}"
    if stored is not None:
        write(spark, shaped(spark, stored, "as_created"), WriteRequest(uri, WriteMode.REPLACE, partition_by=["d"]))
        if not stored:
            empty(uri)
    frame = shaped(spark, new, shape, deleted)
    bound = len(new) if engine == "deltalake" else None  # a bound on the rows, as a step's
    request = WriteRequest(uri, WriteMode(mode), KEYS if mode in ("upsert", "merge_insert", "apply_changes") else (),
                           ["d"], WINDOW if mode == "replace_partition" else None, rows_at_most=bound)
    result = write(spark, frame, request)
    read_alike_for_checks(spark, uri)
    engine_info = DeltaTable(uri).history(1)[0].get("engineInfo", "")
    return table_state(spark, uri), (result.rows_inserted, result.rows_updated, result.rows_deleted), engine_info.startswith("delta-rs")


@pytest.mark.property
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES < 10, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(shape=st.sampled_from(SHAPES), stored=stored_rows, new=st.lists(rows, max_size=12), data=st.data())
def test_deltalake_and_spark_leave_equal_tables(busy_spark, tmp_path_factory, monkeypatch_module, by_deltalake, mode, shape,
                                                stored, new, data):
    if mode in ("upsert", "merge_insert", "apply_changes"):
        new = unique_keys(new)
    if mode == "replace_partition":
        new = [{**row, "d": DAYS[1]} for row in new]
    deleted = [data.draw(st.booleans()) for _ in new] if mode == "apply_changes" else None
    warehouse = str(tmp_path_factory.mktemp("engines"))
    *spark_side, by_spark = written_by(busy_spark, warehouse, "spark", mode, stored, new, shape, deleted)
    *deltalake_side, committed = written_by(busy_spark, warehouse, "deltalake", mode, stored, new, shape, deleted)
    assert not by_spark
    assert deltalake_side == spark_side
    by_deltalake[mode] = by_deltalake.get(mode, 0) + committed


@pytest.fixture(scope="module")
def monkeypatch_module():
    """The engine switch left at its default (auto): a developer's environment does not decide."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(WRITE_ENGINE_ENV, raising=False)
        yield patch


@pytest.mark.parametrize("mode", MODES)
def test_rows_whose_lists_are_all_empty_are_written_by_deltalake_as_by_spark(busy_spark, tmp_path, monkeypatch_module, mode):
    """The daily run's panic on a public Snowplow export, cut down: a day whose users each used no
    app (distinct_apps__partial all empty lists) reaches Python with a 0-byte offsets buffer, and
    deltalake's partitioned write or MERGE of it panicked inside Arrow (lib/delta/arrow.py)."""
    stored = [{"k": "a", "d": DAYS[1], "n": 1, "s": "x", "tags": ["web"], "last": None, "at": None}]
    new = [{"k": k, "d": DAYS[1], "n": 2, "s": "", "tags": [], "last": {"at": None, "value": None}, "at": None} for k in ("a", "b")]
    deleted = [False, False] if mode == "apply_changes" else None
    *spark_side, by_spark = written_by(busy_spark, str(tmp_path), "spark", mode, stored, new, "as_created", deleted)
    *deltalake_side, committed = written_by(busy_spark, str(tmp_path), "deltalake", mode, stored, new, "as_created", deleted)
    assert committed and not by_spark
    assert deltalake_side == spark_side
    assert "'b', datetime.date(2021, 2, 2), 2, '', []" in " ".join(spark_side[0][1])


def test_an_upsert_keeps_a_null_struct_null_in_either_engine(busy_spark, tmp_path, monkeypatch_module):
    """Found by make soak's search: Spark's MERGE with schema evolution on (which the project set
    for every MERGE) wrote a null struct as a struct of nulls when it updated a row; deltalake kept
    it null. Evolution is on now only when the rows bring a column the table lacks."""
    row = {"k": "a", "d": DAYS[0], "n": 0, "s": None, "tags": None, "last": None, "at": None}
    gained = {**row, "k": "b"}
    *spark_side, _ = written_by(busy_spark, str(tmp_path), "spark", "upsert", [row, gained], [row, gained], "as_created")
    *deltalake_side, committed = written_by(busy_spark, str(tmp_path), "deltalake", "upsert", [row, gained], [row, gained], "as_created")
    assert committed and deltalake_side == spark_side
    assert spark_side[0][1] == sorted(repr((k, DAYS[0], 0, None, None, None, None)) for k in ("a", "b"))


NON_NULL = ('"nullable":false', '"containsNull":false', '"valueContainsNull":false')
DAY_ROW = {"k": "a", "d": DAYS[1], "n": 1, "s": "x", "tags": ["web"], "last": {"at": EPOCH, "value": "v"}, "at": None}


def stored_as_an_earlier_release(spark, uri: str, rows: list[dict]) -> None:
    """The table an earlier release's small write created from a frame typed non-null: its Arrow as it came."""
    write_deltalake(uri, collect(shaped(spark, rows, "computed")), partition_by=["d"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stored", [None, "rows"])
def test_a_frame_typed_non_null_is_stored_as_spark_stores_it(busy_spark, tmp_path, monkeypatch_module, mode, stored):
    """A frame a computation types as non-null (a number, a set's elements, a struct of values) is
    stored by deltalake with every field nullable, as Spark's Delta writer stores any frame. Before,
    a table deltalake created kept the frame's types (a day's attributes, say) and refused a later
    write, through Spark's MERGE, of the same column computed another way (test below)."""
    row = {"k": "a", "d": DAYS[1], "n": None, "s": "x", "tags": None, "last": None, "at": None}
    before = None if stored is None else [row]
    new = [{**row, "k": k, "n": 2, "tags": ["web", None]} for k in ("a", "b")]
    deleted = [False, False] if mode == "apply_changes" else None
    *spark_side, _ = written_by(busy_spark, str(tmp_path), "spark", mode, before, new, "computed", deleted)
    *deltalake_side, committed = written_by(busy_spark, str(tmp_path), "deltalake", mode, before, new, "computed", deleted)
    assert deltalake_side == spark_side
    assert not any(flag in spark_side[0][2] for flag in NON_NULL), spark_side[0][2]
    assert committed or (stored is None and mode in ("upsert", "merge_insert", "apply_changes"))  # a MERGE into no table is Spark's


def test_a_table_deltalake_created_takes_nulls_a_later_run_computes_through_spark(busy_spark, tmp_path, monkeypatch_module):
    """The crash found on a public Snowplow export, in general: a day's rows created the table by
    deltalake from a frame typed non-null; a later, larger write (Spark's MERGE) of the same columns
    computed another way, with a null element and a null field, failed: cannot cast "ARRAY<STRING>"
    to "ARRAY<STRING>"."""
    uri = str(tmp_path / "table")
    first = [DAY_ROW]
    write(busy_spark, shaped(busy_spark, first, "computed"), WriteRequest(uri, WriteMode.APPEND, partition_by=["d"], rows_at_most=1))
    assert DeltaTable(uri).history(1)[0]["engineInfo"].startswith("delta-rs")
    later = [{**first[0], "n": None, "tags": ["web", None], "last": {"at": None, "value": None}}, {**first[0], "k": "b"}]
    write(busy_spark, shaped(busy_spark, later, "as_created"), WriteRequest(uri, WriteMode.UPSERT, KEYS, ["d"]))
    assert sorted(tuple(row) for row in read_table(busy_spark, uri).select("k", "n", "tags", "last.value").collect()) == [
        ("a", None, ["web", None], None), ("b", 1, ["web"], "v")]


@pytest.mark.parametrize("mode", ["append", "upsert", "replace_partition"])
def test_a_table_an_earlier_release_stored_non_null_takes_its_frames_as_before(busy_spark, tmp_path, monkeypatch_module, mode):
    """A table an earlier release's small write stored with non-null fields (its log says so) keeps
    taking the frames it was computed from by deltalake: their types are kept for it, as deltalake
    casts no nullable struct field into a non-null one."""
    uri = str(tmp_path / "table")
    first = [DAY_ROW]
    stored_as_an_earlier_release(busy_spark, uri, first)
    assert '"containsNull":false' in DeltaTable(uri).schema().to_json()
    new = [{**first[0], "n": 2}, {**first[0], "k": "b"}]
    request = WriteRequest(uri, WriteMode(mode), KEYS if mode == "upsert" else (), ["d"], WINDOW if mode == "replace_partition" else None,
                           rows_at_most=len(new))
    write(busy_spark, shaped(busy_spark, new, "computed"), request)
    assert DeltaTable(uri).history(1)[0]["engineInfo"].startswith("delta-rs")
    expected = {"append": [("a", 1), ("a", 2), ("b", 1)], "upsert": [("a", 2), ("b", 1)], "replace_partition": [("a", 2), ("b", 1)]}
    assert sorted(tuple(row) for row in read_table(busy_spark, uri).select("k", "n").collect()) == expected[mode]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_table_an_earlier_release_stored_non_null_takes_nullable_columns_once_refreshed(busy_spark, tmp_path, monkeypatch_module, mode):
    """The way out that docs/operations.md names: a full refresh empties the table, and its next
    write, by either engine, gives it nullable columns."""
    uri = str(tmp_path / "table")
    first = [DAY_ROW]
    stored_as_an_earlier_release(busy_spark, uri, first)
    empty(uri)
    request = WriteRequest(uri, WriteMode(mode), KEYS if mode == "upsert" else (), ["d"], rows_at_most=1 if mode == "append" else None)
    write(busy_spark, shaped(busy_spark, first, "computed"), request)
    assert not any(flag in DeltaTable(uri).schema().to_json() for flag in NON_NULL)
    assert [tuple(row) for row in read_table(busy_spark, uri).select("k", "n").collect()] == [("a", 1)]


def test_a_window_replaced_by_no_row_reports_the_rows_it_deleted_in_either_engine(busy_spark, tmp_path, monkeypatch_module):
    """Found by make soak's search: Delta counts the rows a replaceWhere deletes only when it writes
    some, so Spark's side reported 0 rows deleted for a day replaced by none; deltalake's, 2."""
    stored = [{"k": k, "d": day, "n": 0, "s": None, "tags": None, "last": None, "at": None} for k in ("a", "b") for day in DAYS]
    *spark_side, _ = written_by(busy_spark, str(tmp_path), "spark", "replace_partition", stored, [], "as_created")
    *deltalake_side, committed = written_by(busy_spark, str(tmp_path), "deltalake", "replace_partition", stored, [], "as_created")
    assert committed and deltalake_side == spark_side
    assert spark_side[1] == (0, 0, 2) and len(spark_side[0][1]) == 4  # the window's day emptied, the others kept


@pytest.mark.parametrize("mode", ["upsert", "apply_changes"])
def test_spark_merge_of_nulls_into_an_earlier_release_non_null_list_is_refused_by_name(busy_spark, tmp_path, monkeypatch_module, mode):
    """What is left of the crash for a table an earlier release stored with non-null elements: Spark's
    MERGE cannot take a list whose elements may be null. Refused before anything is written, naming
    the column and the way out, not by Spark's `cannot cast "ARRAY<STRING>" to "ARRAY<STRING>"`."""
    uri = str(tmp_path / "table")
    first = [DAY_ROW]
    stored_as_an_earlier_release(busy_spark, uri, first)
    later = [{**first[0], "tags": ["web", None]}]
    frame = shaped(busy_spark, later, "as_created", [False] if mode == "apply_changes" else None)
    with pytest.raises(DeltaWriteError, match=r"Cannot merge into .*table: tags.element may hold a null in these rows.*full refresh"):
        write(busy_spark, frame, WriteRequest(uri, WriteMode(mode), KEYS, ["d"]))
    assert DeltaTable(uri).version() == 0
