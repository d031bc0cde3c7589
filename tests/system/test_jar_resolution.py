"""Delta jar resolution: independent of the user's Maven and Ivy caches, says why it failed, and
adds to Spark's class path only what Spark lacks. And the local driver's heap, sized to the machine.

The resolution tests download from Maven Central into a temporary cache and start a JVM.
"""

from pathlib import Path

import pytest

from incremental_assets.lib.spark import (
    DELTA_JARS,
    DELTA_VERSION,
    JarSet,
    driver_memory,
    not_shipped_with_spark,
)

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
def test_the_local_driver_takes_a_third_of_the_machine_between_2_and_8_gib(physical_gib, heap):
    assert driver_memory(physical_gib * 2**30) == heap
