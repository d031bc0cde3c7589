"""Dagster's processes as the project's users start them: a home with the project's instance
settings, the repository's workspace, the daemon's ticks, a loader's next events, and waiting for
what they do."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from dagster import DagsterInstance
from pyspark.sql import functions as F

from incremental_assets.lib.environment import PROJECT_ROOT
from incremental_assets.lib.sample.stream import append_hours, next_batch

BIN = Path(sys.executable).parent
# A warm worker's start: its JVM, then its rehearsal (the pipeline twice on a sample). About 50 s on an
# idle machine; 181 s seen on a loaded one (benchmarks/comparisons.md, fresh clone of 93cde4b).
WORKER_START_S = 420


def a_home(tmp_path: Path, config: str = "dagster.yaml") -> Path:
    """A Dagster home with one of the project's instance settings (the pool, the run queue)."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / config, home / "dagster.yaml")
    return home


def a_workspace(tmp_path: Path) -> Path:
    """The project's code location, loaded as the repository's workspace.yaml loads it."""
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - python_module:\n      module_name: incremental_assets.definitions\n"
                         f"      working_directory: {PROJECT_ROOT}\n")
    return workspace


def ticks(instance: DagsterInstance, name: str) -> list:
    states = [s for s in instance.all_instigator_state() if s.name == name]
    return [tick for s in states for tick in instance.get_ticks(s.instigator_origin_id, s.selector_id)]


def append_events(spark, source: str) -> None:
    """The stream's next hours, up to the first that holds an event the source did not hold (a night
    hour may hold none, or only a duplicate of an earlier event, and a run over it stores nothing
    new), in one commit: a sensor that ticked between two commits would see two loads."""
    stored = spark.read.format("delta").load(source).select("event_id")
    for hours in range(1, 13):
        frame, _ = next_batch(spark, source, hours)
        if frame.where(F.col("event_id").isNotNull()).select("event_id").join(stored, "event_id", "left_anti").limit(1).count():
            append_hours(spark, source, hours)
            return
    raise AssertionError("twelve hours of the stream without a new event")


def wait_for(what, condition, seconds: float, told: Callable[[], str] = lambda: ""):
    """`condition`'s first truthy value within `seconds`; else fails with `what`, and what `told` says
    then (the runs, the logs: a wait that ran out on another machine leaves nothing else to read)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(5)
    raise AssertionError(f"not within {seconds:.0f} s: {what}\n{told()}")
