"""A source laid out as Snowplow's Lake Loader lays out its Delta table: partitioned by a column it
generates, date_load_tstamp = CAST(load_tstamp AS DATE), with no load_date, and here without file
statistics. Told its name (source_load_date_column), a run reads only the load days its window can
hold: the proof is a run that succeeds after the files of an old load day are gone, which a read of
the whole table cannot.

The cursor is collector_tstamp: with it, only our pruning on the load day keeps old days unread
(Delta derives partition filters from predicates on load_tstamp itself, not on collector_tstamp).
"""

from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
from dagster import DagsterInstance
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.cli.preview import preview
from incremental_assets.cli.runner import run_incremental
from incremental_assets.lib.delta.log import data_files
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA, first_after, rows_within
from incremental_assets.lib.utc import utcnow

OLD_DAY = (utcnow() - timedelta(days=20)).replace(hour=0, minute=0, second=0, microsecond=0)
NEW_DAY = OLD_DAY + timedelta(days=10)
SETTINGS = IncrementalSettings(
    start_date=OLD_DAY.date().isoformat(), session_timestamp="collector_tstamp", source_load_date_column="date_load_tstamp"
)


def session_events(session: str, day, n: int = 3) -> list[tuple]:
    """`n` page views of one session from 09:00 on `day`, each loaded five minutes after collection."""
    rows = []
    for hit in range(n):
        collected = day + timedelta(hours=9, minutes=hit)
        values = {
            "event_id": f"{session}-{hit}", "app_id": "website", "event_name": "page_view",
            "collector_tstamp": collected, "dvce_created_tstamp": collected - timedelta(seconds=2),
            "dvce_sent_tstamp": collected - timedelta(seconds=1), "derived_tstamp": collected,
            "load_tstamp": collected + timedelta(minutes=5), "domain_sessionid": session, "domain_userid": f"u-{session}",
        }
        rows.append(tuple(values.get(name) for name in SAMPLE_SCHEMA.fieldNames()) + (None,))
    return rows


def load(spark, uri: str, rows: list[tuple]) -> None:
    """Append as the Lake Loader does: the table computes date_load_tstamp itself."""
    events_frame(spark, rows).drop("load_date").write.format("delta").mode("append").save(uri)


@pytest.fixture
def lake_source(spark, warehouse, tmp_path, monkeypatch) -> str:
    uri = str(tmp_path / "lake" / "events")
    (
        DeltaTable.create(spark).location(uri).addColumns(SAMPLE_SCHEMA)
        .addColumn("date_load_tstamp", T.DateType(), generatedAlwaysAs="CAST(load_tstamp AS DATE)")
        .partitionedBy("date_load_tstamp")
        # No file statistics (as in a table wider than the 32 columns Delta keeps them for): only the
        # partitions can keep a read off old files.
        .property("delta.dataSkippingNumIndexedCols", "0").execute()
    )
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", uri)
    return uri


def test_runs_read_only_the_load_days_their_window_can_hold(spark, warehouse, lake_source):
    instance = DagsterInstance.ephemeral()
    load(spark, lake_source, session_events("old", OLD_DAY))
    run = run_incremental(SETTINGS, now=(OLD_DAY + timedelta(days=1)).isoformat(), instance=instance)
    assert run.success, run.error
    assert run.value("sessions_lifecycle_manifest", "source_read") == "the load days a window can hold (date_load_tstamp)"
    # A quiet run days later reads nothing, and the position moves on to 'now'.
    run = run_incremental(SETTINGS, now=(OLD_DAY + timedelta(days=5)).isoformat(), instance=instance)
    assert run.success and run.value("sessions_lifecycle_manifest", "skipped").startswith("quiet: "), run.error

    # The old load day's files go (as if archived): the next window, days later, must not need them.
    old_partition = Path(lake_source) / f"date_load_tstamp={OLD_DAY.date().isoformat()}"
    for data_file in old_partition.glob("*.parquet"):
        data_file.unlink()
    with pytest.raises(Exception, match="(?i)file.*(not exist|not found)"):
        spark.read.format("delta").load(lake_source).collect()  # the whole table cannot be read any more
    load(spark, lake_source, session_events("new", NEW_DAY))

    now = NEW_DAY + timedelta(days=1)
    assert preview(SETTINGS, now=now).window_events == 3, "the preview reads the same load days, without Spark"
    later = run_incremental(SETTINGS, now=now.isoformat(), instance=instance)
    assert later.success, later.error
    stored = read_table(spark, f"{warehouse}/filtered_events")
    assert sorted(r.event_id for r in stored.collect()) == ["new-0", "new-1", "new-2", "old-0", "old-1", "old-2"]
    assert stored.where(F.col("date_load_tstamp").isNull()).count() == 0, "the source's load day passes on"


