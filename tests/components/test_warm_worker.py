"""The warm worker's decisions, without Spark: which runs it takes, when the launcher falls back to
a process of the run's own, and how run monitoring sees a worker's run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus
from dagster._core.launcher import WorkerStatus

from incremental_assets.cli.serve import MAX_CONNECTIONS, MAX_REQUEST, READ_TIMEOUT_S, Worker
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
    for run_id in ("run-1", "run-2", "run-3"):  # runs about to start, as the launcher hands them over
        worker.instance.add_run(DagsterRun(job_name="incremental_job", run_id=run_id, status=DagsterRunStatus.STARTING))
    worker.listen()
    yield worker
    worker.server.shutdown()
    worker.server.server_close()


def test_the_launcher_loads_nothing_heavier_than_dagster():
    """Every process that launches a run imports the launcher before its first launch: with
    pyspark, pandas and deltalake behind it, `dagster job launch` spent 0.4 s of each run's start
    importing them."""
    probe = ("import sys, incremental_assets.lib.worker; "
             "print(sorted({name.split('.')[0] for name in sys.modules} & {'pyspark', 'pandas', 'deltalake', 'pyarrow', 'py4j'}))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


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
    worker.free()  # what the main thread does when run-1 has ended
    assert hand_over("run-3", home)[0] is not None


def test_a_run_launched_while_the_worker_tidies_up_after_the_last_waits_for_it(worker, home):
    """Finding (the bench's launched pairs): a daily run launched as soon as the hourly run had
    ended found the worker busy with the run's last lines, and paid for a JVM of its own (30 s)."""
    assert hand_over("run-1", home)[0] is not None and worker.runs.get_nowait() == "run-1"
    worker.tidying_up.set()  # run-1 has ended (its status is out); the main thread tidies up
    threading.Timer(0.5, worker.free).start()
    started = time.monotonic()
    taken, why_not = hand_over("run-2", home)
    assert taken is not None and why_not == "" and worker.runs.get_nowait() == "run-2"
    assert 0.4 < time.monotonic() - started < 5


def test_a_run_launched_while_the_worker_tidies_up_to_restart_gets_a_process_of_its_own(worker, home):
    assert hand_over("run-1", home)[0] is not None and worker.runs.get_nowait() == "run-1"
    worker.tidying_up.set()  # run-1 has ended; it was canceled, so the worker will restart with a new Spark session
    threading.Timer(0.5, lambda: (worker.stale.set(), worker.free())).start()
    assert hand_over("run-2", home) == (None, "the warm worker is restarting")
    assert worker.runs.empty() and not worker.busy.locked()  # no run queued for a worker that takes no more


def test_after_an_edit_the_worker_takes_no_run_and_restarts(worker, home, tmp_path):
    (tmp_path / "package" / "assets.py").write_text("x = 2  # an edit, or a deploy\n")
    taken, why_not = hand_over("run-1", home)
    assert taken is None and "code changed" in why_not
    assert worker.stale.is_set() and worker.runs.get_nowait() == ""  # wakes the main thread to restart
    assert not worker.busy.locked()


def test_after_apply_changes_the_settings_file_the_worker_takes_no_run_and_restarts(home, tmp_path, monkeypatch):
    """Finding: after plan/apply of an added attribute, the worker's runs were built from the
    settings it read at its start, and each was refused with the plan inverted until a restart."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("start_date: '2024-03-01'\n")
    monkeypatch.setenv("INCREMENTAL_ASSETS_CONFIG", str(settings))
    worker = Worker(DagsterInstance.ephemeral(), code_root=tmp_path, report=lambda line: None)
    worker.instance.add_run(DagsterRun(job_name="incremental_job", run_id="run-1", status=DagsterRunStatus.STARTING))
    worker.listen()
    try:
        settings.write_text("start_date: '2024-03-01'\nattributes: []\n")  # what `apply` follows
        taken, why_not = hand_over("run-1", home)
        assert taken is None and why_not == "the settings file changed since the warm worker started (it restarts)"
        assert worker.stale.is_set() and worker.runs.get_nowait() == ""
    finally:
        worker.server.shutdown()
        worker.server.server_close()


def ask(home, line: bytes, wait: float = 0) -> dict:
    """One raw request to the serving worker, as any local process could send it: its reply."""
    worker = serving(home)
    with socket.create_connection((worker["host"], worker["port"]), timeout=READ_TIMEOUT_S + 5) as conn:
        if line:
            conn.sendall(line)
        time.sleep(wait)
        return json.loads(conn.makefile().readline())


def test_whatever_a_client_sends_it_gets_one_line_back_and_the_worker_goes_on(worker, home):
    secret = serving(home)["secret"]
    assert oct(address_file(home).stat().st_mode & 0o777) == "0o600", "only the worker's owner reads its secret"
    worker.instance.add_run(DagsterRun(job_name="incremental_job", run_id="done", status=DagsterRunStatus.SUCCESS))
    refusals = {
        b"junk\n": "not JSON",
        b"[1, 2]\n": "not a JSON object",
        b"x" * (MAX_REQUEST + 10) + b"\n": f"at most {MAX_REQUEST} bytes",
        b'{"run_id": "run-1"}\n': "does not carry this worker's secret",
        json.dumps({"run_id": "run-1", "secret": "guessed"}).encode() + b"\n": "does not carry this worker's secret",
        json.dumps({"run_id": 12345, "secret": secret}).encode() + b"\n": "run_id must be a string",
        json.dumps({"run_id": "made-up", "secret": secret}).encode() + b"\n": "no run made-up in this worker's instance",
        json.dumps({"run_id": "done", "secret": secret}).encode() + b"\n": "run done is SUCCESS",
    }
    for line, reason in refusals.items():
        reply = ask(home, line)
        assert reply["accepted"] is False and reason in reply["reason"], (line[:40], reply)
    assert worker.runs.empty() and not worker.busy.locked(), "nothing refused reached the main thread"
    assert not [e for e in worker.instance.all_logs("done")], "a finished run's log is left alone"
    assert hand_over("run-1", home)[0] is not None  # still serving, and the launcher's request is taken


def test_slow_and_too_many_connections_are_bounded(worker, home):
    started = time.monotonic()
    reply = ask(home, b'{"run_id": "run-1"', wait=0)  # half a line, then nothing
    assert reply["accepted"] is False and "no whole request line" in reply["reason"]
    assert READ_TIMEOUT_S - 1 < time.monotonic() - started < READ_TIMEOUT_S + 5
    threads = threading.active_count()
    worker_address = serving(home)
    idle = [socket.create_connection((worker_address["host"], worker_address["port"])) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        time.sleep(1)
        assert threading.active_count() <= threads + MAX_CONNECTIONS, "a thread per connection, bounded"
        replies = []
        for conn in idle:  # those past the limit are answered at once; the others wait for their line
            conn.settimeout(0.2)
            try:
                replies.append(json.loads(conn.makefile().readline()))
            except OSError:
                pass
        assert {"accepted": False, "reason": "refused: too many connections"} in replies, replies
    finally:
        for conn in idle:
            conn.close()
    time.sleep(1)
    assert hand_over("run-1", home)[0] is not None  # the slots are free again


def test_only_a_terminate_interrupts_the_run_in_progress_and_only_while_it_runs(worker, monkeypatch):
    """Dagster's watcher also interrupted on a run's failure, reported as the run ends: the interrupt
    then landed after the run and stopped the worker."""
    sent = []
    monkeypatch.setattr(signal, "pthread_kill", lambda thread, signum: sent.append(signum))
    monkeypatch.setattr(type(worker.instance), "cancellation_thread_poll_interval_seconds", property(lambda self: 0.05))
    instance = worker.instance

    def watch(run_id: str, status: DagsterRunStatus, executing: str | None) -> list:
        sent.clear()
        instance.add_run(DagsterRun(job_name="incremental_job", run_id=run_id, status=status))
        worker.executing = executing
        done = threading.Event()
        watcher = threading.Thread(target=worker._interrupt_when_canceled, args=(run_id, done))
        watcher.start()
        time.sleep(0.5)
        done.set()
        watcher.join()
        return list(sent)

    assert watch("failed", DagsterRunStatus.FAILURE, executing="failed") == []
    assert watch("terminated", DagsterRunStatus.CANCELING, executing="terminated") == [signal.SIGINT]
    assert worker.interrupted == "terminated"  # the run that restarts the worker once it ends
    assert watch("ended", DagsterRunStatus.CANCELING, executing=None) == []  # the run is over: the worker is not


def test_a_run_that_ends_canceled_uninterrupted_leaves_the_worker_serving(worker, monkeypatch):
    """A run refused before it writes (one asset of the incremental run alone) ends Canceled with
    no interrupt sent: the worker keeps its session. A Terminate's interrupt restarts it."""
    import dagster._grpc.impl as grpc_impl
    import dagster._utils.hosted_user_process as hosted
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin

    origin = JobPythonOrigin("incremental_job", RepositoryPythonOrigin(sys.executable, ModuleCodePointer("x", "defs", None)))
    monkeypatch.setattr(hosted, "recon_job_from_origin", lambda origin: None)
    monkeypatch.setattr(worker, "_forget_the_run", lambda: None)  # no Spark session here

    def ends_canceled(job, run, instance, inject_env_vars):
        instance.report_run_canceled(run)
        yield from ()

    monkeypatch.setattr(grpc_impl, "core_execute_run", ends_canceled)
    for run_id in ("refused", "terminated"):
        worker.instance.add_run(DagsterRun(job_name="incremental_job", run_id=run_id, status=DagsterRunStatus.STARTING,
                                           job_code_origin=origin))
    worker.execute("refused")
    assert worker.instance.get_run_by_id("refused").status == DagsterRunStatus.CANCELED
    assert not worker.stale.is_set()
    worker.interrupted = "terminated"  # as the watcher marks the run it sends SIGINT to
    worker.execute("terminated")
    assert worker.stale.is_set()
    told = [entry.message for entry in worker.instance.all_logs("terminated") if entry.message.startswith("terminated: ")]
    assert told == ["terminated: run terminated was canceled, and the warm worker interrupted it; the worker restarts "
                    "with a new Spark session"]
    assert not [entry for entry in worker.instance.all_logs("refused") if entry.message.startswith("terminated: ")]


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
from incremental_assets.cli.serve import MAX_CONNECTIONS, MAX_REQUEST, READ_TIMEOUT_S, Worker

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
