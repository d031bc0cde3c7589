"""The Dagster definitions load, and the incremental job holds the base chain and the incremental assets."""

import subprocess
import sys

from incremental_assets.definitions import defs
from incremental_assets.names import INCREMENTAL_JOB


def test_definitions_resolve():
    job = defs.resolve_job_def(INCREMENTAL_JOB)
    names = {key.path[-1] for key in job.asset_layer.selected_asset_keys}
    assert {"new_event_limits", "sessions_lifecycle_manifest", "quarantined_sessions", "events_this_run",
            "filtered_events", "sessions"} <= names
    assert defs.resolve_job_def("sample_load_job")


def test_dagster_validates_the_workspace():
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_source_sensor_requests_one_run_per_new_source_version(spark, warehouse):
    from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.environment import source_table_uri
    from incremental_assets.sensors import source_events_sensor

    instance = DagsterInstance.ephemeral()
    assert isinstance(source_events_sensor(build_sensor_context(instance=instance)), SkipReason)
    spark.range(3).write.format("delta").save(source_table_uri())
    context = build_sensor_context(instance=instance)
    request = source_events_sensor(context)
    assert isinstance(request, RunRequest) and request.run_key == "source-version-0"
    again = source_events_sensor(build_sensor_context(instance=instance, cursor=context.cursor))
    assert isinstance(again, SkipReason) and "unchanged" in again.skip_message


def test_daily_sensor_requests_each_range_of_marked_days_once(spark, warehouse):
    from datetime import date

    from dagster import DagsterInstance, build_sensor_context

    from incremental_assets.logic.days import PROCESSED, TO_PROCESS, DayStatus
    from incremental_assets.resources.manifests import ManifestResource
    from incremental_assets.sensors import daily_partitions_sensor

    days = [(date(2024, 3, 1), TO_PROCESS), (date(2024, 3, 2), TO_PROCESS), (date(2024, 3, 3), PROCESSED),
            (date(2024, 3, 4), TO_PROCESS)]
    ManifestResource().save_days([DayStatus(day, status=status) for day, status in days], consumed_version=0)
    requests = daily_partitions_sensor(build_sensor_context(instance=DagsterInstance.ephemeral()))
    ranges = [(r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"]) for r in requests]
    assert ranges == [("2024-03-01", "2024-03-02"), ("2024-03-04", "2024-03-04")]
    assert len({r.run_key for r in requests}) == 2 and all(r.run_key.endswith("manifest-v0") for r in requests)
