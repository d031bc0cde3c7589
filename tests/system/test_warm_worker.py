"""Runs Dagster launches execute in the warm worker (`incremental-assets serve`) when it serves the
instance's home, and in a process of their own when none does: each is the run Dagster made (its
status, events and run-log records), and the worker goes on after a run canceled in the UI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime, timedelta
from datetime import time as dtime
from pathlib import Path

import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus
from incremental_assets.cli.runner import run_until_caught_up
from incremental_assets.lib.attributes import SAMPLE_ATTRIBUTES
from incremental_assets.lib.catalog import EVENTS_THIS_RUN
from incremental_assets.lib.errors import step_failure
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.run_log import PROCESSED, PROCESSING
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow
from incremental_assets.lib.catalog import WORKER_TAG
from incremental_assets.lib.worker import WarmRunLauncher, serving
from tests.dagster_processes import BIN, WORKER_START_S, a_home, a_workspace, append_events, wait_for
from tests.warehouse_tables import comparable_tables, scenario_environment

# A stream whose loads end a day before now, so that a day holds hours with events whatever the time
# of day the test runs at (humans are active 06:00-23:00 UTC); a run moves the cursor up to now, and
# a lookback of two days keeps the hours appended next inside the next run's window (older ones would
# lie behind the cursor, which keyhole runs handle).
START = (utcnow() - timedelta(days=3)).date()
PARAMS = SampleParams(users=6, days=4, events_per_day=90, start_date=START, seed=11)
HOURS_LOADED = int((utcnow() - datetime.combine(START, dtime.min)).total_seconds() // 3600) - 24
# Under which a warehouse run over any batching of a stream equals one run over all of it
# (tests/pipeline/test_batching_invariance.py): the test compares the runs' tables with that run.
SETTINGS = {"start_date": PARAMS.start_date.isoformat(), "max_session_days": 1, "reprocess_days": 365, "min_rows_to_process": 1,
            "lookback_window_hours": 48}
ADDED = {"name": "add_to_cart_7d", "aggregation": "count", "event_names": ["add_to_cart"], "period": "last 7 days"}
INCREMENTAL_TABLES = ("filtered_events", "sessions_lifecycle_manifest", "quarantined_sessions", "sessions")


def launch(workspace: Path, instance: DagsterInstance, job: str = "incremental_job", config: dict | None = None) -> str:
    """`dagster job launch`, as the UI's Launch run does: the run id it made."""
    before = {run.run_id for run in instance.get_runs()}
    given = ["--config-json", json.dumps(config)] if config else []
    launched = subprocess.run([BIN / "dagster", "job", "launch", "-w", workspace, "-j", job, *given],
                              capture_output=True, text=True, timeout=300, env=os.environ)
    assert launched.returncode == 0, launched.stderr[-3000:]
    [run_id] = {run.run_id for run in instance.get_runs()} - before
    return run_id


def ended(instance: DagsterInstance, run_id: str, seconds: float = 300):
    deadline = time.monotonic() + seconds
    while not (run := instance.get_run_by_id(run_id)).is_finished:
        assert time.monotonic() < deadline, f"run {run_id} still {run.status.value} after {seconds} s"
        time.sleep(0.5)
    return run


def story(instance: DagsterInstance, run_id: str, worker_log: Path) -> str:
    """What a failed assertion shows: the run's engine messages and the worker's last lines."""
    messages = [f"{e.dagster_event.event_type_value if e.dagster_event else ''} {e.message}" for e in instance.all_logs(run_id)]
    return "\n".join(["the run's events:", *messages, "the worker's log:", worker_log.read_text()[-4000:]])


def caught_up(instance: DagsterInstance, run_id: str) -> bool:
    """What the run's batch said: no source event lies past its window."""
    [batch] = [e.asset_materialization for e in instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records if e.asset_key == AssetKey(EVENTS_THIS_RUN)]
    return batch.metadata["caught_up"].value


