"""One Spark session per test process (each xdist worker has its own), with the production Delta
configuration; each test marked with its tier, the folder it lives in."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from incremental_assets.lib.spark import SparkResource, build_spark_session
from tests.s3_server import s3_server

TEST_SHUFFLE_PARTITIONS = 2
TEST_DRIVER_MEMORY = "3g"


def _scratch_dir(prefix: str) -> str:
    """A directory of this test process, removed when it exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Definitions load before any fixture runs: keep them off the developer's ./warehouse and instance.
os.environ["INCREMENTAL_ASSETS_WAREHOUSE"] = _scratch_dir("incremental-assets-tests-")
os.environ.pop("INCREMENTAL_ASSETS_SOURCE", None)
# ... and off a developer's ./incremental_assets.yaml (the settings `make demo` writes).
os.environ["INCREMENTAL_ASSETS_CONFIG"] = os.devnull
os.environ["DAGSTER_HOME"] = _scratch_dir("incremental-assets-dagster-home-")
# A test's Python UDF runs in this interpreter, with the project's packages (not the system's python3).
os.environ["PYSPARK_PYTHON"] = sys.executable
# Every test process has its driver, and some start more (the CLI, the warm worker, launched runs):
# with a third of the machine's memory each, the kernel killed a test process's JVM at 24 GB.
os.environ["SPARK_DRIVER_MEMORY"] = TEST_DRIVER_MEMORY


TIERS = ("unit", "spark", "components", "pipeline", "system", "soak")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        tier = next((part for part in item.path.relative_to(Path(__file__).parent).parts if part in TIERS), None)
        if tier is not None:
            item.add_marker(tier)


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    session = build_spark_session(
        master="local[2]", shuffle_partitions=TEST_SHUFFLE_PARTITIONS, extra_conf={"spark.ui.enabled": "false"}
    )
    yield session
    session.stop()


@pytest.fixture
def python_workers_refused(spark, tmp_path):
    """While the test runs, a Python worker the session starts is an interpreter that only records
    it was started and exits (Spark keys its workers by interpreter: the process's own are not
    reused). A run makes its frames from Arrow and needs none (lib/delta/arrow.py)."""
    started = tmp_path / "python-worker-started"
    refusing = tmp_path / "python-refusing"
    refusing.write_text(f"#!/bin/sh\necho \"$@\" >> '{started}'\nexit 3\n")
    refusing.chmod(0o755)
    context = spark.sparkContext
    interpreter, context.pythonExec = context.pythonExec, str(refusing)
    try:
        yield started
    finally:
        context.pythonExec = interpreter
    assert not started.exists(), "the test's Spark work started a Python worker"


@pytest.fixture(scope="session")
def spark_resource(spark) -> SparkResource:
    """A resource that hands Dagster runs the test session (getOrCreate returns it)."""
    return SparkResource(master="local[2]", shuffle_partitions=TEST_SHUFFLE_PARTITIONS)


@pytest.fixture
def warehouse(tmp_path, monkeypatch) -> str:
    """A fresh warehouse root per test; also the default for code that reads the environment."""
    root = tmp_path / "warehouse"
    root.mkdir()
    monkeypatch.setenv("INCREMENTAL_ASSETS_WAREHOUSE", str(root))
    monkeypatch.delenv("INCREMENTAL_ASSETS_SOURCE", raising=False)
    return str(root)


@pytest.fixture(scope="module")
def s3_server_env():
    """moto's S3 server for a module's tests (tests/s3_server.py): the AWS variables that reach it."""
    with s3_server() as env:
        yield env


@pytest.fixture
def s3(s3_server_env, monkeypatch) -> dict[str, str]:
    """The module's S3 server, in this test's environment (and so its child processes')."""
    for name, value in s3_server_env.items():
        monkeypatch.setenv(name, value)
    return s3_server_env
