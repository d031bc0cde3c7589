"""One Delta-enabled SparkSession per process (so: per run with the in-process executor).

The Delta jars are resolved from Maven Central once, by Spark's own package resolution in a child
process with the project's Ivy settings (never the user's ~/.m2 or ~/.ivy2), into a cache the
project owns. Every later start points `spark.jars` at the cached files and needs no network.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import pyspark
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql import SparkSession

from incremental_assets.lib import timings
from incremental_assets.lib.environment import jar_cache_dir, on_object_store, s3_endpoint

T = TypeVar("T")

# delta-spark_2.13 4.0.x is built against Spark 4.0 (pyproject pins the matching pyspark); other
# pairs are compared in benchmarks/engine.md.
DELTA_VERSION = "4.0.1"
DELTA_PACKAGE = f"io.delta:delta-spark_2.13:{DELTA_VERSION}"
# hadoop-aws 3.4.1 was built with the AWS SDK 2.24.6, whose s3-transfer-manager was never published
# to Maven Central: the next patch release that has both modules.
AWS_SDK_VERSION = "2.24.8"
JAR_LIST_FILE = "resolved-jars.txt"

# Ivy's default public resolver only (Maven Central; the cache is spark.jars.ivy). Spark's default
# settings look in ~/.m2 and ~/.ivy2 first, and a POM there without its jar (left by `mvn
# dependency:get` or an interrupted build) makes Ivy pick that copy and then fail to download the jar.
IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" usepoms="true"/>
  </resolvers>
</ivysettings>
"""

# Run in a fresh interpreter: a process whose JVM is already up would reuse it and resolve nothing.
RESOLVE_SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[1]").appName("incremental_assets-resolve-jars")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
builder.getOrCreate().stop()
"""

# Lines of Ivy's and Spark's output that say why a resolution failed.
FAILURE_MARKERS = (
    "unresolved dependency",
    "not found",
    "download failed",
    "failed downloads",
    "unknownhost",
    "connection",
    "server access error",
    "timed out",
    "exception in thread",
)

# Shuffles sized to the data: adaptive execution coalesces the shuffle partitions to what
# each stage holds, and turns a join whose side proves small at run time (the sessions of a run, a
# quarantine list) into a broadcast. Applied to Spark Connect sessions too.
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.adaptive.autoBroadcastJoinThreshold": "64MB",
    # Groups a task's object-hash aggregation (the daily layer's collect_set) holds before it sorts
    # its rows instead: Spark's 128 made a daily run over weeks sort every event, where its (user,
    # day) groups fit in memory.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "100000",
}

# A step over few rows: compiling each query's code (whole-stage codegen, and each expression's
# generated class, which the JIT then compiles again) and re-planning between its stages (adaptive
# execution) cost more than they save, so all are off up to this many rows: expressions are
# interpreted (Spark's factoryMode, whose default falls back to that only when compiling fails), and
# one shuffle partition holds them (one file per day written, as adaptive execution's coalescing
# made it). Big windows keep the session's settings: they pay there (benchmarks/engine.md).
SMALL_STEP_ROWS = 200_000
SIZED_CONF = {
    "spark.sql.codegen.wholeStage": "false", "spark.sql.adaptive.enabled": "false", SHUFFLE_PARTITIONS: "1",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# The throughput collector: a run is a batch of CPU-bound scans and writes, not a service whose
# pauses matter. The optimising compiler (C2) takes only code that stays hot (the JVM's counts of
# calls and loop iterations raised four- to tenfold): on two cores its compilations of code that
# ran a while, then no more, took CPU from the run's own threads and paid nothing back
# (benchmarks/comparisons.md).
HOT_CODE_ONLY = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
    "-XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=400000"
)
JAVA_OPTIONS = f"-Duser.timezone=UTC -XX:+UseParallelGC {HOT_CODE_ONLY}"
# A driver started for a small step (up to SMALL_STEP_ROWS) compiles with the quick compiler (C1)
# only: the optimising one (C2) took about half the CPU of such a run in its own process and paid
# nothing back before it ended, while both cores were busy with the run. A run of days, or of
# attributes alone, is sized by the rows it reads (from the log). A driver started without a size
# (the warm worker, a load) or for a big window keeps both: over millions of rows C2's code pays
# (benchmarks/engine.md).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# The driver JVM's class-data-sharing archive: the classes a run loads (the JDK's, Spark's, Delta's),
# mapped from one file when the JVM starts instead of read from the jars, parsed and verified again
# by every process. `incremental-assets setup` records it once, from a rehearsal of the pipeline
# (cli/runner.py, record_class_archive); every later local driver starts with it. Its name carries the JVM and the
# jars it was recorded with, so other jars or another JDK look for another file; a JVM that cannot
# use the one it is given starts without it. Set to 0 to start without it (to measure the difference).
CLASS_ARCHIVE_ENV = "INCREMENTAL_ASSETS_CLASS_ARCHIVE"
# 1: the driver's web UI (Spark's, on port 4040 and up) is on; it is off otherwise.
SPARK_UI_ENV = "INCREMENTAL_ASSETS_SPARK_UI"
LOOPBACK = "127.0.0.1"
# Set by the command line: the JVM's own log (Spark's errors and their Java frames) goes to this
# file instead of the terminal, beside the run's event stream.
JVM_LOG_ENV = "INCREMENTAL_ASSETS_JVM_LOG"
JVM_LOG_CONFIG = """rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""
LOCAL_CONF = {
    "spark.executor.extraJavaOptions": JAVA_OPTIONS,
    # Manifests and scratch tables are small: a handful of snapshot partitions keeps Delta
    # log replay from scheduling 50 tasks per table read.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.showConsoleProgress": "false",
    # The code Spark generated, kept by its source: its 100 entries are fewer than one run's queries
    # make, so each run in a long-lived session (the warm worker, a bench, the tests) compiled them all again.
    "spark.sql.codegen.cache.maxEntries": "2000",
}


