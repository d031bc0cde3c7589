"""Table maintenance on real Delta tables: small files compacted where new ones landed, rows
unchanged, history kept for the retention; a retention shorter than a week is refused."""

import json
from datetime import date, datetime, timedelta, timezone

import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets.definitions import build_definitions
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.delta.spec import WriteMode
from incremental_assets.lib.delta.write import WriteRequest, create_with_change_feed, write
from incremental_assets.lib.upkeep.maintenance import UnreadChange, maintain, oldest_unread_change
from incremental_assets.lib.settings import IncrementalSettings, SettingsError
from incremental_assets.lib.state.records import DayStatus
from incremental_assets.lib.state.store import StateStore


def _maintain(settings):
    result = build_definitions(settings).resolve_job_def("maintenance_job").execute_in_process(
        instance=DagsterInstance.ephemeral()
    )
    assert result.success
    [event] = [e for e in result.all_events if e.is_successful_output]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}


def test_many_small_writes_are_compacted_to_a_file_per_partition_and_the_rows_stay(spark, warehouse):
    uri = f"{warehouse}/sessions_lifecycle_manifest"
    schema = "session_identifier string, start_date date"
    for i in range(6):  # six hourly MERGEs' worth of small files over two days
        rows = spark.createDataFrame([(f"s{i}", date(2024, 3, 1 + i % 2))], schema)
        write(spark, rows, WriteRequest(uri, WriteMode.APPEND, partition_by=["start_date"]))
    before = sorted(map(tuple, read_table(spark, uri).collect()))
    assert len(DeltaTable(uri).file_uris()) == 6

    settings = IncrementalSettings(start_date="2024-03-01")
    first = _maintain(settings)
    assert (first["files_before"], first["files_after"]) == (6, 2)
    assert sorted(map(tuple, read_table(spark, uri).collect())) == before
    # written without the project's table properties, as an earlier release made its tables: the
    # first pass gives it the log checkpoints every table is now made with
    assert "| sessions_lifecycle_manifest | 6 | 2 | 2024-03-01 | True | log checkpointed every ten commits from now |" in first["tables"]
    assert DeltaTable(uri).metadata().configuration["delta.checkpointInterval"] == "10"

    # One more small write: only its partition (from 2 March on) is compacted next time.
    write(spark, spark.createDataFrame([("s6", date(2024, 3, 2))], schema), WriteRequest(uri, WriteMode.APPEND, partition_by=["start_date"]))
    second = _maintain(settings)
    assert "| sessions_lifecycle_manifest | 3 | 2 | 2024-03-02 | True |  |" in second["tables"]
    assert [r["status"] for r in StateStore().run_log() if r["asset"] == "sessions_lifecycle_manifest"][-2:] == [
        "Processing", "Processed"
    ]


def test_filtered_events_keep_their_change_feed_until_the_daily_manifest_has_read_it(spark, warehouse):
    uri = f"{warehouse}/filtered_events"
    schema = "event_id string, event_date date"
    create_with_change_feed(spark, uri, spark.createDataFrame([], schema).schema, ["event_date"])
    write(spark, spark.createDataFrame([("e1", date(2024, 3, 1))], schema), WriteRequest(uri, WriteMode.APPEND))
    state = StateStore()
    [appended] = [c for c in DeltaTable(uri).history() if c["version"] == 1]  # the first commit that wrote rows
    committed = datetime.fromtimestamp(appended["timestamp"] / 1000, timezone.utc).replace(tzinfo=None)
    assert oldest_unread_change(state) == UnreadChange(1, committed)
    a_month_later = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(days=30)
    kept = maintain(state, "filtered_events", 168, a_month_later)
    assert not kept.vacuumed and f"has not read the change feed of commit 1 ({committed}) yet" in kept.note

    # The pass committed the log checkpoints' property (version 2): a commit without a change feed,
    # which does not hold VACUUM back once the manifest has counted version 1.
    assert DeltaTable(uri).version() == 2 and "log checkpointed every ten commits" in kept.note
    state.save_days([DayStatus(date(2024, 3, 1), processed_events=1)], consumed_version=1)
    assert oldest_unread_change(state) is None
    assert maintain(state, "filtered_events", 168, a_month_later).vacuumed


def test_a_retention_shorter_than_a_week_is_refused_before_anything_runs():
    with pytest.raises(SettingsError, match="maintenance_retention_hours must be >= 168"):
        IncrementalSettings(maintenance_retention_hours=24)


def test_a_table_named_in_maintenance_zorder_by_is_z_ordered_and_an_unknown_one_is_refused(spark, warehouse):
    uri = f"{warehouse}/sessions_lifecycle_manifest"
    schema = "session_identifier string, start_date date"
    for i in range(3):
        rows = spark.createDataFrame([(f"s{i}", date(2024, 3, 1))], schema)
        write(spark, rows, WriteRequest(uri, WriteMode.APPEND, partition_by=["start_date"]))
    zorder = {"sessions_lifecycle_manifest": ["session_identifier"]}
    assert _maintain(IncrementalSettings(start_date="2024-03-01", maintenance_zorder_by=zorder))["files_after"] == 1
    [optimized] = [c for c in DeltaTable(uri).history() if c["operation"] == "OPTIMIZE"]
    assert optimized["operationMetrics"]["plannerStrategy"] == "zOrder"
    assert json.loads(optimized["zOrderBy"]) == ["session_identifier"]

    unknown = IncrementalSettings(start_date="2024-03-01", maintenance_zorder_by={"no_such_table": ["x"]})
    result = build_definitions(unknown).resolve_job_def("maintenance_job").execute_in_process(
        instance=DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success and "no_such_table" in str(result.all_events)
    with pytest.raises(SettingsError, match="maintenance_zorder_by"):
        IncrementalSettings(maintenance_zorder_by={"filtered_events": []})
