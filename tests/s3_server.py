"""moto's standalone S3 server for a test's object store: a real HTTP server of the S3 API (it honours
conditional writes, If-None-Match, which deltalake's commits rely on), on 127.0.0.1 and a free port,
with one bucket, stopped by its process id when the test ends."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.spark_processes import LOCALHOST, free_ports

BUCKET = "warehouse-bucket"
# Recognisable, so a test can search for them wherever they must not appear.
ACCESS_KEY, SECRET_KEY = "AKIATESTKEYMUSTNOTLEAK", "test-secret-must-not-leak"


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """A running server with BUCKET; yields the standard AWS variables that point both deltalake and
    Spark's S3A at it (credentials from the environment, as from any AWS chain)."""
    work = Path(tempfile.mkdtemp(prefix="incremental-assets-s3-"))
    [port] = free_ports(1)
    endpoint = f"http://{LOCALHOST}:{port}"
    with open(work / "server.log", "w") as log:
        server = subprocess.Popen([Path(sys.executable).parent / "moto_server", "-H", LOCALHOST, "-p", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=5)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (work / "server.log").read_text()[-2000:]
                time.sleep(0.3)
        yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)
