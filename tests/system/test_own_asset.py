"""A user's own incremental asset is one new file under `defs/incremental/` and nothing else: from a
copy of the package with that file added, the asset is in the code location's incremental job (so
its sensor and schedule), in `preview`, in a real run of `incremental-assets run`, and among the
tables `refresh` empties; preview and the run it predicts agree on the state and window."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from deltalake import DeltaTable

import incremental_assets

OWN_ASSET = '''
"""Page views per user in this run's sessions: a user's own incremental asset."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.incremental.asset import incremental_asset
from incremental_assets.lib.incremental.limits import RunLimits


@incremental_asset(write_mode="upsert", keys=["user_identifier"], one_row_per_key=True)
def page_views_per_user(events: DataFrame, limits: RunLimits) -> DataFrame:
    """Page views per user (recomputed over the run's sessions)."""
    return events.where(F.col("event_name") == "page_view").groupBy("user_identifier").agg(F.count("*").alias("page_views"))
'''

WHERE = (
    "from incremental_assets.cli.runner import incremental_of\n"
    "from incremental_assets.definitions import defs\n"
    "from incremental_assets.lib.catalog import refreshed_tables\n"
    "from incremental_assets.lib.settings import load_settings\n"
    "job = defs.resolve_job_def('incremental_job')\n"
    "print('job:', sorted(k.path[-1] for k in job.asset_layer.selected_asset_keys))\n"
    "print('sensor:', defs.get_sensor_def('source_events_sensor').job_name)\n"
    "print('schedule:', defs.get_schedule_def('hourly_incremental_run').job_name)\n"
    "print('refresh:', refreshed_tables(incremental_of(load_settings())))\n"
)


def test_an_asset_added_as_one_file_runs_everywhere_the_built_in_ones_do(tmp_path):
    package = tmp_path / "code" / "incremental_assets"
    shutil.copytree(Path(incremental_assets.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "defs" / "incremental" / "page_views_per_user.py").write_text(OWN_ASSET)
    warehouse = tmp_path / "warehouse"
    env = {
        **os.environ, "PYTHONPATH": str(tmp_path / "code"), "INCREMENTAL_ASSETS_WAREHOUSE": str(warehouse),
        "DAGSTER_HOME": str(tmp_path / "home"), "INCREMENTAL_ASSETS_CONFIG": os.devnull,
        "INCREMENTAL_ASSETS_START_DATE": "2024-03-01", "INCREMENTAL_ASSETS_BACKFILL_LIMIT_DAYS": "1",
    }
    (tmp_path / "home").mkdir()
    # (run from tmp_path: `python -c` and `-m` put the working directory first on the path)

    def cli(*args, module="incremental_assets"):
        result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    where = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert re.search(r"^job: .*'page_views_per_user'", where.stdout, re.M)
    assert "sensor: incremental_job" in where.stdout and "schedule: incremental_job" in where.stdout
    assert re.search(r"^refresh: .*'page_views_per_user'", where.stdout, re.M)
    assert str(tmp_path) in subprocess.run(
        [sys.executable, "-c", "import incremental_assets; print(incremental_assets.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path).stdout, "the copy, not the installed package, is imported"

    cli("generate", "--start-date", "2024-03-01", "--days", "2", "--events-per-day", "300", "--users", "10")
    predicted = cli("preview")
    assert "Incremental assets: filtered_events, page_views_per_user, sessions" in predicted
    assert "No data in manifest. Processing data from start_date" in predicted
    window = re.search(r"Processing data between '(.+)' and '(.+)'", predicted).groups()

    ran = cli("run")
    assert re.search(rf"first_run\s+\[{re.escape(window[0])} \.\. {re.escape(window[1])}\]", ran), (predicted, ran)
    # backfill_limit_days 1 over two days of events: the one run says what it left and how to go on
    assert re.search(r"^Not caught up: .* Run again, or: incremental-assets run --until-caught-up$", ran, re.M), ran

    stored = DeltaTable(str(warehouse / "page_views_per_user")).to_pyarrow_table().to_pylist()
    assert stored and all(row["page_views"] > 0 for row in stored)
    manifest = {row["model"]: row for row in DeltaTable(str(warehouse / "incremental_manifest")).to_pyarrow_table().to_pylist()}
    assert manifest["page_views_per_user"]["last_success"] == manifest["filtered_events"]["last_success"] is not None
