"""Spark processes a test starts from the pyspark distribution, on 127.0.0.1 only: a standalone
master with one worker, or a Spark Connect server with Delta's jars. Each runs in a process group
of its own, stopped by its id when the test ends (the worker's executors are in its group), and
the test can then show that nothing of it is left."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyspark

from incremental_assets.lib.environment import PROJECT_ROOT
from incremental_assets.lib.spark import connect_server_command

SPARK_HOME = Path(pyspark.__file__).parent
PROJECT = shlex.quote(str(PROJECT_ROOT))
LOCALHOST = "127.0.0.1"
STARTUP_SECONDS = 120
# What a driver or client started by the test needs beside the URL: this machine's loopback, and
# this interpreter for the executors' Python workers.
CHILD_ENV = {"SPARK_LOCAL_IP": LOCALHOST, "SPARK_HOME": str(SPARK_HOME)}


@dataclass
class Started:
    """What a test points its runs at (`variable`=`url`), and the process groups to stop."""

    variable: str
    url: str
    log_dir: Path
    ui_port: int | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)

    def alive(self) -> list[int]:
        """The process groups (one per process started, its id) that still hold a process."""
        return [p.pid for p in self.processes if _group_alive(p.pid)]


def without_the_drivers_disk(command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own, where /tmp and the project's directory are empty
    tmpfs: any read of the driver's files (its warehouse, jar cache, Dagster home, package) fails,
    as on another machine. The virtualenv stays, bound back in its place: a cluster machine has
    Spark and the driver's Python installed at the same paths (docs/spark.md)."""
    venv = shlex.quote(sys.prefix)
    script = "\n".join([
        "set -e",
        f"mount -t tmpfs tmpfs /mnt && mkdir /mnt/venv && mount --bind {venv} /mnt/venv",
        "mount -t tmpfs tmpfs /tmp",
        f"if [ -d {PROJECT} ]; then mount -t tmpfs tmpfs {PROJECT}; fi",  # gone already when under /tmp
        f"mkdir -p {venv} && mount --bind /mnt/venv {venv}",
        'cd / && exec "$@"',  # a working directory left in the hidden /tmp would still reach it
    ])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *command]


@contextmanager
def standalone_cluster(work: Path, cores: int = 2, memory: str = "3g", shares_no_disk: bool = False) -> Iterator[Started]:
    """A master and one worker, as `sbin/start-master.sh` and `start-worker.sh` would start them;
    the worker, and so its executors, without the driver's disk if asked."""
    master_port, master_ui, worker_ui = free_ports(3)
    started = Started("SPARK_MASTER", f"spark://{LOCALHOST}:{master_port}", work, master_ui)
    try:
        master = _launch(started, "master", [str(SPARK_HOME / "bin/spark-class"), "org.apache.spark.deploy.master.Master",
                                             "--host", LOCALHOST, "--port", str(master_port), "--webui-port", str(master_ui)])
        _wait(lambda: _listening(master_port), master, started, "the master's port")
        worker = [
            str(SPARK_HOME / "bin/spark-class"), "org.apache.spark.deploy.worker.Worker", started.url, "--host", LOCALHOST,
            "--cores", str(cores), "--memory", memory, "--webui-port", str(worker_ui), "--work-dir", str(work / "work"),
        ]
        worker = _launch(started, "worker", without_the_drivers_disk(worker) if shares_no_disk else worker)
        _wait(lambda: master_state(master_ui).get("aliveworkers") == 1, worker, started, "the worker's registration")
        yield started
    finally:
        _stop(started)


@contextmanager
def connect_server(work: Path) -> Iterator[Started]:
    """A Spark Connect server (local[2]), as `incremental-assets connect-server` starts it."""
    port = free_ports(1)[0]
    started = Started("SPARK_REMOTE", f"sc://{LOCALHOST}:{port}", work)
    try:
        server = _launch(started, "connect", [*connect_server_command(port, LOCALHOST, "local[2]"), "--conf", "spark.ui.enabled=false"])
        _wait(lambda: _listening(port), server, started, "the Connect server's port")
        yield started
    finally:
        _stop(started)


def master_state(ui_port: int) -> dict:
    """The master's status page as JSON: workers, running and completed applications."""
    try:
        with urllib.request.urlopen(f"http://{LOCALHOST}:{ui_port}/json/", timeout=5) as response:
            return json.load(response)
    except OSError:
        return {}


def _launch(started: Started, name: str, command: list[str]) -> subprocess.Popen:
    log = open(started.log_dir / f"{name}.log", "w")
    process = subprocess.Popen(
        command, cwd=started.log_dir, env={**os.environ, **CHILD_ENV},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    started.processes.append(process)  # a new session: its group id is its pid
    return process


def _wait(ready, process: subprocess.Popen, started: Started, what: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in started.log_dir.glob("*.log"))
            raise RuntimeError(f"Spark did not get to {what} (exit {process.poll()}):\n{logs}")
        time.sleep(0.5)


def _stop(started: Started) -> None:
    """SIGTERM to each group (workers before the master), SIGKILL to what is left after 30 s."""
    for process in reversed(started.processes):
        _signal(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while started.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    for group in started.alive():
        _signal(group, signal.SIGKILL)
    for process in started.processes:  # reaped: a zombie holds nothing but would still be listed
        process.wait(timeout=10)


def _signal(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except ProcessLookupError:
        pass


def _group_alive(group: int) -> bool:
    """Whether a process of the group runs (a zombie, exited and waiting for its parent, does not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((LOCALHOST, port)) == 0


def free_ports(count: int) -> list[int]:
    """`count` ports free on 127.0.0.1 now (for servers a test starts)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind((LOCALHOST, 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
