"""One Delta-enabled SparkSession per process (so: per run with the in-process executor).

The Delta jars are resolved from Maven Central once, by Spark's own package resolution, into a
cache the project owns. Every later start points `spark.jars` at the cached files and needs no
network.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from incremental_assets.environment import jar_cache_dir

DELTA_VERSION = "4.0.1"
DELTA_PACKAGE = f"io.delta:delta-spark_2.13:{DELTA_VERSION}"
JAR_LIST_FILE = "resolved-jars.txt"

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

LOCAL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # Manifests and scratch tables are small: a handful of snapshot partitions keeps Delta
    # log replay from scheduling 50 tasks per table read.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
}


def _version_dir() -> Path:
    return jar_cache_dir() / f"delta-{DELTA_VERSION}"


def cached_delta_jars() -> list[str] | None:
    """The jar files resolved at set-up, or None when the cache is missing or incomplete."""
    listing = _version_dir() / JAR_LIST_FILE
    if not listing.exists():
        return None
    jars = listing.read_text().split()
    if not jars or not all(Path(jar).exists() for jar in jars):
        return None
    return jars


def _delta_jar_conf() -> dict[str, str]:
    jars = cached_delta_jars()
    if jars is not None:
        return {"spark.jars": ",".join(jars)}
    # Not resolved yet: let Spark resolve into the project cache (needs the network once).
    return {"spark.jars.packages": DELTA_PACKAGE, "spark.jars.ivy": str(_version_dir() / "ivy")}


def resolve_delta_jars() -> list[str]:
    """Resolve the Delta jars into the project cache (idempotent); returns the jar paths."""
    jars = cached_delta_jars()
    if jars is not None:
        return jars
    ivy = _version_dir() / "ivy"
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("incremental_assets-resolve-jars")
        .config("spark.jars.packages", DELTA_PACKAGE)
        .config("spark.jars.ivy", str(ivy))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.stop()
    jars = sorted(str(p) for p in (ivy / "jars").glob("*.jar"))
    if not any("delta-spark" in Path(j).name for j in jars):
        raise RuntimeError(f"Delta jars were not resolved into {ivy}: check access to Maven Central")
    (_version_dir() / JAR_LIST_FILE).write_text("\n".join(jars) + "\n")
    return jars


def build_spark_session(
    master: str | None = None,
    remote: str | None = None,
    shuffle_partitions: int = 4,
    app_name: str = "incremental_assets",
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Return the process's Delta-enabled session, creating it on first use.

    `remote` (or SPARK_REMOTE) selects Spark Connect; the server then owns the Delta jars.
    """
    remote = remote or os.environ.get("SPARK_REMOTE")
    # PySpark converts timestamps to and from the Python process's local zone: make it UTC too.
    os.environ["TZ"] = "UTC"
    time.tzset()
    builder = SparkSession.builder.appName(app_name)
    if remote:
        builder = builder.remote(remote)
    else:
        builder = builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
        for key, value in {**LOCAL_CONF, **DELTA_CONF, **_delta_jar_conf()}.items():
            builder = builder.config(key, value)
    builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not remote:
        session.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
    session.conf.set("spark.sql.session.timeZone", "UTC")
    session.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return session


class SparkResource(ConfigurableResource):
    """The run's SparkSession. With the in-process executor every step of a run shares it."""

    master: str | None = Field(default=None, description="Spark master URL; default SPARK_MASTER or local[*]")
    remote: str | None = Field(default=None, description="Spark Connect URL; default SPARK_REMOTE")
    shuffle_partitions: int = Field(default=4, description="spark.sql.shuffle.partitions")
    extra_conf: dict[str, str] = Field(default_factory=dict, description="Any other Spark settings")

    _session: SparkSession | None = PrivateAttr(default=None)

    @property
    def session(self) -> SparkSession:
        """Started on first use, so a step that fails its checks first never pays for a JVM."""
        if self._session is None:
            self._session = build_spark_session(
                master=self.master,
                remote=self.remote,
                shuffle_partitions=self.shuffle_partitions,
                extra_conf=self.extra_conf,
            )
        return self._session