def driver_memory(physical_bytes: int) -> str:
    """The local driver's heap: Spark's SPARK_DRIVER_MEMORY when set (as spark-submit takes it;
    several drivers sharing a machine), else a third of the machine's memory, from 2 GiB up to
    8 GiB (a bigger heap sorts and writes a big window in fewer collections; more buys nothing here)."""
    if os.environ.get("SPARK_DRIVER_MEMORY"):
        return os.environ["SPARK_DRIVER_MEMORY"]
    gib = physical_bytes // 3 // 2**30
    return f"{min(max(gib, 2), 8)}g"


@dataclass(frozen=True)
class JarSet:
    """Maven packages a Spark driver needs beyond Spark's own jars, resolved once into a folder of
    the project's jar cache; every later start reads the list from there, offline."""

    name: str  # the folder
    packages: tuple[str, ...]  # "group:artifact:version"
    excludes: tuple[str, ...] = ()  # "group:artifact" left out of the dependencies

    @property
    def folder(self) -> Path:
        return jar_cache_dir() / self.name

    def cached(self) -> list[str] | None:
        """The jar files resolved earlier, or None when the cache is missing or incomplete."""
        listing = self.folder / JAR_LIST_FILE
        if not listing.exists():
            return None
        jars = listing.read_text().split()
        if not jars or not all(Path(jar).exists() for jar in jars):
            return None
        return jars

    def resolve(self) -> list[str]:
        """The jar paths, resolved into the cache first when they are not there (idempotent)."""
        def resolved() -> list[str]:
            jars = not_shipped_with_spark(_resolve(self))
            (self.folder / JAR_LIST_FILE).write_text("\n".join(jars) + "\n")
            return jars

        return made_once(self.folder, self.cached, resolved)


def made_once(folder: Path, ready: Callable[[], T | None], make: Callable[[], T]) -> T:
    """What `ready` finds in the cache `folder`, made first by `make` when it finds nothing: under
    the folder's lock, so that two first starts (or set-ups) at once make it once and the second
    reads what the first made."""
    found = ready()
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = ready()
        return found if found is not None else make()


