"""How fast the sample stream is generated: in memory, and written to Delta as a daily batch.

Generates 90 days of 20k events a day in memory (users scaled with the volume, the other
parameters default), then writes two 24-hour batches of the same stream to a temporary Delta
table with a local[2] session: the first through generate_stream (which creates the table), the
second through append_hours. Prints the numbers and writes benchmarks/results/generator_speed.json.

    .venv/bin/python benchmarks/generator_speed.py
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from datetime import date, timedelta

from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.sample.stream import append_hours, generate_stream
from incremental_assets.lib.spark import build_spark_session

from measure import save_results

DAYS = 90
EVENTS_PER_DAY = 20_000
DEFAULTS = SampleParams(start_date=date(2024, 1, 1))
PARAMS = dataclasses.replace(
    DEFAULTS,
    users=round(DEFAULTS.users * EVENTS_PER_DAY / DEFAULTS.events_per_day),
    days=DAYS,
    events_per_day=EVENTS_PER_DAY,
)


def _timed(action):
    started = time.perf_counter()
    result = action()
    return result, round(time.perf_counter() - started, 2)


def in_memory() -> dict:
    table, seconds = _timed(lambda: generate_table(PARAMS, PARAMS.start, PARAMS.start + timedelta(days=DAYS)))
    return {
        "days": DAYS,
        "users": PARAMS.users,
        "events": table.num_rows,
        "seconds": seconds,
        "events_per_second": round(table.num_rows / seconds),
    }


def daily_batches() -> dict:
    """Seconds per 24-hour batch once the session is up. The first also creates the table and is the
    JVM's first Delta write (class loading); generating a day is a small part of either."""
    spark = build_spark_session(master="local[2]", shuffle_partitions=2, extra_conf={"spark.ui.enabled": "false"})
    day = timedelta(days=1)
    _, generate_seconds = _timed(lambda: generate_table(PARAMS, PARAMS.start + day, PARAMS.start + 2 * day))
    with tempfile.TemporaryDirectory(prefix="generator-speed-") as root:
        uri = f"{root}/atomic_events"
        first_rows, first_seconds = _timed(lambda: generate_stream(spark, uri, PARAMS, hours=24))
        next_rows, next_seconds = _timed(lambda: append_hours(spark, uri, 24))
    return {
        "generate_stream_rows": first_rows,
        "generate_stream_seconds": first_seconds,
        "append_hours_rows": next_rows,
        "append_hours_seconds": next_seconds,
        "generating_one_day_in_memory_seconds": generate_seconds,
    }


def main() -> None:
    save_results("generator_speed", {"in_memory": in_memory(), "daily_batch_to_delta": daily_batches()})


if __name__ == "__main__":
    main()