def test_where_a_quiet_window_resumes_is_read_from_the_files_that_can_hold_it(tmp_path):
    """first_after, without a JVM: the least cursor in (after, until], read from the load days that
    can hold it and from the files whose statistics allow it. The files of an old load day are
    gone and a file whose cursor range lies before `after` is garbage: neither is read."""
    uri = str(tmp_path / "events")
    settings = IncrementalSettings(start_date="2024-03-01", source_load_date_column="load_date")

    def append(*loads: str) -> None:
        stamps = [datetime.fromisoformat(f"2024-03-{text}").replace(tzinfo=timezone.utc) for text in loads]
        deltalake.write_deltalake(uri, pa.table({
            "event_id": [f"e-{text}" for text in loads], "load_tstamp": pa.array(stamps, pa.timestamp("us", "UTC")),
            "load_date": pa.array([stamp.date() for stamp in stamps], pa.date32()),
        }), mode="append", partition_by=["load_date"])

    append("01 09:00")  # an old load day
    append("05 08:00", "05 09:00")  # wholly before `after`
    append("05 10:00", "05 12:00", "06 07:00")
    after = datetime(2024, 3, 5, 9, 30)
    for file in data_files(deltalake.DeltaTable(uri)).to_pylist():
        if file["partition.load_date"] == date(2024, 3, 1):
            (Path(uri) / file["path"]).unlink()
        elif file["max.load_tstamp"].replace(tzinfo=None) <= after:
            (Path(uri) / file["path"]).write_bytes(b"not parquet")

    assert first_after(uri, settings, after, datetime(2024, 3, 6)) == datetime(2024, 3, 5, 10), "after: exclusive"
    assert first_after(uri, settings, datetime(2024, 3, 5, 10), datetime(2024, 3, 5, 12)) == datetime(2024, 3, 5, 12), \
        "until: inclusive"
    assert first_after(uri, settings, datetime(2024, 3, 5, 12), datetime(2024, 3, 6, 6)) is None


def test_the_rows_a_window_can_meet_are_counted_from_the_files_that_can_hold_it(tmp_path):
    """rows_within, from the log alone: the rows of the files whose load day and cursor statistics
    allow a cursor in (after, until]. What sizes Spark for a run's steps (lib/spark.size_for)."""
    uri = str(tmp_path / "events")
    settings = IncrementalSettings(start_date="2024-03-01", source_load_date_column="load_date")
    for loads in (["01 09:00"], ["05 08:00", "05 09:00"], ["05 10:00", "05 12:00", "06 07:00"]):
        stamps = [datetime.fromisoformat(f"2024-03-{text}").replace(tzinfo=timezone.utc) for text in loads]
        deltalake.write_deltalake(uri, pa.table({
            "event_id": [f"e-{text}" for text in loads], "load_tstamp": pa.array(stamps, pa.timestamp("us", "UTC")),
            "load_date": pa.array([stamp.date() for stamp in stamps], pa.date32()),
        }), mode="append", partition_by=["load_date"])
    # files: 03-01 [09:00]; 03-05 [08:00, 09:00]; 03-05 [10:00, 12:00]; 03-06 [07:00]
    assert rows_within(uri, settings, datetime(2024, 3, 5, 9, 30), datetime(2024, 3, 6)) == 2
    assert rows_within(uri, settings, datetime(2024, 3, 5), datetime(2024, 3, 6, 12)) == 5
    assert rows_within(uri, settings, datetime(2024, 2, 28), datetime(2024, 3, 7)) == 6
    assert rows_within(uri, settings, datetime(2024, 3, 6, 8), datetime(2024, 3, 7)) == 0
