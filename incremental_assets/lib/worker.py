"""The launcher's side of the warm worker (`incremental-assets serve`, cli/serve.py): a long-lived
process that keeps a Spark session up and executes each run the instance's launcher hands over, so
a scheduled or sensor-launched run pays for its data, not for a JVM start.

A run executed there is the run Dagster made: its events, status and checks go to the instance as
from any run worker, it takes the same lease and writes the same run-log records, and a run whose
worker died is failed by run monitoring, like a killed process. When no worker is serving, it is
busy with another run, or the code or the settings file changed since it started, the launcher
starts the run in its own process as Dagster's default launcher does.

Imported by the daemon and the webserver: no Spark here.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from dagster import DagsterRun
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher

from incremental_assets.lib import environment
from incremental_assets.lib.catalog import WORKER_TAG
from incremental_assets.lib.settings import default_config_file
from incremental_assets.lib.processes import process_exists, process_gone

ADDRESS_FILE = "worker.json"
PACKAGE = Path(__file__).resolve().parents[1]


def code_fingerprint(root: Path = PACKAGE) -> str:
    """The package's Python files as they are on disk now: a worker started before an edit or a
    deploy would execute the old definitions."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}:{stat.st_mtime_ns}:{stat.st_size}\n".encode())
    return digest.hexdigest()[:16]


def settings_fingerprint() -> str:
    """The settings file as it is on disk now (none: empty): the definitions a worker executes were
    built from the one it read at its start, and after `apply` of a change its runs would be refused
    with the plan inverted."""
    path = default_config_file(os.environ)
    content = path.read_bytes() if path is not None and path.exists() else b""
    return hashlib.sha256(f"{path}\n".encode() + content).hexdigest()[:16]


def address_file(home: Path | None = None) -> Path:
    return (home or environment.dagster_home()) / ADDRESS_FILE


def serving(home: Path | None = None) -> dict[str, Any] | None:
    """The worker that serves this Dagster home ({pid, host, port, code, secret}), or None."""
    try:
        worker = json.loads(address_file(home).read_text())
    except (OSError, ValueError):
        return None
    return worker if process_exists(worker["pid"]) else None


def hand_over(run_id: str, home: Path | None = None, timeout: float = 10) -> tuple[dict[str, Any] | None, str]:
    """Ask the serving worker to execute `run_id`: (the worker, "") when it took the run, else
    (None, why not)."""
    worker = serving(home)
    if worker is None:
        return None, "no warm worker is serving"
    try:
        with socket.create_connection((worker["host"], worker["port"]), timeout=timeout) as conn:
            conn.sendall(json.dumps({"run_id": run_id, "secret": worker.get("secret", "")}).encode() + b"\n")
            reply = json.loads(conn.makefile().readline() or "{}")
    except (OSError, ValueError) as error:
        return None, f"the warm worker did not answer ({error})"
    return (worker, "") if reply.get("accepted") else (None, reply.get("reason", "refused"))


class WarmRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher, which first offers each run to the warm worker."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        worker, why_not = hand_over(run.run_id)
        if worker is None:
            self._instance.report_engine_event(f"Starting the run in its own process: {why_not}.", run, cls=self.__class__)
            super().launch_run(context)
            return
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: f"{socket.gethostname()}:{worker['pid']}"})
        self._run_ids.add(run.run_id)

    def terminate(self, run_id: str) -> bool:
        """A worker's run is interrupted by the worker itself once the run is marked canceling."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or WORKER_TAG not in run.tags:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """Run monitoring fails a run whose process on this machine is gone (a killed command line,
        run worker or warm worker); a run elsewhere is reported running: nothing here can see it."""
        why = process_gone(run)
        return CheckRunHealthResult(WorkerStatus.RUNNING) if why is None else CheckRunHealthResult(WorkerStatus.FAILED, why)
