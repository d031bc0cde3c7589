"""moto's standalone S3 server for a test's object store: a real HTTP server of the S3 API (it honours
conditional writes, If-None-Match, which deltalake's commits rely on), on 127.0.0.1 and a free port,
with one bucket, stopped by its process id when the test ends."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


@contextmanager
def without_conditional_writes(endpoint: str) -> Iterator[str]:
    """A proxy in front of the server that drops If-None-Match and If-Match from every request, as a
    store without conditional writes ignores them; yields its endpoint."""
    host, port = endpoint.removeprefix("http://").split(":")

    class Forward(_Handler):
        protocol_version = "HTTP/1.1"

        def handle_any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("if-none-match", "if-match")}
            upstream = http.client.HTTPConnection(host, int(port), timeout=30)
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            kept = [(name, value) for name, value in reply.getheaders()
                    if name.lower() not in ("transfer-encoding", "connection", "content-length")]
            # a HEAD's length is the object's, not its (empty) body's
            length = reply.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
            self.reply(reply.status, [*kept, ("Content-Length", length)], data)
            upstream.close()

    with _serving(Forward) as proxy:
        yield proxy


@contextmanager
def refusing_store(code: str, status: int = 403) -> Iterator[str]:
    """An S3 endpoint that answers every request with one refusal (an S3 error document), as a
    store answers rejected credentials: its endpoint."""
    document = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>refused by the stub'
                f"</Message></Error>").encode()

    class Refuse(_Handler):
        def handle_any(self) -> None:
            self.reply(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(document)))], document)

    with _serving(Refuse) as endpoint:
        yield endpoint


class _Handler(BaseHTTPRequestHandler):
    """A stub's handler: every method goes to `handle_any`, which answers with `reply`; no log lines."""

    def handle_any(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self.handle_any()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """The status, the headers, and the body unless the request is a HEAD."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server of `handler` on a free port of 127.0.0.1: its endpoint."""
    server = ThreadingHTTPServer((LOCALHOST, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{LOCALHOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
