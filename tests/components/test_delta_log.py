"""The read layer's small-table reads (lib/delta/log.read_rows): a version read before is not read
again, and what a caller gets is the table's rows as they are now; a read by partition reads the
files of those partitions alone and keeps the rows deltalake's own read keeps; and the logs the
writers leave are quick to open."""

import json
import random
import shutil
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import deltalake

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import types as T

from incremental_assets.lib.catalog import RUN_LOG
from incremental_assets.lib.delta.log import dataset_of, files_left_by, first_data_change, read_rows, rows_as_of, scan, stored_table
from incremental_assets.lib.delta.spec import TableSpec, WriteMode
from incremental_assets.lib.delta.write import Txn, append_rows, create_with_change_feed
from incremental_assets.lib.state.run_log import PROCESSED
from incremental_assets.lib.state.store import StateStore


def test_rows_read_again_follow_a_new_version_a_table_made_afresh_and_ignore_a_callers_change(tmp_path, monkeypatch):
    scans, dataset = [], DeltaTable.to_pyarrow_dataset
    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", lambda self, **kw: scans.append(self.version()) or dataset(self, **kw))
    uri = str(tmp_path / "state")
    write_deltalake(uri, pa.table({"k": ["a"], "n": [1]}))
    first = read_rows(uri)
    assert first == [{"k": "a", "n": 1}]
    first[0]["n"] = 99  # the caller's own copy
    assert read_rows(uri) == [{"k": "a", "n": 1}]
    assert scans == [0], "version 0 is scanned once"

    write_deltalake(uri, pa.table({"k": ["b"], "n": [2]}), mode="append")
    assert sorted(row["k"] for row in read_rows(uri)) == ["a", "b"]
    assert read_rows(uri, filters=[("k", "=", "b")]) == [{"k": "b", "n": 2}]
    assert read_rows(uri, columns=["k"], filters=[("k", "=", "a")]) == [{"k": "a"}]

    shutil.rmtree(uri)  # made afresh at the same place: version 0 again, another table
    write_deltalake(uri, pa.table({"k": ["c"], "n": [3]}))
    assert read_rows(uri) == [{"k": "c", "n": 3}]
    shutil.rmtree(uri)
    assert read_rows(uri) is None


def test_a_read_by_partition_opens_those_partitions_files_alone_and_keeps_the_rows_deltalakes_read_keeps(tmp_path):
    """`scan` (and read_rows, rows_as_of) prunes the log's file list by the partition filters;
    deltalake's to_pyarrow_table(filters=) tested them on every file. Differential against it on
    generated tables: days as a date partition (one null), several files a day, filters as the
    callers spell them (ISO strings, dates, in, >=, <, a null named)."""
    generator = random.Random(7)
    first = date(2024, 3, 1)
    for case in range(6):
        uri = str(tmp_path / f"t{case}")
        days = [first + timedelta(days=n) for n in range(generator.randint(3, 9))] + [None]
        for _ in range(generator.randint(2, 4)):  # a write per round: several files a day
            chosen = [generator.choice(days) for _ in range(generator.randint(5, 40))]
            rows = pa.table({"id": [f"e{generator.randrange(10**6)}" for _ in chosen], "n": list(range(len(chosen))),
                             "day": pa.array(chosen, pa.date32())})
            write_deltalake(uri, rows, partition_by=["day"], mode="append")
        table = DeltaTable(uri)
        named = sorted(generator.sample([d for d in days if d], 2))
        cut = generator.choice([d for d in days if d])
        for filters in (
            [("day", "in", [d.isoformat() for d in named])], [("day", "in", named)], [("day", ">=", cut)],
            [("day", "<", cut)], [("day", ">=", named[0]), ("day", "<", named[1])], [("day", "in", [None, named[0]])],
            [("day", "in", [(first - timedelta(days=1)).isoformat()])], None,
        ):
            expected = _sorted(table.to_pyarrow_table(columns=["id", "n", "day"], filters=filters))
            assert _sorted(scan(table, ["id", "n", "day"], filters)) == expected, (case, filters)
            assert _sorted(rows_as_of(uri, table.version(), ["id", "n", "day"], filters or [])) == expected, (case, filters)
            assert sorted(read_rows(uri, filters=filters), key=repr) == sorted(expected, key=repr), (case, filters)
            opened = [_day_of(f.path) for f in dataset_of(table, filters).get_fragments()]
            kept = {_day_of(f.path) for f in table.to_pyarrow_dataset().get_fragments()} & {row["day"] for row in expected}
            assert kept <= set(opened), (case, filters)
            if filters and not any(value is None or None in (value if isinstance(value, list) else []) for _, _, value in filters):
                assert set(opened) == kept, f"{case} {filters}: opened the files of {set(opened) - kept}"


def _sorted(rows: pa.Table) -> list[dict]:
    return sorted(rows.to_pylist(), key=repr)


def _day_of(path: str) -> date | None:
    """The partition value a file's path spells (a null: Hive's default partition)."""
    value = path.split("day=", 1)[1].split("/", 1)[0]
    return None if value == "__HIVE_DEFAULT_PARTITION__" else date.fromisoformat(value)


