"""The instance's SQLite storage that keeps its engines (lib/instance_storage.py) against Dagster's own:
the same runs stored the same way, in files either one opens, one engine per file."""

import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from dagster import (
    AssetCheckResult,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    DailyPartitionsDefinition,
    MaterializeResult,
    RunsFilter,
    asset,
    asset_check,
    materialize,
)
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, SensorInstigatorData
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from incremental_assets.lib import instance_storage
from incremental_assets.lib.environment import PROJECT_ROOT

DAYS = DailyPartitionsDefinition(start_date="2026-01-01")


@asset(partitions_def=DAYS)
def counted(context) -> MaterializeResult:
    return MaterializeResult(metadata={"day": context.partition_key, "rows": len(context.partition_key)})


@asset(deps=[counted])
def summary() -> MaterializeResult:
    return MaterializeResult(metadata={"rows": 3})


@asset_check(asset=summary)
def summary_has_rows() -> AssetCheckResult:
    return AssetCheckResult(passed=True, metadata={"checked": 1})


def home(path, storage: str):
    """A DAGSTER_HOME in `path` whose storage is Dagster's own ("dagster") or the project's block."""
    path.mkdir(exist_ok=True)
    project = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())["storage"]
    block = {"sqlite": {"base_dir": str(path)}} if storage == "dagster" else project
    (path / "dagster.yaml").write_text(yaml.safe_dump({"storage": block, "telemetry": {"enabled": False}}))
    return path


def instance_in(path, monkeypatch) -> DagsterInstance:
    monkeypatch.setenv("DAGSTER_HOME", str(path))
    return DagsterInstance.get()


def sensor_state(name: str) -> InstigatorState:
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file=__file__), location_name="here")
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, "repo"), name)
    return InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING, SensorInstigatorData(cursor="c-1"))


def write_history(instance: DagsterInstance) -> None:
    for day in ("2026-01-01", "2026-01-02"):
        assert materialize([counted], instance=instance, partition_key=day).success
    assert materialize([counted.to_source_asset(), summary, summary_has_rows], instance=instance, selection=[summary]).success
    instance.add_instigator_state(sensor_state("daily_sensor"))
    instance.run_storage.set_cursor_values({"cursor": "42"})


def history(instance: DagsterInstance) -> dict:
    """What the instance holds, without ids and times: runs, their events, the assets' index, the
    check, the sensor state, the cursor."""
    runs = sorted(instance.get_runs(RunsFilter()), key=lambda r: (r.job_name, str(r.tags.get("dagster/partition"))))
    events = {
        (run.job_name, run.tags.get("dagster/partition")): [
            (e.dagster_event_type, e.step_key) for e in instance.all_logs(run.run_id) if e.dagster_event
        ]
        for run in runs
    }
    materialized = [
        (r.asset_key, r.partition_key, {k: v.value for k, v in r.asset_materialization.metadata.items()})
        for key in (AssetKey("counted"), AssetKey("summary"))
        for r in instance.fetch_materializations(key, limit=100).records
    ]
    check_key = summary_has_rows.check_key
    checks = [r.status for r in instance.event_log_storage.get_asset_check_execution_history(check_key, limit=10)]
    return {
        "runs": [(r.job_name, r.status, r.tags.get("dagster/partition")) for r in runs],
        "events": events,
        "materialized": sorted(materialized, key=str),
        "partitions": instance.get_materialized_partitions(AssetKey("counted")),
        "checks": checks,
        "sensors": [(s.name, s.status, s.instigator_data.cursor) for s in instance.all_instigator_state()],
        "cursor": instance.run_storage.get_cursor_values({"cursor"}),
    }


def test_the_projects_storage_stores_what_dagsters_stores(tmp_path, monkeypatch):
    theirs = instance_in(home(tmp_path / "dagster", "dagster"), monkeypatch)
    ours = instance_in(home(tmp_path / "project", "project"), monkeypatch)
    assert type(ours.event_log_storage) is instance_storage.EventLogKeepingEngines
    assert type(theirs.event_log_storage).__name__ == "SqliteEventLogStorage"
    write_history(theirs)
    write_history(ours)
    expected = history(theirs)
    assert len(expected["runs"]) == 3 and expected["partitions"] == {"2026-01-01", "2026-01-02"}
    assert expected["checks"] and expected["sensors"] == [("daily_sensor", InstigatorStatus.RUNNING, "c-1")]
    assert history(ours) == expected
    # the same files in the same places (Dagster's default layout; a run's file is named by its id)
    assert layout(tmp_path / "project") == layout(tmp_path / "dagster")


def layout(root) -> list[tuple[str, ...]]:
    return sorted(path.relative_to(root).parts[:2] for path in root.rglob("*.db"))


@pytest.mark.parametrize("written_by, read_by", [("dagster", "project"), ("project", "dagster")])
def test_a_home_written_by_one_storage_is_read_and_extended_by_the_other(tmp_path, monkeypatch, written_by, read_by):
    """An earlier release's home (Dagster's storage) given the project's block, or the way back."""
    path = home(tmp_path / "home", written_by)
    write_history(instance_in(path, monkeypatch))
    before = history(instance_in(path, monkeypatch))
    reread = instance_in(home(path, read_by), monkeypatch)
    assert history(reread) == before
    assert materialize([counted], instance=reread, partition_key="2026-01-03").success
    assert reread.get_materialized_partitions(AssetKey("counted")) == {"2026-01-01", "2026-01-02", "2026-01-03"}


def test_a_run_makes_one_engine_per_file_not_one_per_connection(tmp_path, monkeypatch):
    instance = instance_in(home(tmp_path / "home", "project"), monkeypatch)
    assert materialize([counted], instance=instance, partition_key="2026-01-01").success  # the index, runs.db
    instance_storage.kept_engine.cache_clear()
    assert materialize([counted], instance=instance, partition_key="2026-01-02").success
    run = instance.get_runs(limit=1)[0]
    assert len(instance.all_logs(run.run_id)) > 10
    # runs.db, the index and the run's own file: three engines for every connection the run made
    assert instance_storage.kept_engine.cache_info().misses == 3
    assert instance_storage.kept_engine.cache_info().hits > 30


WRITER = textwrap.dedent("""
    import sys
    from dagster import DagsterInstance, materialize
    from tests.components.test_instance_storage import counted
    instance = DagsterInstance.get()
    for day in sys.argv[1:]:
        assert materialize([counted], instance=instance, partition_key=day).success
""")


def test_two_processes_write_one_home_at_once(tmp_path, monkeypatch):
    """SQLite's busy timeout is Dagster's with the kept engines: two processes storing runs and
    events at the same time both finish, and every run is stored whole."""
    path = home(tmp_path / "home", "project")
    instance_in(path, monkeypatch)  # creates the files first, as the command line does under its lock
    days = [[f"2026-02-{d:02d}" for d in range(1, 8)], [f"2026-03-{d:02d}" for d in range(1, 8)]]
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, *batch], cwd=PROJECT_ROOT, env=dict(os.environ))
        for batch in days
    ]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    instance = DagsterInstance.get()
    assert instance.get_materialized_partitions(AssetKey("counted")) == {d for batch in days for d in batch}
    for run in instance.get_runs():
        types = [e.dagster_event_type for e in instance.all_logs(run.run_id) if e.dagster_event]
        assert types[-1] == DagsterEventType.RUN_SUCCESS and DagsterEventType.ASSET_MATERIALIZATION in types
