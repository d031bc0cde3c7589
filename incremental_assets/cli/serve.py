"""`incremental-assets serve`: the warm worker. It rehearses the pipeline once, then executes each
run the launcher (lib/worker.py) hands over, one at a time, in its main thread and its one Spark
session."""

from __future__ import annotations

import json
import os
import queue
import signal
import socketserver
import sys
import threading
import time
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus

from incremental_assets.lib.worker import PACKAGE, address_file, code_fingerprint, serving


class _Requests(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        try:
            run_id = json.loads(self.rfile.readline())["run_id"]
        except (ValueError, KeyError):
            return
        accepted, reason = self.server.worker.offer(run_id)
        self.wfile.write(json.dumps({"accepted": accepted, "reason": reason}).encode() + b"\n")


class Worker:
    """Executes one handed-over run at a time in its main thread (where an interrupt lands, so a
    run canceled in the UI ends Canceled), with the process's one Spark session."""

    def __init__(
        self, instance: DagsterInstance, host: str = "127.0.0.1", port: int = 0, report=None, code_root: Path = PACKAGE
    ):
        self.instance = instance
        self.report = report or (lambda line: print(line, flush=True))
        self.code_root = code_root
        self.code = code_fingerprint(code_root)
        self.runs: queue.Queue[str] = queue.Queue()
        self.busy = threading.Lock()
        # Set: restart once the run in progress has ended. After an interrupt (a canceled run), too:
        # it can land inside a call to the JVM and leave that connection mid-answer, and the next
        # run gets a new JVM rather than a session that may answer the previous run's question.
        self.stale = threading.Event()
        self.stopping = False
        self.server = socketserver.ThreadingTCPServer((host, port), _Requests)
        self.server.daemon_threads = True
        self.server.worker = self

    def offer(self, run_id: str) -> tuple[bool, str]:
        if code_fingerprint(self.code_root) != self.code:
            self.stale.set()
            self.runs.put("")  # wakes the main thread, which restarts the worker
            return False, "the code changed since the warm worker started (it restarts)"
        if self.stale.is_set() or self.stopping:
            return False, "the warm worker is restarting"
        if not self.busy.acquire(blocking=False):
            return False, "the warm worker is executing another run"
        self.runs.put(run_id)
        return True, ""

    def warm(self) -> None:
        """A rehearsal before the first run: the pipeline over a small sample stream in a scratch
        warehouse, Dagster home and in-memory instance, so that the first run handed over finds
        Spark's and Delta's code loaded and compiled (the first run in a new JVM costs several
        times what a later one does: benchmarks/results.md). A rehearsal that fails (a cluster that
        cannot reach this machine's scratch directory) costs the first run its warm-up, no more."""
        # The definitions the runs execute are built when this module is first imported, from the
        # environment: the operator's, never the rehearsal's scratch one.
        import incremental_assets.definitions  # noqa: F401
        from incremental_assets.cli.runner import rehearse
        from incremental_assets.lib.spark import build_spark_session

        started = time.monotonic()
        try:
            rehearse(build_spark_session())
            self.report(f"Rehearsed the pipeline on a sample in {time.monotonic() - started:.0f} s")
        except Exception as error:  # noqa: BLE001 - a rehearsal only warms; the runs decide
            self.report(f"The rehearsal failed ({error}): the first run warms up Spark instead")

    def listen(self) -> None:
        """Take requests (in a thread), and say where in DAGSTER_HOME, for the launcher."""
        host, port = self.server.server_address[:2]
        address = address_file()
        address.write_text(json.dumps({"pid": os.getpid(), "host": host, "port": port, "code": self.code}))
        threading.Thread(target=self.server.serve_forever, name="worker-requests", daemon=True).start()
        self.report(f"Serving the runs of DAGSTER_HOME={address.parent} on {host}:{port} (pid {os.getpid()})")

    def serve_forever(self) -> None:
        """Until SIGTERM or Ctrl-C (KeyboardInterrupt): a run in progress then ends Failed, as a
        killed run process leaves it, and the next run recovers what it left."""
        signal.signal(signal.SIGTERM, self._stop)
        self.listen()
        address = address_file()
        try:
            while not self.stale.is_set():
                run_id = self.runs.get()
                if self.stale.is_set():
                    break
                try:
                    self.execute(run_id)
                finally:
                    self.busy.release()
        finally:
            self.server.shutdown()
            if (serving() or {}).get("pid") == os.getpid():
                address.unlink(missing_ok=True)
        if self.stale.is_set():
            self.restart()

    def execute(self, run_id: str) -> None:
        from dagster._core.events import EngineEventData
        from dagster._core.execution.run_cancellation_thread import start_run_cancellation_thread
        from dagster._grpc.impl import core_execute_run
        from dagster._utils.hosted_user_process import recon_job_from_origin

        started = time.monotonic()
        run = self.instance.get_run_by_id(run_id)
        if run is None or run.job_code_origin is None:
            self.report(f"run {run_id}: not found, or without the origin of its job")
            return
        self.instance.report_engine_event(
            f"Executing in the warm worker (pid {os.getpid()}): its Spark session is already up.", run,
            EngineEventData.in_process(os.getpid()),
        )
        watcher, stop_watching = start_run_cancellation_thread(self.instance, run_id)
        try:
            for _ in core_execute_run(recon_job_from_origin(run.job_code_origin), run, self.instance, inject_env_vars=True):
                pass
        except Exception as error:  # noqa: BLE001 - core_execute_run reported it to the instance; the worker goes on
            self.report(f"run {run_id}: {type(error).__name__}: {error}")
        except BaseException as interrupt:  # noqa: BLE001 - canceled: the run has ended, not the worker
            if self.stopping:
                raise
            self.report(f"run {run_id}: interrupted ({type(interrupt).__name__})")
            self.stale.set()
        finally:
            stop_watching.set()
            watcher.join()
        status = self.instance.get_run_by_id(run_id).status
        if status == DagsterRunStatus.CANCELED:
            self.stale.set()
        if not self.stale.is_set():
            self._forget_the_run()
        # Last: once this line is out, the worker takes the next run (the run's own status came first).
        self.report(f"run {run_id} ({run.job_name}): {status.value} in {time.monotonic() - started:.1f} s")

    def _stop(self, signum, frame) -> None:
        self.stopping = True
        raise KeyboardInterrupt

    @staticmethod
    def _forget_the_run() -> None:
        """What a run cached, and the settings sized for its steps, stay with that run, not with the next one."""
        from pyspark.sql import SparkSession

        from incremental_assets.lib.spark import size_for

        session = SparkSession.getActiveSession()
        if session is not None:
            session.catalog.clearCache()
            size_for(session, None)

    def restart(self) -> None:
        """The same command again, in this process (same pid), with the code on disk. The JVM is not
        asked to stop (after an interrupt its connection may be mid-answer): it exits when the
        pipe from this process closes, as exec closes it."""
        self.report("Restarting")
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.argv])
