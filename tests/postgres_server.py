"""Debian's PostgreSQL for a test's Dagster instance: a cluster of its own in a directory of its own
(the `postgres` user runs it, as the server refuses root, and cannot enter pytest's directories), on
127.0.0.1 and a free port, stopped by its process id and removed when the test ends."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.spark_processes import LOCALHOST, free_ports

USER = "dagster"
DATABASE = "dagster"


def server_binaries() -> Path | None:
    """The newest PostgreSQL installed by Debian's package (postgresql), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda path: int(Path(path).parts[-3]))
    return Path(found[-1]).parent if found else None


@contextmanager
def postgres_instance_env() -> Iterator[dict[str, str]]:
    """A running server with an empty `dagster` database; yields the DAGSTER_PG_* variables that
    dagster.postgres.yaml reads."""
    binaries = server_binaries()
    assert binaries is not None, "PostgreSQL is not installed: apt-get install postgresql (make test does)"
    work = Path(tempfile.mkdtemp(prefix="incremental-assets-postgres-"))
    owner = pwd.getpwnam("postgres")
    os.chown(work, owner.pw_uid, owner.pw_gid)
    data = work / "data"
    as_postgres = {"user": "postgres", "group": "postgres", "cwd": work}
    subprocess.run([binaries / "initdb", "-D", data, "-U", USER, "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True, **as_postgres)
    [port] = free_ports(1)
    with open(work / "server.log", "w") as log:
        server = subprocess.Popen(
            [binaries / "postgres", "-D", data, "-h", LOCALHOST, "-p", str(port), "-k", work, "-c", "fsync=off"],
            stdout=log, stderr=subprocess.STDOUT, **as_postgres,
        )
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([binaries / "pg_isready", "-h", LOCALHOST, "-p", str(port)], capture_output=True).returncode:
            assert server.poll() is None and time.monotonic() < deadline, (work / "server.log").read_text()[-2000:]
            time.sleep(0.5)
        subprocess.run([binaries / "createdb", "-h", LOCALHOST, "-p", str(port), "-U", USER, DATABASE], check=True)
        yield {"DAGSTER_PG_HOST": LOCALHOST, "DAGSTER_PG_PORT": str(port), "DAGSTER_PG_DB": DATABASE,
               "DAGSTER_PG_USERNAME": USER, "DAGSTER_PG_PASSWORD": ""}
    finally:
        server.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown: its own processes end with it
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)

