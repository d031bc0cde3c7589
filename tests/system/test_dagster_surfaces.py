"""Dagster's own surfaces obey the contract of the project's command line: a partition run of
Dagster's asset job (what a UI backfill and `dagster asset materialize` launch) takes and closes
the lease with its run-log records, and attributes follows it; the daemon, left alone, processes
new rows and rows behind the cursor into attributes, and launches nothing over a caught-up
warehouse."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

from dagster import AssetKey, DagsterInstance, evaluate_automation_conditions

from incremental_assets.cli.runner import run_days, run_until_caught_up
from incremental_assets.lib.catalog import ATTRIBUTES, DAILY_AGGREGATES
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.environment import PROJECT_ROOT
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.run_log import FAILED, PROCESSED, PROCESSING
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow
from tests.warehouse_tables import sample_source, scenario_environment

BIN = Path(sys.executable).parent
PARAMS = SampleParams(users=6, days=3, events_per_day=90, start_date=(utcnow() - timedelta(days=6)).date(), seed=11)
SETTINGS = {"start_date": PARAMS.start_date.isoformat()}


def rows_of(spark, table: str) -> list[tuple]:
    frame = read_table(spark, StateStore().uri(table))
    return sorted(tuple(row) for row in frame.select(*sorted(frame.columns)).collect())


def a_home(tmp_path: Path) -> Path:
    """A Dagster home with the project's instance settings (the pool, the run queue)."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    return home


def test_dagster_asset_materialize_of_a_partition_leaves_the_contracts_records_and_attributes_follow(spark, tmp_path):
    home = a_home(tmp_path)
    source = sample_source(spark, PARAMS, tmp_path)
    with scenario_environment(tmp_path / "warehouse", source, SETTINGS, home):
        settings, instance = IncrementalSettings(**SETTINGS), DagsterInstance.get()
        assert all(run.success for run in run_until_caught_up(settings, report=lambda line: None, instance=instance))
        from incremental_assets.definitions import build_definitions

        defs = build_definitions(settings)
        baseline = evaluate_automation_conditions(defs=defs, instance=instance)
        day = PARAMS.start_date.isoformat()
        materialize = subprocess.run(
            [BIN / "dagster", "asset", "materialize", "-m", "incremental_assets.definitions", "--select", DAILY_AGGREGATES,
             "--partition", day], capture_output=True, text=True, timeout=600, env=os.environ,
        )
        assert materialize.returncode == 0, materialize.stderr[-3000:]
        [run] = instance.get_runs(limit=1)
        assert run.job_name == "__ASSET_JOB"
        statuses = [(r["asset"], r["status"]) for r in StateStore().run_log(run_id=run.run_id)]
        assert statuses == [(DAILY_AGGREGATES, PROCESSING), (DAILY_AGGREGATES, PROCESSED)]

        # The automation sensor's condition asks for attributes now that daily_aggregates changed ...
        after = evaluate_automation_conditions(defs=defs, instance=instance, cursor=baseline.cursor)
        assert after.get_requested_partitions(AssetKey(ATTRIBUTES)) == {None}
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={AssetKey(ATTRIBUTES)})
        follow = job.execute_in_process(instance=instance, raise_on_error=False)
        assert follow.success
        # ... and the next writer found the lease of `dagster asset materialize` closed: nothing Failed.
        assert FAILED not in {r["status"] for r in StateStore().run_log()}
        assert [r["status"] for r in StateStore().run_log(run_id=follow.run_id)] == [PROCESSING, PROCESSED]
        through_dagster = rows_of(spark, ATTRIBUTES)

        # What the project's own backfill of the same day leaves.
        first = date.fromisoformat(day)
        assert run_days(settings, first, first, instance).success
        assert rows_of(spark, ATTRIBUTES) == through_dagster
