"""The Dagster definitions load, and the incremental job holds the base chain and the incremental assets."""

import subprocess
import sys

from incremental_assets.definitions import defs
from incremental_assets.incremental import INCREMENTAL_JOB


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
