"""Delta jar resolution: independent of the user's Maven and Ivy caches, says why it failed, and
adds to Spark's class path only what Spark lacks. The local driver's heap, sized to the machine, and
its class archive, which set-up records.

The resolution tests download from Maven Central into a temporary cache and start a JVM.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from incremental_assets.cli.runner import record_class_archive
from incremental_assets.lib.spark import (
    CLASS_ARCHIVE_ENV,
    DELTA_JARS,
    DELTA_VERSION,
    HOT_CODE_ONLY,
    QUICK_JIT,
    JarSet,
    class_archive,
    driver_conf,
    driver_jars,
    driver_memory,
    not_shipped_with_spark,
)

# A fresh driver with the project's launch settings that logs where each class it loads came from,
# and writes and reads a Delta table.
LOGGED_DRIVER = """
import sys
from incremental_assets.lib.spark import build_spark_session, driver_conf
java = driver_conf()["spark.driver.extraJavaOptions"] + f" -Xlog:class+load=info:file={sys.argv[1]}"
spark = build_spark_session(master="local[1]", extra_conf={"spark.driver.extraJavaOptions": java, "spark.ui.enabled": "false"})
spark.range(3).write.format("delta").save(sys.argv[2])
assert spark.read.format("delta").load(sys.argv[2]).count() == 3
spark.stop()
"""

# What `mvn dependency:get -Dartifact=...:pom` or an interrupted Maven build leaves behind.
POM_WITHOUT_JAR = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.delta</groupId>
  <artifactId>delta-spark_2.13</artifactId>
  <version>{DELTA_VERSION}</version>
  <packaging>jar</packaging>
</project>
"""


@pytest.fixture
def jar_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "spark-jars"
    monkeypatch.setenv("INCREMENTAL_ASSETS_JAR_CACHE", str(cache))
    return cache


def test_jars_resolve_despite_a_pom_without_its_jar_in_the_maven_cache(tmp_path, monkeypatch, jar_cache):
    home = tmp_path / "home"
    pom_dir = home / ".m2" / "repository" / "io" / "delta" / "delta-spark_2.13" / DELTA_VERSION
    pom_dir.mkdir(parents=True)
    (pom_dir / f"delta-spark_2.13-{DELTA_VERSION}.pom").write_text(POM_WITHOUT_JAR)
    # Java takes user.home from the passwd entry, not $HOME.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", f"-Duser.home={home}")

    jars = DELTA_JARS.resolve()

    assert f"io.delta_delta-spark_2.13-{DELTA_VERSION}.jar" in [Path(jar).name for jar in jars]
    assert all(Path(jar).is_relative_to(jar_cache) for jar in jars)
    assert not (home / ".ivy2").exists()
    assert DELTA_JARS.resolve() == jars  # now a cache hit
    # Delta's POM also names Parquet, Jackson and Hadoop; Spark's own copies of those stay in charge.
    assert not any(Path(jar).name.startswith(("org.apache.parquet_", "org.apache.hadoop_")) for jar in jars)


def test_only_jars_spark_does_not_ship_are_added_to_its_class_path():
    resolved = [
        "/cache/io.delta_delta-spark_2.13-4.4.0.jar",
        "/cache/io.delta_delta-storage-4.4.0.jar",
        "/cache/org.apache.parquet_parquet-column-1.16.0.jar",  # pyspark ships parquet-column-1.x
        "/cache/com.github.luben_zstd-jni-1.5.7-3.jar",  # and zstd-jni-1.5.7-7
        "/cache/com.fasterxml.jackson.core_jackson-databind-2.13.5.jar",
    ]

    assert not_shipped_with_spark(resolved) == resolved[:2]


def test_a_failed_resolution_names_its_cause(jar_cache):
    with pytest.raises(RuntimeError) as failure:
        JarSet(f"delta-{DELTA_VERSION}", ("io.delta:no-such-artifact_2.13:0.0.1",)).resolve()

    message = str(failure.value)
    assert "io.delta#no-such-artifact_2.13;0.0.1: not found" in message
    assert str(jar_cache / f"delta-{DELTA_VERSION}" / "ivysettings.xml") in message
    assert "Java gateway" not in message


@pytest.mark.parametrize(
    "physical_gib, heap",
    [(4, "2g"), (8, "2g"), (12, "4g"), (24, "8g"), (64, "8g")],  # a third, from 2 GiB up to 8 GiB
)
def test_the_local_driver_takes_a_third_of_the_machine_between_2_and_8_gib(physical_gib, heap, monkeypatch):
    monkeypatch.delenv("SPARK_DRIVER_MEMORY", raising=False)
    assert driver_memory(physical_gib * 2**30) == heap
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "3g")  # Spark's own variable, when an operator sets it
    assert driver_memory(physical_gib * 2**30) == "3g" == driver_conf()["spark.driver.memory"]


def test_the_driver_loads_spark_and_delta_classes_from_the_archive_set_up_recorded(tmp_path):
    archive = record_class_archive()  # `make test` set up first: found, not recorded again
    assert archive == class_archive(driver_jars()) and archive.exists()
    assert f"-XX:SharedArchiveFile={archive}" in driver_conf()["spark.driver.extraJavaOptions"]
    log = tmp_path / "classes.log"

    subprocess.run([sys.executable, "-c", LOGGED_DRIVER, str(log), str(tmp_path / "table")], check=True)

    source = {line.split()[1]: line.split(" source: ", 1)[1] for line in log.read_text().splitlines() if " source: " in line}
    # the JDK's from its own archive; Spark's and Delta's (a jar of spark.jars) from the recorded one
    assert source["java.lang.Object"] == "shared objects file"
    for name in ("org.apache.spark.SparkContext", "org.apache.spark.sql.delta.DeltaLog",
                 "org.apache.spark.sql.delta.commands.WriteIntoDelta"):
        assert source[name] == "shared objects file (top)", name


def test_only_a_driver_started_for_a_small_step_compiles_with_c1_alone():
    assert QUICK_JIT in driver_conf(small=True)["spark.driver.extraJavaOptions"].split()
    assert QUICK_JIT not in driver_conf()["spark.driver.extraJavaOptions"]
    assert QUICK_JIT not in driver_conf(small=True)["spark.executor.extraJavaOptions"], "a cluster's executors keep C2"


def test_the_optimising_compiler_of_every_jvm_takes_only_hot_code(spark):
    """The thresholds are in effect in the driver spark-submit started (the test process's), and
    go to a cluster's executors too."""
    jvm = spark.sparkContext._jvm
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    for option in HOT_CODE_ONLY.split():
        name, value = option.removeprefix("-XX:").split("=")
        assert diagnostics.getVMOption(name).getValue() == value, name
    assert HOT_CODE_ONLY in driver_conf(small=True)["spark.executor.extraJavaOptions"]


def test_a_driver_without_the_archive_starts_without_the_option(monkeypatch):
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "0")
    assert "SharedArchiveFile" not in driver_conf()["spark.driver.extraJavaOptions"]


def test_other_jars_look_for_another_archive():
    jars = driver_jars()
    assert class_archive(jars[:-1]) != class_archive(jars) == class_archive(list(jars))