def test_launched_runs_execute_in_the_warm_worker_or_their_own_process(spark, tmp_path, monkeypatch):
    home = a_home(tmp_path)
    settings_file = tmp_path / "settings.yaml"  # the operator's, edited below before an `apply`
    settings_file.write_text("# attributes: the sample set\n")
    monkeypatch.setenv("INCREMENTAL_ASSETS_CONFIG", str(settings_file))
    with open(home / "dagster.yaml", "a") as config:  # runs start when launched: no daemon in this test
        config.write("run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n")
    workspace = a_workspace(tmp_path)
    source = str(tmp_path / "source")
    generate_stream(spark, source, PARAMS, hours=HOURS_LOADED)
    with scenario_environment(tmp_path / "warehouse", source, SETTINGS, home):
        settings, instance = IncrementalSettings(**SETTINGS), DagsterInstance.get()
        assert all(run.success for run in run_until_caught_up(settings, report=lambda line: None, instance=instance))

        # No worker serves this home: the run starts in its own process, and says why.
        append_events(spark, source)
        cold = ended(instance, launch(workspace, instance))
        assert cold.status == DagsterRunStatus.SUCCESS and WORKER_TAG not in cold.tags
        assert any("in its own process: no warm worker is serving" in (e.message or "")
                   for e in instance.all_logs(cold.run_id))

        worker = subprocess.Popen([BIN / "incremental-assets", "serve"], env=os.environ, cwd=tmp_path, start_new_session=True,
                                  stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT)
        try:
            def worker_log() -> str:  # what a wait that ran out tells
                return (tmp_path / "worker.log").read_text()[-3000:]

            first_port = wait_for("the worker to serve", lambda: serving(home), WORKER_START_S, worker_log)["port"]

            # A run of new rows, in the worker: the run Dagster made, with the contract's records.
            append_events(spark, source)
            warm = ended(instance, launch(workspace, instance))
            assert warm.status == DagsterRunStatus.SUCCESS, (tmp_path / "worker.log").read_text()[-3000:]
            assert warm.tags[WORKER_TAG].endswith(f":{worker.pid}")
            records = StateStore().run_log(run_id=warm.run_id)
            assert {r["status"] for r in records} == {PROCESSING, PROCESSED}

            # Canceled as the UI's Terminate does, while a call to Spark is in flight (the worker's
            # JVM is paused, so the call cannot finish first): the run ends Canceled, and the worker
            # restarts with a new JVM under the same pid, in which the next run stores every event.
            # The JVM is paused once the worker is done with the last run (its status is out before
            # the worker lets go of the run's cache): a worker still busy sends the run to a process
            # of its own, which the pause would not hold.
            wait_for("the worker to be done with the run", lambda: f"run {warm.run_id}" in (tmp_path / "worker.log").read_text(), 60)
            jvm = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()]
            for pid in jvm:
                os.kill(pid, signal.SIGSTOP)
            append_events(spark, source)
            canceled = launch(workspace, instance)
            wait_for("the run's first Spark step", lambda: any(
                log.dagster_event.is_step_start and log.dagster_event.step_key == "sessions_lifecycle_manifest"
                for log in instance.all_logs(canceled) if log.dagster_event), 120)
            launcher = WarmRunLauncher()
            launcher.register_instance(instance)
            assert launcher.terminate(canceled)
            time.sleep(5)  # the worker sees the run canceling within 2 s, and interrupts it mid-call
            for pid in jvm:
                os.kill(pid, signal.SIGCONT)
            assert ended(instance, canceled).status == DagsterRunStatus.CANCELED, story(instance, canceled, tmp_path / "worker.log")
            told = [str(step_failure(log.dagster_event.step_key, log.dagster_event.step_failure_data.error))
                    for log in instance.all_logs(canceled, of_type=DagsterEventType.STEP_FAILURE)]
            assert told and all(": terminated: run " in line for line in told), told
            wait_for("the worker to serve again", lambda: (serving(home) or {}).get("port") not in (None, first_port), WORKER_START_S, worker_log)
            assert serving(home)["pid"] == worker.pid

            # A run that fails in the worker (a refresh its settings do not allow) leaves it serving.
            refused = {"ops": {"full_refresh": {"config": {"confirm_warehouse": str(tmp_path / "warehouse")}}}}
            failed = ended(instance, launch(workspace, instance, "refresh_job", refused))
            assert failed.status == DagsterRunStatus.FAILURE and failed.tags[WORKER_TAG].endswith(f":{worker.pid}")
            wait_for("the worker to be done with the failed run", lambda: f"run {failed.run_id}" in (tmp_path / "worker.log").read_text(), 60)
            time.sleep(3)  # Dagster's own watcher interrupted here, on the run's FAILURE, and the worker stopped
            assert worker.poll() is None and (serving(home) or {}).get("pid") == worker.pid, (tmp_path / "worker.log").read_text()[-3000:]
            for _ in range(5):  # the run after a failed one brings the assets in sync window by window
                after = ended(instance, launch(workspace, instance))
                assert after.status == DagsterRunStatus.SUCCESS and after.tags[WORKER_TAG].endswith(f":{worker.pid}")
                if caught_up(instance, after.run_id):
                    break

            # `apply` of an added attribute: the next run handed over finds the settings file changed,
            # starts in its own process while the worker restarts with it, and the runs after it are
            # the worker's again (it used to refuse them all with the plan inverted).
            served = serving(home)["port"]
            settings_file.write_text(yaml.safe_dump({"attributes": [*SAMPLE_ATTRIBUTES, ADDED]}))
            applied = subprocess.run([BIN / "incremental-assets", "apply"], capture_output=True, text=True, timeout=900, env=os.environ)
            assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
            append_events(spark, source)
            handed = ended(instance, launch(workspace, instance))
            assert handed.status == DagsterRunStatus.SUCCESS, story(instance, handed.run_id, tmp_path / "worker.log")
            assert any("the settings file changed since the warm worker started" in (e.message or "") for e in instance.all_logs(handed.run_id))
            wait_for("the worker to serve the settings on disk", lambda: (serving(home) or {}).get("port") not in (None, served), WORKER_START_S, worker_log)
            append_events(spark, source)
            warm_again = ended(instance, launch(workspace, instance))
            assert warm_again.status == DagsterRunStatus.SUCCESS, story(instance, warm_again.run_id, tmp_path / "worker.log")
            assert warm_again.tags[WORKER_TAG].endswith(f":{worker.pid}")
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)
        assert not (home / "worker.json").exists(), "a stopped worker takes its address with it"
        launched = comparable_tables(tmp_path / "warehouse")

    # The same source processed by the command line, in this process, from scratch.
    with scenario_environment(tmp_path / "reference", source, SETTINGS, tmp_path / "reference-home"):
        runs = run_until_caught_up(IncrementalSettings(**SETTINGS), report=lambda line: None, instance=DagsterInstance.ephemeral())
        assert all(run.success for run in runs)
        reference = comparable_tables(tmp_path / "reference")
    for table in INCREMENTAL_TABLES:  # the daily layer is the daily job's: no daemon here launched it
        only_launched, only_reference = set(launched[table]) - set(reference[table]), set(reference[table]) - set(launched[table])
        assert not only_launched and not only_reference, (table, sorted(only_launched)[:3], sorted(only_reference)[:3])


def test_sigterm_stops_the_worker_during_its_rehearsal(tmp_path):
    """Findings: SIGTERM during the rehearsal was swallowed (the rehearsal's run took it as its own
    interrupt, and the worker went on to serve), with a py4j traceback at the second SIGTERM; then,
    the rehearsal ran its next run before the worker stopped."""
    home = a_home(tmp_path)
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen([BIN / "incremental-assets", "serve"], env={**os.environ, "DAGSTER_HOME": str(home)},
                                  cwd=tmp_path, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Inside a run of the rehearsal: its first step has reported (the runs print a line per step).
        wait_for("the rehearsal's first run", lambda: "new_event_limits" in log.read_text(), 180)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)
    said = log.read_text()
    assert said.rstrip().endswith("Stopped") and "Serving the runs" not in said, said[-3000:]
    # Found on a busy machine: the rehearsal's next run went on after the interrupted one, and the
    # worker stopped only after it (past this test's two minutes).
    assert " ok" not in said.partition("FAILED")[2], said[-3000:]
    assert not (home / "worker.json").exists()