def test_the_tables_runs_write_checkpoint_their_log_every_ten_commits(spark, warehouse):
    """Finding: most commits here are deltalake's, which checkpoints every hundred by default, so each
    of a run's opens of a table (about 120 per run) read up to 99 commit files: a cost that grew with
    history, and a request each on an object store. The run log (the state store's), and a table made
    by the IO manager's Spark writer that deltalake then appends to (as filtered_events is), each
    after twelve commits: opened from a checkpoint at most nine commits old."""
    state = StateStore()
    made_by_spark = f"{warehouse}/made_by_spark"
    create_with_change_feed(spark, made_by_spark, T.StructType([T.StructField("k", T.StringType())]), [],
                            TableSpec(WriteMode.APPEND).table_properties(["k"]))
    for n in range(12):
        state.record(f"run-{n}", "filtered_events", PROCESSED, {})
        append_rows(made_by_spark, pa.table({"k": [f"row-{n}"]}), Txn(f"run-{n}"))
    for uri in (state.uri(RUN_LOG), made_by_spark):
        version = DeltaTable(uri).version()
        last = Path(uri) / "_delta_log" / "_last_checkpoint"
        checkpoint = json.loads(last.read_text())["version"] if last.exists() else None
        assert version >= 11 and checkpoint is not None and version - checkpoint <= 9, (uri, version, checkpoint)


def test_the_first_data_change_skips_compactions_and_property_commits_and_assumes_one_when_a_commit_is_gone(tmp_path):
    uri = str(tmp_path / "table")
    write_deltalake(uri, pa.table({"k": ["a"]}))  # 0: rows
    write_deltalake(uri, pa.table({"k": ["b"]}), mode="append")  # 1: rows
    table = DeltaTable(uri)
    table.optimize.compact()  # 2: the same rows in one file
    table.alter.set_table_properties({"delta.checkpointInterval": "10"})  # 3: a property
    assert table.version() == 3
    assert first_data_change(uri, 0, 3) == 0
    assert first_data_change(uri, 1, 3) == 1
    assert first_data_change(uri, 2, 3) is None
    write_deltalake(uri, pa.table({"k": ["c"]}), mode="append")  # 4: rows
    assert first_data_change(uri, 2, 4) == 4

    (Path(uri) / "_delta_log" / f"{3:020d}.json").rename(tmp_path / "moved-aside.json")
    assert first_data_change(uri, 2, 4) == 2, "what a missing commit did cannot be told: the first is taken"


def test_an_erasures_commits_are_found_back_to_its_request_among_many_whatever_the_log_lost_before_it(tmp_path):
    """files_left_by reads the log back from the newest commit, many commit files at a time, to
    the first made before the request: a commit of the same name before it is not the request's,
    and a commit file gone before it (Delta's log cleanup) hides nothing; one gone after it does."""
    uri, named = str(tmp_path / "table"), deltalake.CommitProperties(custom_metadata={"userMetadata": "erasure-x"})
    for n in range(40):  # versions 0..39, a file each
        write_deltalake(uri, pa.table({"n": [n]}), mode="append")
        time.sleep(0.005)  # each commit its own millisecond
    table = DeltaTable(uri)
    table.delete("n = 3", commit_properties=named)  # 40: the same name, before the request
    since = datetime.now(timezone.utc)
    time.sleep(0.005)
    for n in range(4, 24):  # 41..60
        write_deltalake(uri, pa.table({"n": [100 + n]}), mode="append")
    table = DeltaTable(uri)
    before = {Path(file).name for file in table.file_uris()}  # unpartitioned: a file's path is its name
    table.delete("n = 30", commit_properties=named)  # 61: the request's
    removed = sorted(before - {Path(file).name for file in DeltaTable(uri).file_uris()})
    write_deltalake(uri, pa.table({"n": [200]}), mode="append")  # 62
    assert len(removed) == 1 and files_left_by(uri, "erasure-x", since) == removed

    DeltaTable(uri).create_checkpoint()
    for version in range(0, 40):  # the log before the request's last earlier commit (40) cleaned up
        (Path(uri) / "_delta_log" / f"{version:020d}.json").unlink()
    assert files_left_by(uri, "erasure-x", since) == removed
    (Path(uri) / "_delta_log" / f"{50:020d}.json").unlink()  # one after the request gone
    assert files_left_by(uri, "erasure-x", since) is None, "what a missing commit did cannot be told"


def test_a_commit_whose_statistics_hold_a_line_separator_is_read_as_a_commit(spark, tmp_path):
    """Spark writes a file's min and max strings into the commit unescaped: a page title holding
    U+2028 or U+0085 (pasted text does) put one inside a JSON line, which Python's splitlines cut,
    so every open called the table's last commit damaged. Found by tests/components/test_write_engines.py."""
    uri = str(tmp_path / "titles")
    titles = ["first\u2028line", "next\x85line", "a\u2029b"]
    spark.createDataFrame([(t,) for t in titles], "page_title string").write.format("delta").save(uri)
    commit = (tmp_path / "titles" / "_delta_log" / "00000000000000000000.json").read_text()
    assert "\u2028" in commit or "\x85" in commit, "the statistics hold the separators unescaped"
    assert stored_table(uri).version() == 0  # not "damaged (not JSON: Unterminated string ...)"
    assert first_data_change(uri, 0, 0) == 0  # its actions, parsed
    assert sorted(r.page_title for r in spark.read.format("delta").load(uri).collect()) == sorted(titles)
