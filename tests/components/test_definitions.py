"""The Dagster definitions load, and the incremental job holds the base chain and the incremental assets."""

import os
import subprocess
import sys

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


def test_incremental_and_daily_runs_queue_behind_each_other():
    """Both jobs write the daily manifest: dagster.yaml lets one run with their shared tag at a time."""
    import yaml

    from incremental_assets.lib.catalog import DAILY_JOB
    from incremental_assets.lib.environment import PROJECT_ROOT

    limits = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())["run_queue"]["tag_concurrency_limits"]
    [(key, value)] = defs.resolve_job_def(INCREMENTAL_JOB).tags.items() & defs.resolve_job_def(DAILY_JOB).tags.items()
    assert {"key": key, "value": value, "limit": 1} in limits


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
