"""Whether the process executing a run on this machine is still there. Imported by the run
launcher (lib/worker.py), which every process that launches a run loads before its first launch
(`dagster job launch` among them): nothing heavier than Dagster here."""

from __future__ import annotations

import os
import socket

from dagster import DagsterRun

from incremental_assets.lib.catalog import PROCESS_TAG, WORKER_TAG


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


def process_gone(run: DagsterRun) -> str | None:
    """Why a run the instance calls started is over, when the process executing it on this machine
    is gone (its tag is set as the run starts; a warm worker's, at hand-over); None while it lives,
    or when it runs elsewhere."""
    for tag, executor in ((PROCESS_TAG, "process"), (WORKER_TAG, "warm worker")):
        if tag in run.tags:
            host, pid = run.tags[tag].rsplit(":", 1)
            if host == socket.gethostname() and not process_exists(int(pid)):
                return f"the {executor} (pid {pid}) that executed the run is gone"
            return None
    return None
