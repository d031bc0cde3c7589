"""What the benchmark scripts share: a cold Spark start, a run's floor, and where their numbers go.
Light on imports: a floor timed as a process of its own imports it."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

RESULTS = Path(__file__).parent / "results"
# The shapes a bench's site can have, as events per user a day: "dense" is the earlier benches' (400
# users making 50 events a day at 20,000 a day); "site" a real site's (about 7: 2,857 users at
# 20,000 a day), where a run touches more keys for the same events.
EVENTS_PER_USER = {"dense": 50, "site": 7}


# A history's loads end at this hour of the day after its last, so the hours a bench appends and
# times are a working day's: the sample's people are active from 06:00 to 23:00, and an hour after
# midnight loads a small part of a daytime hour's events (comparisons.md). Runs timed there measure
# a quiet night, not a site's day.
HISTORY_ENDS_AT_HOUR = 10


def users_for(events_per_day: int, shape: str) -> int:
    return max(40, events_per_day // EVENTS_PER_USER[shape])


def history_hours(days: int) -> int:
    """The hours of loads a history of `days` days is built from: its days, then the next day up to
    HISTORY_ENDS_AT_HOUR."""
    return days * 24 + HISTORY_ENDS_AT_HOUR


def cold_spark_start_seconds(session_args: str = "") -> float:
    """A cold start in a fresh process: JVM, Delta jars from the cache, session.
    `session_args`: keyword arguments of build_spark_session, as Python source."""
    code = (
        "import time; t = time.perf_counter();"
        "from incremental_assets.lib.spark import build_spark_session;"
        f"build_spark_session({session_args}); print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def loaded(spark: SparkSession, source: str, after: datetime, until: datetime) -> DataFrame:
    """The source's rows loaded in (after, until]."""
    return spark.read.format("delta").load(source).where(
        (F.col("load_tstamp") > F.lit(after)) & (F.col("load_tstamp") <= F.lit(until))
    )


def floor_write(spark: SparkSession, source: str, after: datetime, until: datetime, target: str) -> None:
    """A run's floor: the same new rows read and appended once to a Delta table with plain Spark."""
    loaded(spark, source, after, until).write.format("delta").mode("append").save(target)


def save_results(name: str, results: dict) -> None:
    """Print the numbers (a section per nested dict) and write them to benchmarks/results/<name>.json."""
    _print(results)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")


def _print(numbers: dict, indent: str = "") -> None:
    for key, value in numbers.items():
        if isinstance(value, dict):
            print(f"{indent}{key}")
            _print(value, indent + "  ")
        else:
            print(f"{indent}{key:<40}{value if isinstance(value, (int, float, str)) else json.dumps(value):>12}")
