"""`incremental-assets serve`: the warm worker. It rehearses the pipeline once, then executes each
run the launcher (lib/worker.py) hands over, one at a time, in its main thread and its one Spark
session."""

from __future__ import annotations

import hmac
import json
import os
import queue
import secrets
import signal
import socketserver
import sys
import threading
import time
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus

from incremental_assets.lib.worker import PACKAGE, address_file, code_fingerprint, serving, settings_fingerprint


# What a client may cost the worker: a request is one line of this many bytes at most, sent within
# this many seconds, over one of this many connections at a time (each a thread).
MAX_REQUEST = 4096
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16
# A run launched while the worker tidies up after its last run (the run has ended: its status is
# out, and whatever follows it may launch) waits this long for the worker, not a JVM of its own;
# below the launcher's timeout (lib/worker.hand_over).
TIDYING_UP_WAIT_S = 5.0
# A run is handed over as it starts; any other status means the run is not the launcher's to give.
ABOUT_TO_START = {DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING}


class _Requests(socketserver.StreamRequestHandler):
    timeout = READ_TIMEOUT_S  # a client that sends nothing, or half a line, is dropped

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_REQUEST + 1)
        except OSError:  # the read timed out
            line = None
        accepted, reason = self.server.worker.request(line)
        try:
            self.wfile.write(json.dumps({"accepted": accepted, "reason": reason}).encode() + b"\n")
        except OSError:
            pass  # the client is gone


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: the next is answered and closed."""

    daemon_threads = True

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(json.dumps({"accepted": False, "reason": "refused: too many connections"}).encode() + b"\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


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
        self.settings = settings_fingerprint()
        self.runs: queue.Queue[str] = queue.Queue()
        self.busy = threading.Lock()
        self.tidying_up = threading.Event()  # set while busy: the run has ended, the next is taken soon
        # Set: restart once the run in progress has ended. After an interrupt (a canceled run), too:
        # it can land inside a call to the JVM and leave that connection mid-answer, and the next
        # run gets a new JVM rather than a session that may answer the previous run's question.
        self.stale = threading.Event()
        self.stopping = False
        self.secret = secrets.token_hex(16)  # in worker.json, which only its owner can read: the launcher sends it
        self.executing: str | None = None  # the run in the main thread, the only one an interrupt may reach
        self.interrupted: str | None = None  # the run an interrupt was sent to (a Terminate)
        self.executing_lock = threading.Lock()
        self.server = _Server((host, port), _Requests)
        self.server.worker = self

    def request(self, line: bytes | None) -> tuple[bool, str]:
        """A client's request line, judged: (taken, why not). Never raises: whatever a client sends,
        it gets one line back and the worker goes on."""
        if line is None or (line and not line.endswith(b"\n") and len(line) <= MAX_REQUEST):
            return False, f"refused: no whole request line within {READ_TIMEOUT_S:.0f} s"
        if len(line) > MAX_REQUEST:
            return False, f"refused: a request is one line of at most {MAX_REQUEST} bytes"
        try:
            asked = json.loads(line)
        except ValueError:
            return False, "refused: the request is not JSON"
        if not isinstance(asked, dict):
            return False, 'refused: the request is not a JSON object ({"run_id": ..., "secret": ...})'
        if not (isinstance(asked.get("secret"), str) and hmac.compare_digest(asked["secret"], self.secret)):
            return False, "refused: the request does not carry this worker's secret (DAGSTER_HOME/worker.json)"
        run_id = asked.get("run_id")
        if not isinstance(run_id, str):
            return False, "refused: run_id must be a string"
        run = self.instance.get_run_by_id(run_id)
        if run is None:
            return False, f"refused: no run {run_id} in this worker's instance"
        if run.status not in ABOUT_TO_START:
            return False, f"refused: run {run_id} is {run.status.value}; only a run about to start is handed over"
        return self.offer(run_id)

    def offer(self, run_id: str) -> tuple[bool, str]:
        changed = [what for what, now, then in (("code", code_fingerprint(self.code_root), self.code),
                                                ("settings file", settings_fingerprint(), self.settings)) if now != then]
        if changed:
            self.stale.set()
            self.runs.put("")  # wakes the main thread, which restarts the worker
            return False, f"the {' and the '.join(changed)} changed since the warm worker started (it restarts)"
        if self.stale.is_set() or self.stopping:
            return False, "the warm worker is restarting"
        taken = self.busy.acquire(timeout=TIDYING_UP_WAIT_S) if self.tidying_up.is_set() else self.busy.acquire(blocking=False)
        if not taken:
            return False, "the warm worker is executing another run"
        if self.stale.is_set() or self.stopping:  # the last run ended the worker: no more are taken
            self.busy.release()
            return False, "the warm worker is restarting"
        self.runs.put(run_id)
        return True, ""

    def free(self) -> None:
        """The main thread is ready for the next run."""
        self.tidying_up.clear()
        self.busy.release()

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
            if not self.stopping:
                self.report(f"The rehearsal failed ({error}): the first run warms up Spark instead")
        if self.stopping:  # a SIGTERM that a call into the JVM, or a rehearsal run, took as its own
            raise KeyboardInterrupt

    def take_sigterm(self) -> None:
        """SIGTERM stops the worker at any point: the rehearsal, a run, the wait between runs. In
        this process it is the worker's alone: Dagster points SIGTERM at its SIGINT handler whenever
        it executes a run, so a SIGTERM canceled the run in progress, or was swallowed by the
        rehearsal, and the worker went on. Call once, in the main thread, before anything else."""
        signal.signal(signal.SIGTERM, self._stop)
        assign = signal.signal

        def others_only(signum, handler):
            return signal.getsignal(signum) if signum == signal.SIGTERM else assign(signum, handler)

        signal.signal = others_only

    def listen(self) -> None:
        """Take requests (in a thread), and say where in DAGSTER_HOME, for the launcher."""
        host, port = self.server.server_address[:2]
        address = address_file()
        written = json.dumps({"pid": os.getpid(), "host": host, "port": port, "code": self.code, "secret": self.secret})
        descriptor = os.open(address, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # an older file keeps its mode through O_CREAT
        with os.fdopen(descriptor, "w") as out:
            out.write(written)
        threading.Thread(target=self.server.serve_forever, name="worker-requests", daemon=True).start()
        self.report(f"Serving the runs of DAGSTER_HOME={address.parent} on {host}:{port} (pid {os.getpid()})")

    def serve_forever(self) -> None:
        """Until SIGTERM (take_sigterm) or Ctrl-C (KeyboardInterrupt): a run in progress then ends
        Failed, as a killed run process leaves it, and the next run recovers what it left."""
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
                    self.free()
                if self.stopping:  # a SIGTERM the run took as its own interrupt, and ended
                    raise KeyboardInterrupt
        finally:
            self.server.shutdown()
            if (serving() or {}).get("pid") == os.getpid():
                address.unlink(missing_ok=True)
        if self.stale.is_set():
            self.restart()

    def execute(self, run_id: str) -> None:
        from dagster._core.events import EngineEventData
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
        stop_watching = threading.Event()
        watcher = threading.Thread(target=self._interrupt_when_canceled, args=(run_id, stop_watching), daemon=True)
        with self.executing_lock:
            self.executing = run_id
        watcher.start()
        try:
            try:
                for _ in core_execute_run(recon_job_from_origin(run.job_code_origin), run, self.instance, inject_env_vars=True):
                    pass
            finally:
                with self.executing_lock:  # past this, no interrupt is sent: one sent before lands above
                    self.executing = None
                self.tidying_up.set()
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
        if self.interrupted == run_id:  # Dagster took the interrupt as the run's end; a refused run was sent none
            self.stale.set()
            # Said in the run's log wherever the interrupt landed: a warm step may have ended before
            # it, and between steps no step fails to say so.
            self.instance.report_engine_event(
                f"terminated: run {run_id} was canceled, and the warm worker interrupted it; the worker restarts "
                "with a new Spark session", run)
        if not self.stale.is_set():
            self._forget_the_run()
        # Last: once this line is out, the worker takes the next run (the run's own status came first).
        self.report(f"run {run_id} ({run.job_name}): {status.value} in {time.monotonic() - started:.1f} s")

    def _interrupt_when_canceled(self, run_id: str, done: threading.Event) -> None:
        """Interrupt the main thread once the run is marked canceling (a Terminate), while it still
        executes that run. Dagster's own watcher also interrupts on a run's failure, which it
        reports as the run ends: the interrupt then landed after the run, and stopped the worker."""
        while not done.wait(self.instance.cancellation_thread_poll_interval_seconds):
            run = self.instance.get_run_by_id(run_id)
            if run is not None and run.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED):
                with self.executing_lock:
                    if self.executing == run_id:
                        self.interrupted = run_id
                        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return

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
