"""The warm worker's decisions, without Spark: which runs it takes, when the launcher falls back to
a process of the run's own, and how run monitoring sees a worker's run."""

from __future__ import annotations

import os
import sys
import socket
import subprocess

import pytest
from dagster import DagsterInstance, DagsterRun
from dagster._core.launcher import WorkerStatus

from incremental_assets.cli.serve import Worker
from incremental_assets.lib.catalog import WORKER_TAG
from incremental_assets.lib.worker import WarmRunLauncher, address_file, hand_over, serving


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def worker(home, tmp_path):
    code = tmp_path / "package"
    code.mkdir()
    (code / "assets.py").write_text("x = 1\n")
    worker = Worker(DagsterInstance.ephemeral(), code_root=code, report=lambda line: None)
    worker.listen()
    yield worker
    worker.server.shutdown()
    worker.server.server_close()


def test_no_worker_serving_means_the_run_gets_a_process_of_its_own(home):
    assert hand_over("run-1", home) == (None, "no warm worker is serving")


def test_a_worker_whose_process_is_gone_is_not_serving(home):
    gone = subprocess.Popen(["true"])
    gone.wait()
    address_file(home).write_text(f'{{"pid": {gone.pid}, "host": "127.0.0.1", "port": 1, "code": "x"}}')
    assert serving(home) is None
    assert hand_over("run-1", home)[0] is None


def test_the_worker_takes_one_run_at_a_time(worker, home):
    taken, why_not = hand_over("run-1", home)
    assert taken["pid"] == os.getpid() and why_not == ""
    assert worker.runs.get_nowait() == "run-1"
    assert hand_over("run-2", home) == (None, "the warm worker is executing another run")
    worker.busy.release()  # what the main thread does when run-1 has ended
    assert hand_over("run-3", home)[0] is not None


def test_after_an_edit_the_worker_takes_no_run_and_restarts(worker, home, tmp_path):
    (tmp_path / "package" / "assets.py").write_text("x = 2  # an edit, or a deploy\n")
    taken, why_not = hand_over("run-1", home)
    assert taken is None and "code changed" in why_not
    assert worker.stale.is_set() and worker.runs.get_nowait() == ""  # wakes the main thread to restart
    assert not worker.busy.locked()


def a_run(tags: dict[str, str]) -> DagsterRun:
    return DagsterRun(job_name="incremental_job", run_id="run-1", tags=tags)


def test_run_monitoring_fails_a_run_whose_worker_is_gone_and_leaves_a_process_run_alone(worker, home):
    """Finding (the fresh clone's daemon and UI tests): run monitoring fails a run whose health is
    anything but running or success, and this launcher reported a run in its own process UNKNOWN."""
    launcher = WarmRunLauncher()
    here = socket.gethostname()
    assert launcher.check_run_worker_health(a_run({WORKER_TAG: f"{here}:{os.getpid()}"})).status == WorkerStatus.RUNNING
    gone = subprocess.Popen(["true"])
    gone.wait()
    health = launcher.check_run_worker_health(a_run({WORKER_TAG: f"{here}:{gone.pid}"}))
    assert health.status == WorkerStatus.FAILED and str(gone.pid) in health.msg
    assert launcher.check_run_worker_health(a_run({})).status == WorkerStatus.RUNNING


REHEARSAL = """
import sys
import incremental_assets.cli.runner as runner
import incremental_assets.lib.sample.stream as stream
import incremental_assets.lib.spark as spark
from dagster import DagsterInstance
from incremental_assets.cli.serve import Worker

spark.build_spark_session = lambda: None
stream.generate_stream = stream.append_hours = lambda *args, **kwargs: 0
runner.run_until_caught_up = lambda *args, **kwargs: [__import__("incremental_assets.definitions")]  # as a run does
runner.run_incremental = lambda *args, **kwargs: None
Worker(DagsterInstance.ephemeral(), report=lambda line: None).warm()
from incremental_assets.definitions import defs
print(defs.resolve_job_def("daily_job").partitions_def.start.date())
"""


def test_the_runs_after_a_rehearsal_have_the_operators_settings_not_the_rehearsals(tmp_path):
    """Finding: the rehearsal imported the definitions inside its scratch environment (settings
    file /dev/null), so every run the worker took was built from default settings and refused by
    the settings plan."""
    config = tmp_path / "settings.yaml"
    config.write_text("start_date: '2025-03-04'\n")
    env = {**os.environ, "INCREMENTAL_ASSETS_CONFIG": str(config), "DAGSTER_HOME": str(tmp_path / "home")}
    env.pop("INCREMENTAL_ASSETS_START_DATE", None)
    done = subprocess.run([sys.executable, "-c", REHEARSAL], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "2025-03-04"
