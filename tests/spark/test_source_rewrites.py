"""The source's owner rewriting it (a DELETE for an erasure, an UPDATE, a compaction, a MERGE) commits
files that copy rows it already held: none of them arrives. Rows new to the table do, whichever
commit brings them: a MERGE's inserts, an append, and an append that later rewrites copy on.
Counted as runs count them (`arrived_since`, from the Delta log, no JVM), over tables that Spark
and delta-rs rewrite."""

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import deltalake
import pyarrow as pa
from delta.tables import DeltaTable

from incremental_assets.lib.delta.log import Snapshot, snapshot
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.source.arrivals import Arrival, ArrivalBounds, Arrivals
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA, arrived_since
from incremental_assets.lib.source.loader import write_events

# Every row below is loaded before the next standard window starts: behind the cursor.
BOUNDS = ArrivalBounds(start=datetime(2024, 1, 1), now=datetime(2024, 3, 10), next_lower=datetime(2024, 3, 5))


def events(prefix: str, n: int, loaded: datetime) -> list[tuple]:
    """`n` events `prefix-0`, ... loaded a minute apart from `loaded`."""
    rows = []
    for i in range(n):
        at = loaded + timedelta(minutes=i)
        values = {"event_id": f"{prefix}-{i}", "app_id": "website", "event_name": "page_view", "collector_tstamp": at,
                  "dvce_created_tstamp": at, "dvce_sent_tstamp": at, "derived_tstamp": at, "load_tstamp": at,
                  "domain_sessionid": prefix, "domain_userid": "u"}
        rows.append(tuple(values.get(name) for name in SAMPLE_SCHEMA.fieldNames()) + (at.date(),))
    return rows


def arrived(uri: str, since: Snapshot) -> Arrivals:
    return arrived_since(uri, since, BOUNDS, "load_tstamp")[1]


def behind(rows: int, first: datetime, last: datetime) -> Arrivals:
    return Arrivals({Arrival.BEHIND: rows}, first, last)


def now(uri: str) -> Snapshot:
    return snapshot(deltalake.DeltaTable(uri))


def vacuumed(uri: str) -> dict:
    """What VACUUM does to the latest commit's removed files (they go), and that commit's metrics."""
    version = deltalake.DeltaTable(uri).version()
    actions = [json.loads(line) for line in (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    for action in actions:
        if "remove" in action:
            (Path(uri) / action["remove"]["path"]).unlink()
    return next(action["commitInfo"]["operationMetrics"] for action in actions if "commitInfo" in action)


def test_spark_rewrites_arrive_as_nothing_and_new_rows_among_them_arrive(spark, tmp_path):
    uri = str(tmp_path / "source")
    write_events(spark, events_frame(spark, events("a", 20, datetime(2024, 3, 1, 9))), uri)
    write_events(spark, events_frame(spark, events("b", 20, datetime(2024, 3, 2, 9))), uri)
    assessed = now(uri)  # what the last run saw: 40 rows, all of them held from here on
    table = DeltaTable.forPath(spark, uri)

    table.delete("event_id = 'a-3'")  # an erasure
    table.update("event_id = 'b-4'", {"page_url": "'https://example.com/'"})
    assert arrived(uri, assessed) == Arrivals(), "rewrites of held rows: nothing arrived"
    table.optimize().executeCompaction()
    assert arrived(uri, assessed) == Arrivals()

    # A MERGE that updates two held rows, copies the rest of their file and inserts k = 3 new rows.
    source = events_frame(spark, events("a", 2, datetime(2024, 3, 1, 9)) + events("m", 3, datetime(2024, 3, 1, 12)))
    table.alias("t").merge(source.alias("s"), "t.event_id = s.event_id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    assert arrived(uri, assessed) == behind(3, datetime(2024, 3, 1, 12), datetime(2024, 3, 1, 12, 2))
    merged = now(uri)

    # An append, then rewrites that copy its rows on with held ones: they still arrived, once.
    write_events(spark, events_frame(spark, events("c", 2, datetime(2024, 3, 3, 9))), uri)
    appended = now(uri)
    table.update("event_id IN ('c-0', 'a-5')", {"page_title": "'rewritten'"})
    table.optimize().executeCompaction()
    assert arrived(uri, merged) == behind(2, datetime(2024, 3, 3, 9), datetime(2024, 3, 3, 9, 1))
    assert arrived(uri, assessed) == behind(5, datetime(2024, 3, 1, 12), datetime(2024, 3, 3, 9, 1))
    assert arrived(uri, appended) == Arrivals(), "the run that saw the append counted it"

    # VACUUM took the files a rewrite removed: its metrics decide. A DELETE inserts nothing...
    before = now(uri)
    table.delete("event_id = 'b-7'")
    assert vacuumed(uri)["numCopiedRows"] != "0"
    assert arrived(uri, before) == Arrivals()
    # ... a MERGE that inserted rows is counted whole, more than arrived, never fewer: the 19 rows of
    # the b file it rewrote for b-8, and the one it inserted.
    before = now(uri)
    source = events_frame(spark, events("b", 9, datetime(2024, 3, 2, 9))[8:] + events("n", 1, datetime(2024, 3, 4)))
    table.alias("t").merge(source.alias("s"), "t.event_id = s.event_id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    assert vacuumed(uri)["numOutputRows"] == "20"
    assert arrived(uri, before) == behind(20, datetime(2024, 3, 2, 9), datetime(2024, 3, 4))


def test_delta_rs_rewrites_arrive_as_nothing_and_its_vacuum_leaves_its_metrics(tmp_path):
    """The same without a JVM, as an owner using deltalake rewrites: its metrics are named otherwise."""
    uri = str(tmp_path / "source")
    loaded = datetime(2024, 3, 1, 9, tzinfo=timezone.utc)

    def rows(prefix: str, n: int, first: datetime) -> pa.Table:
        return pa.table({"event_id": [f"{prefix}-{i}" for i in range(n)],
                         "load_tstamp": pa.array([first + timedelta(minutes=i) for i in range(n)], pa.timestamp("us", "UTC")),
                         "page_url": pa.array([None] * n, pa.string())})

    deltalake.write_deltalake(uri, rows("a", 10, loaded))
    assessed = now(uri)
    deltalake.DeltaTable(uri).delete("event_id = 'a-3'")
    deltalake.DeltaTable(uri).update(predicate="event_id = 'a-4'", updates={"page_url": "'https://example.com/'"})
    deltalake.DeltaTable(uri).optimize.compact()
    assert arrived(uri, assessed) == Arrivals()

    merge = pa.concat_tables([rows("a", 1, loaded), rows("m", 2, loaded + timedelta(hours=3))])  # a-0 held, 2 new
    (deltalake.DeltaTable(uri).merge(merge, "s.event_id = t.event_id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    deltalake.write_deltalake(uri, rows("c", 1, loaded + timedelta(days=1)), mode="append")
    assert arrived(uri, assessed) == behind(3, datetime(2024, 3, 1, 12), datetime(2024, 3, 2, 9))

    before = now(uri)
    deltalake.DeltaTable(uri).delete("event_id = 'a-5'")
    deltalake.DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert arrived(uri, before) == Arrivals(), "gone: its num_copied_rows and no insert say copies only"