def hadoop_version() -> str:
    """The Hadoop client the installed pyspark ships: hadoop-aws must be the same release."""
    [api] = (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")
    return api.name.removeprefix("hadoop-client-api-").removesuffix(".jar")


DELTA_JARS = JarSet(f"delta-{DELTA_VERSION}", (DELTA_PACKAGE,))


def object_store_jars() -> JarSet:
    """S3A (hadoop-aws) and the two AWS SDK modules it calls, instead of the SDK's all-in-one bundle
    that hadoop-aws's POM names (about 9 MB against 560 MB; docs/deployment.md)."""
    return JarSet(
        f"hadoop-aws-{hadoop_version()}",
        (f"org.apache.hadoop:hadoop-aws:{hadoop_version()}", f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
         f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}"),
        excludes=("software.amazon.awssdk:bundle",),
    )


def driver_jars() -> list[str]:
    """Delta's jars; and S3A's when the warehouse or the source is on an object store."""
    return DELTA_JARS.resolve() + (object_store_jars().resolve() if on_object_store() else [])


def _artifact(jar_name: str) -> str:
    """`parquet-column-1.17.0.jar` -> `parquet-column` (Ivy's names carry an `org_` prefix too)."""
    return re.sub(r"-\d[^-]*(-\d+)?\.jar$", "", jar_name)


def not_shipped_with_spark(jars: list[str]) -> list[str]:
    """The resolved jars whose artifact Spark does not already ship (Delta's POM names Parquet,
    Hadoop, Jackson, log4j...): Spark's own copy is on the class path first, so a second, older
    copy would only be shadowed, or clash, and cost start-up time."""
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [jar for jar in jars if _artifact(Path(jar).name.split("_", 1)[1]) not in shipped]


def _resolve(jars: JarSet) -> list[str]:
    """Resolve the set's packages and their dependencies into its folder of the project cache.

    A failure raises with Ivy's reason: in-process, Spark would only report that the Java
    gateway exited.
    """
    ivy = jars.folder / "ivy"
    settings = jars.folder / "ivysettings.xml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(IVY_SETTINGS)
    conf = {
        "spark.jars.packages": ",".join(jars.packages),
        "spark.jars.excludes": ",".join(jars.excludes),
        "spark.jars.ivy": str(ivy),
        "spark.jars.ivySettings": str(settings),
        "spark.ui.enabled": "false",
    }
    # Without Spark Connect variables the child starts a local JVM, which is what resolves.
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    result = subprocess.run(
        [sys.executable, "-c", RESOLVE_SCRIPT, json.dumps(conf)], env=env, capture_output=True, text=True
    )
    found = sorted(str(p) for p in (ivy / "jars").glob("*.jar"))
    wanted = {"{}_{}-{}.jar".format(*package.split(":")) for package in jars.packages}
    if result.returncode != 0 or not wanted <= {Path(jar).name for jar in found}:
        raise RuntimeError(
            f"Could not resolve {', '.join(jars.packages)} from Maven Central into {ivy} (Ivy settings: {settings}):\n"
            + failure_cause(result.stdout + result.stderr)
        )
    return found


def failure_cause(output: str) -> str:
    """The lines of a child's output (the resolver's, the archive's recording) that name the cause,
    or its tail when none does."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    cause = [line for line in lines if any(marker in line.lower() for marker in FAILURE_MARKERS)]
    return "\n".join(dict.fromkeys(cause or lines[-20:]))


def build_spark_session(
    master: str | None = None,
    remote: str | None = None,
    shuffle_partitions: int | None = None,
    app_name: str = "incremental_assets",
    extra_conf: dict[str, Any] | None = None,
    small: bool = False,
) -> SparkSession:
    """Return the process's Delta-enabled session, creating it on first use (`small`: for a small
    step, driver_conf).

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
        master = master or os.environ.get("SPARK_MASTER", "local[*]")
        builder = builder.master(master)
        if master.startswith("local"):
            # Spark runs its Python workers (a DataFrame made from Python rows) with PYSPARK_PYTHON,
            # else whatever `python3` the PATH finds: another interpreter, of another minor version
            # or without pyspark, failed every run's first Spark step. Locally they are this one.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for key, value in {**driver_conf(small=small), **listening_conf(master)}.items():
            builder = builder.config(key, value)
    sql_conf = dict(SQL_CONF)
    if shuffle_partitions:
        sql_conf[SHUFFLE_PARTITIONS] = str(shuffle_partitions)
    for key, value in {**sql_conf, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    cold = SparkSession.getActiveSession() is None
    if cold:
        timings.mark("until the first Spark step")
    with _jvm_stderr_to(None if remote else os.environ.get(JVM_LOG_ENV)):
        session = builder.getOrCreate()
    if cold:
        timings.mark("JVM, jars and Spark session")
    if not remote:
        session.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
        # Two per core of the cluster: every core busy on a big stage, which adaptive execution
        # coalesces for a small one (Spark's fixed 200 costs a task and a file each).
        sql_conf.setdefault(SHUFFLE_PARTITIONS, str(2 * session.sparkContext.defaultParallelism))
    for key, value in sql_conf.items():  # a session that already existed gets them too
        session.conf.set(key, value)
    # What size_for restores: the session's settings as built (a new one's, and those this build set).
    if cold:
        _SIZED.clear()
    built = {**sql_conf, **(extra_conf or {})}
    _OWN_CONF.update({key: session.conf.get(key) for key in SIZED_CONF if cold or key in built})
    for key, value in _SIZED.items():  # a later step of a run asks again: the run's sizing holds
        session.conf.set(key, value)
    return session


def size_for(session: SparkSession, rows: int | None) -> None:
    """Spark's settings for the rows a step meets (at most `rows`, as the Delta log's statistics
    tell; None: not known, or another run's step): the small-step settings up to SMALL_STEP_ROWS,
    the session's own otherwise. They last in the session until the next call."""
    _SIZED.clear()
    if is_small(rows):
        _SIZED.update(SIZED_CONF)
    for key in SIZED_CONF:
        if key not in _OWN_CONF:  # a session built elsewhere
            _OWN_CONF[key] = session.conf.get(key)
        session.conf.set(key, _SIZED.get(key, _OWN_CONF[key]))


def is_small(rows: int | None) -> bool:
    """Whether a step over at most `rows` rows (None: not known) is a small one."""
    return rows is not None and rows <= SMALL_STEP_ROWS


_OWN_CONF: dict[str, str] = {}  # the values of SIZED_CONF the process's session was built with
_SIZED: dict[str, str] = {}  # the small-step settings while they hold


@contextlib.contextmanager
def _jvm_stderr_to(path: str | None):
    """With a path: the JVM started inside writes its standard error there (it inherits this
    process's file descriptor 2 when it starts; the JVM's own warnings come before any logger)."""
    if not path:
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved, log = os.dup(2), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(log)
        os.close(saved)


def driver_conf(record_classes_to: Path | None = None, small: bool = False) -> dict[str, str]:
    """What a Spark driver of this project needs at launch: Delta's jars (from the cache; resolved
    first, with the network once, when set-up was skipped) and extensions, UTC, the class archive
    when there is one (or, given a path, the option that records one there at exit), and for a
    driver started for a small step the quick compiler only. A Spark Connect server started for
    the project takes the same (`spark-submit --conf`)."""
    memory = driver_memory(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    jars = driver_jars()
    archive = class_archive(jars)
    if record_classes_to is not None:
        sharing = f"-XX:ArchiveClassesAtExit={record_classes_to}"
    elif archive.exists() and os.environ.get(CLASS_ARCHIVE_ENV) != "0":
        sharing = f"-XX:SharedArchiveFile={archive}"
    else:
        sharing = ""
    java = " ".join(option for option in (JAVA_OPTIONS, QUICK_JIT if small else "", sharing, jvm_log_option()) if option)
    return {
        **LOCAL_CONF, "spark.driver.extraJavaOptions": java, "spark.driver.memory": memory, **DELTA_CONF,
        # On the driver's class path too (the archive holds only classes of the JVM's own loaders);
        # spark.jars still ships them to a cluster's executors.
        "spark.jars": ",".join(jars), "spark.driver.extraClassPath": os.pathsep.join(jars), **object_store_conf(),
    }


def listening_conf(master: str) -> dict[str, str]:
    """Where the driver listens. A local driver (everything in this process) only on the loopback
    interface: its RPC, its block manager, and its web UI, which has no authentication and kill
    links and binds to SPARK_LOCAL_IP (set here unless the operator set it) or else to every
    interface. A cluster's executors must reach the driver: there the operator decides. The web UI is
    off unless SPARK_UI_ENV turns it on (docs/deployment.md: how to reach it safely)."""
    ui = {"spark.ui.enabled": "true" if os.environ.get(SPARK_UI_ENV) == "1" else "false"}
    if not master.startswith("local"):
        return ui
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # read by the JVM that spark-submit starts
    return {**ui, "spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}


def class_archive(jars: list[str]) -> Path:
    """Where the driver's class archive for this JVM and these jars is (or would be)."""
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    java = Path(java or "java").resolve()
    origin = [str(java), str(java.stat().st_mtime_ns) if java.exists() else "", pyspark.__version__, JAVA_OPTIONS, *jars]
    return jar_cache_dir() / "class-archive" / f"{hashlib.sha256(chr(10).join(origin).encode()).hexdigest()[:16]}.jsa"


def object_store_conf() -> dict[str, str]:
    """S3A's settings, from where deltalake finds the store too (environment.s3_endpoint); on a
    cluster they reach the executors with the job's Hadoop configuration. None for a local warehouse."""
    if not on_object_store():
        return {}
    endpoint = s3_endpoint()
    conf = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",  # s3:// as deltalake reads it
        "spark.hadoop.fs.s3a.path.style.access": str(not endpoint.virtual_hosted).lower(),
    }
    if endpoint.url:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint.url
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.url.startswith("https://")).lower()
    if endpoint.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = endpoint.region
    return conf


def jvm_log_option() -> str:
    """The driver JVM's option that sends its log to the file JVM_LOG_ENV names ('' when unset)."""
    path = os.environ.get(JVM_LOG_ENV)
    if not path:
        return ""
    config = Path(f"{path}.log4j2.properties")
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(JVM_LOG_CONFIG.format(path=path))
    return f"-Dlog4j2.configurationFile={config.as_uri()}"


def connect_server_command(port: int, host: str = LOOPBACK, master: str = "local[*]") -> list[str]:
    """spark-submit, from the pyspark distribution, starting a Spark Connect server on host:port
    with the project's driver settings (Delta's plugin is not needed: no `delta.tables` client)."""
    conf = {**driver_conf(), "spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port)}
    return [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master", master,
        *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")],
    ]


class SparkResource(LazyPySparkResource):
    """The run's SparkSession, started on first use of `spark_session`: a step that fails its
    checks first never pays for a JVM. With the in-process executor every step of a run shares it.
    """

    master: str | None = Field(default=None, description="Spark master URL; default SPARK_MASTER or local[*]")
    remote: str | None = Field(default=None, description="Spark Connect URL; default SPARK_REMOTE")
    shuffle_partitions: int | None = Field(
        default=None, description="spark.sql.shuffle.partitions; default two per core, coalesced to the data by adaptive execution"
    )
    spark_config: dict[str, Any] = Field(default_factory=dict, description="Any other Spark settings")

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        """The project's resource, not Dagster's: keeps the UI and telemetry from labelling it theirs."""
        return False

    def _init_session(self, small: bool = False) -> None:
        """dagster-pyspark's builds a bare session from spark_config; this adds the project's
        Delta, UTC and jar-cache settings and Spark Connect."""
        if self._spark_session is None:
            self._spark_session = build_spark_session(
                master=self.master,
                remote=self.remote,
                shuffle_partitions=self.shuffle_partitions,
                extra_conf=self.spark_config,
                small=small,
            )

    def session_for(self, rows: int | None) -> SparkSession:
        """The session for a step over at most `rows` rows, started for them when it is not yet
        (driver_conf), with Spark's settings for them (size_for)."""
        self._init_session(small=is_small(rows))
        size_for(self._spark_session, rows)
        return self._spark_session
