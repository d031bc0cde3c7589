"""`make bench-maintenance`: what many small runs leave behind, and what the maintenance job makes of it.

    .venv/bin/python benchmarks/maintenance.py [--runs 50] [--events-per-day 2000]

A week of history, then `--runs` incremental runs of one new hourly load each (with their daily
runs), as the source sensor would make them. Then, before and after `maintenance_job`: the files
of every table, the time of reads that runs and users make (medians of 3), and whether every
table still holds exactly the same rows. Writes benchmarks/results/maintenance.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench import Bench
from deltalake import DeltaTable
from pyspark.sql import functions as F

from incremental_assets.definitions import build_definitions
from incremental_assets.lib import environment
from incremental_assets.lib.catalog import RUN_LOG, maintained_tables
from incremental_assets.lib.sample.stream import append_hours

from measure import save_results

REPS = 3


def files() -> dict[str, int]:
    found = {}
    for table in maintained_tables():  # the built-in tables: the bench adds no asset of its own
        try:
            found[table] = len(DeltaTable(environment.table_uri(table)).file_uris())
        except Exception:  # noqa: BLE001 - a table this stream never made
            continue
    return found


def timed(read) -> float:
    """The median seconds of `read()` over REPS tries."""
    seconds = []
    for _ in range(REPS):
        started = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - started)
    return round(statistics.median(seconds), 3)


def reads(bench: Bench, settings, source: str) -> dict[str, float]:
    """Reads that runs and users make: a run with no new data (it reads the lifecycle, quarantine and
    source), a week of filtered_events by day, and whole small tables."""
    spark = bench.spark

    def table(name):
        return spark.read.format("delta").load(environment.table_uri(name))

    week = table("filtered_events").agg(F.max("event_date")).first()[0]
    return {
        "empty_incremental_run": timed(lambda: bench.run(settings, source)),
        "filtered_events_last_7_days_by_day": timed(
            lambda: table("filtered_events").where(F.col("event_date") > F.date_sub(F.lit(week), 7)).groupBy("event_date").count().collect()
        ),
        "sessions_lifecycle_manifest_count": timed(lambda: table("sessions_lifecycle_manifest").count()),
        "sessions_count": timed(lambda: table("sessions").count()),
        "daily_aggregates_count": timed(lambda: table("daily_aggregates").count()),
    }


def same_rows(bench: Bench, versions: dict[str, int]) -> dict[str, bool]:
    """Each table's rows at `versions` (before maintenance) against its rows now, both ways."""
    spark, equal = bench.spark, {}
    for name, version in versions.items():
        uri = environment.table_uri(name)
        before = spark.read.format("delta").option("versionAsOf", version).load(uri)
        after = spark.read.format("delta").load(uri)
        equal[name] = before.exceptAll(after).isEmpty() and after.exceptAll(before).isEmpty()
    return equal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--events-per-day", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="incremental-assets-maintenance-") as root:
        bench = Bench(Path(root), reps=1)
        source, params = bench.stream("maintenance", 7, args.events_per_day)
        settings = bench.settings(params)
        bench.run(settings, source)
        started = time.perf_counter()
        for _ in range(args.runs):
            append_hours(bench.spark, source, 1)
            bench.run(settings, source)
        small_runs_seconds = time.perf_counter() - started

        before = {"files": files(), "reads_seconds": reads(bench, settings, source)}
        versions = {name: DeltaTable(environment.table_uri(name)).version() for name in before["files"]}
        started = time.perf_counter()
        job = build_definitions(settings).resolve_job_def("maintenance_job")
        assert job.execute_in_process(instance=bench.instance).success
        maintenance_seconds = time.perf_counter() - started
        # Before the reads below, whose runs append to new_event_limits and run_log. The run log
        # itself gains the pass's own records: it is left out.
        unchanged = same_rows(bench, {name: v for name, v in versions.items() if name != RUN_LOG})
        after = {"files": files(), "reads_seconds": reads(bench, settings, source)}
        results = {
            "small_runs": args.runs,
            "events_per_day": args.events_per_day,
            "small_runs_seconds": round(small_runs_seconds, 1),
            "maintenance_job_seconds": round(maintenance_seconds, 1),
            "files_before": before["files"],
            "files_after": after["files"],
            "total_files": {"before": sum(before["files"].values()), "after": sum(after["files"].values())},
            "reads_seconds_before": before["reads_seconds"],
            "reads_seconds_after": after["reads_seconds"],
            "same_rows_after_maintenance": unchanged,
        }
    save_results("maintenance", results)


if __name__ == "__main__":
    main()
