"""A run's Spark driver listens on the loopback interface only, and its web UI (no authentication,
kill links) is off unless asked for: read from /proc/net/tcp of the driver's JVM while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from incremental_assets.lib.spark import SPARK_UI_ENV

# In a process of its own (a fresh JVM, as a run's): start the session as a run does, run a job,
# and list the JVM's listening TCP sockets (address, port) from /proc.
DRIVER = """
import json, os
from incremental_assets.lib.spark import build_spark_session

spark = build_spark_session()
numbers = spark.range(1000)
numbers.groupBy((numbers.id % 7).alias("g")).count().collect()
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
sockets = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
           if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
listening = []
for table in ("tcp", "tcp6"):
    for line in open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in sockets:  # LISTEN, and the JVM's own
            address, port = fields[1].split(":")
            listening.append((address, int(port, 16)))
print(json.dumps(listening))
spark.stop()
"""
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def listening(**environ) -> list[tuple[str, int]]:
    env = {**os.environ, **environ}
    for name in ("SPARK_LOCAL_IP", "SPARK_MASTER", "SPARK_REMOTE", *(() if environ else (SPARK_UI_ENV,))):
        if name not in environ:
            env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [tuple(pair) for pair in json.loads(result.stdout.splitlines()[-1])]


def test_the_driver_listens_on_the_loopback_interface_only_and_its_ui_is_off():
    ports = listening()
    assert ports, "the driver's RPC and block manager listen"
    assert all(address in LOOPBACK for address, _ in ports), ports
    assert not [port for _, port in ports if 4040 <= port <= 4140], "no web UI"


def test_the_web_ui_when_asked_for_listens_on_the_loopback_interface_too():
    ports = listening(**{SPARK_UI_ENV: "1"})
    assert [port for _, port in ports if 4040 <= port <= 4140], ports
    assert all(address in LOOPBACK for address, _ in ports), ports
