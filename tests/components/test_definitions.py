"""The Dagster definitions load, and the incremental job holds the base chain and the incremental assets."""

import os
import subprocess
import sys

import yaml

from incremental_assets.definitions import defs
from incremental_assets.lib.catalog import INCREMENTAL_JOB


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


def test_every_writer_of_the_warehouse_is_in_the_one_writer_pool_with_the_run_log_hooks():
    """Whichever job runs them (the project's, Dagster's own asset job for a UI backfill or `dagster
    asset materialize`, a sensor's, automation's), the queue starts one run of the pool at a time
    (dagster.yaml: run granularity, limit 1) and the run log's hooks close each asset's records."""
    import yaml

    from incremental_assets.lib.catalog import BY_NAME, WAREHOUSE_POOL
    from incremental_assets.lib.environment import PROJECT_ROOT

    pools = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())["concurrency"]["pools"]
    assert pools == {"granularity": "run", "default_limit": 1}
    writers = [node for node in defs.resolve_asset_graph().assets_defs if node.keys]
    assert {key.path[-1] for node in writers for key in node.keys} == {name for name, t in BY_NAME.items() if t.group}
    for node in writers:
        assert node.node_def.pool == WAREHOUSE_POOL, node.keys
        assert {hook.name for hook in node.hook_defs} == {"record_outcome"}, node.keys
    for job in ("refresh_job", "apply_plan_job", "maintenance_job"):
        assert {op.definition.pool for op in defs.resolve_job_def(job).graph.node_dict.values()} == {WAREHOUSE_POOL}


def test_the_postgres_instance_is_the_projects_with_its_storage_in_postgres():
    """dagster.postgres.yaml keeps every block the project relies on (the run queue, the one-writer
    pool, the warm worker's launcher) as dagster.yaml has them."""
    import yaml

    from incremental_assets.lib.environment import PROJECT_ROOT

    local, production = (yaml.safe_load((PROJECT_ROOT / name).read_text()) for name in ("dagster.yaml", "dagster.postgres.yaml"))
    storage = production.pop("storage")
    assert local.pop("storage")["custom"]["module"] == "incremental_assets.lib.instance_storage"
    assert production == local
    assert set(storage) == {"postgres"} and storage["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"


def test_a_dagster_home_gets_the_projects_config_only_where_it_has_none_and_says_which_is_in_force(tmp_path, monkeypatch):
    from incremental_assets.lib.environment import PROJECT_ROOT, dagster_home, instance_config

    fresh, own = tmp_path / "fresh", tmp_path / "own"
    own.mkdir()
    operators = (PROJECT_ROOT / "dagster.postgres.yaml").read_text().replace("max_concurrent_runs: 2", "max_concurrent_runs: 5")
    (own / "dagster.yaml").write_text(operators)
    monkeypatch.setenv("DAGSTER_HOME", str(fresh))
    assert dagster_home() == fresh and (fresh / "dagster.yaml").read_text() == (PROJECT_ROOT / "dagster.yaml").read_text()
    assert instance_config(fresh) == f"{fresh / 'dagster.yaml'} (the project's; storage: sqlite)"
    monkeypatch.setenv("DAGSTER_HOME", str(own))
    assert dagster_home() == own and (own / "dagster.yaml").read_text() == operators
    assert instance_config(own) == f"{own / 'dagster.yaml'} (its own, left as it is; storage: postgres)"
    legacy = "run_storage:\n  module: dagster_postgres.run_storage\n  class: PostgresRunStorage\n"
    (own / "dagster.yaml").write_text(legacy)  # Dagster's older form, one block per storage
    assert instance_config(own).endswith("(its own, left as it is; storage: PostgresRunStorage)")


# An earlier release's dagster.yaml: a tag limit on a tag no run carries now, no pool, Dagster's launcher.
EARLIER_RELEASE = """
telemetry:
  enabled: false
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: 2
    tag_concurrency_limits:
      - key: incremental_assets/writes
        limit: 1
"""


def test_an_upgraded_homes_dagster_yaml_is_named_with_what_it_lacks_and_left_as_it_is(tmp_path, monkeypatch, capsys):
    from incremental_assets.cli import _instance_advice
    from incremental_assets.lib.environment import PROJECT_ROOT, instance_advice, instance_gaps

    for project in ("dagster.yaml", "dagster.postgres.yaml"):
        assert instance_gaps(yaml.safe_load((PROJECT_ROOT / project).read_text())) == []
    gaps = instance_gaps(yaml.safe_load(EARLIER_RELEASE))
    assert [gap.split(" ", 1)[0] for gap in gaps] == ["concurrency.pools", "run_launcher", "run_coordinator's"]
    (tmp_path / "dagster.yaml").write_text(EARLIER_RELEASE)
    advice = instance_advice(tmp_path)
    assert advice.startswith(f"{tmp_path / 'dagster.yaml'} lacks what the project needs: concurrency.pools")
    assert f"Merge those blocks from {PROJECT_ROOT / 'dagster.yaml'}" in advice
    _instance_advice(tmp_path)  # what setup and run print
    assert capsys.readouterr().out == f"note: {advice}\n"
    assert (tmp_path / "dagster.yaml").read_text() == EARLIER_RELEASE
    (tmp_path / "dagster.yaml").write_text((PROJECT_ROOT / "dagster.yaml").read_text())
    assert instance_advice(tmp_path) is None


def test_definitions_load_against_a_missing_warehouse_and_read_nothing(tmp_path):
    script = (
        "import deltalake, pyspark.sql\n"
        "def refuse(*a, **k): raise AssertionError('loading the definitions read storage')\n"
        "deltalake.DeltaTable.__init__ = refuse\n"
        "pyspark.sql.SparkSession.Builder.getOrCreate = refuse\n"
        "from incremental_assets.definitions import defs\n"
        "from incremental_assets.lib.catalog import DAILY_AGGREGATES\n"
        "for job in ('incremental_job', 'daily_job'): defs.resolve_job_def(job)\n"
        "daily = defs.resolve_assets_def(DAILY_AGGREGATES)\n"
        "print(daily.partitions_def.start.date())\n"
    )
    missing = tmp_path / "no" / "such" / "warehouse"
    env = {
        **os.environ, "INCREMENTAL_ASSETS_WAREHOUSE": str(missing), "INCREMENTAL_ASSETS_SOURCE": str(missing / "src"),
        "INCREMENTAL_ASSETS_START_DATE": "2023-05-01", "INCREMENTAL_ASSETS_CONFIG": os.devnull,
    }
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "2023-05-01", "the first day comes from the settings"
    assert not missing.exists()



def test_a_step_logs_its_run_log_hook_once_and_no_skipped_hook(warehouse):
    """One hook records either outcome: a success hook and a failure hook each logged HOOK_SKIPPED
    for every step, as the other's outcome."""
    from dagster import DagsterEventType, DagsterInstance, materialize

    from incremental_assets.lib.assets import spark_delta_asset
    from incremental_assets.lib.state.store import StateStore

    @spark_delta_asset(name="probe")
    def probe():
        return None

    instance = DagsterInstance.ephemeral()
    result = materialize([probe], resources={"state": StateStore()}, instance=instance)
    assert result.success
    assert not instance.all_logs(result.run_id, of_type=DagsterEventType.HOOK_SKIPPED)
    assert len(instance.all_logs(result.run_id, of_type=DagsterEventType.HOOK_COMPLETED)) == 1
