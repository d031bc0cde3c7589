"""`make bench`: what incremental runs cost on this machine, in one process and one Spark session.

    .venv/bin/python benchmarks/bench.py [--size small|full] [--reps N]

  spark_start     a cold Spark start with Delta, in a fresh process (the floor of every run)
  quiet_run       the first run after the history's backfill with nothing new loaded, at a later
                  'now': a quiet window (docs/operations.md), read from the Delta log alone, that
                  moves the manifest on to 'now'
  empty_run       a run with no new data and the same 'now' (median): every asset is already there,
                  so nothing is read. For both, where the time goes: per step, and Spark's jobs by
                  call site (the rest is Dagster, planning, Delta logs, commits)
  steady_state    one incremental run over one hour of new loads, on 7, 30 and 90 days of history
  floor           the same hour's source rows read and appended once to a Delta table with plain Spark
  big_window      one run over a window of many new events (of which its daily runs), against the
                  floor for the same rows, with its largest Spark jobs; and the dedupe floor: the
                  same rows deduplicated on event_id into event_date partitions with plain Spark
                  (filtered_events' bare write)
  first_backfill  the whole pipeline over a stream, from an empty warehouse: events per second
  (big_window and first_backfill: medians of the repetitions, each in a fresh warehouse)
  daily           one daily partition recomputed, and a 30-day single-run backfill
  merge_scope     per MERGE of the last steady-state run: files it may read / files in the table
  memory          peak resident memory of this process and of its Spark JVM

Writes benchmarks/results.json (machine, sizes, figures), and from it (benchmarks/report.py)
benchmarks/results.md with its charts, cost_vs_window.png and cost_vs_history.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

# The harness's own settings, whatever a developer's ./incremental_assets.yaml says.
os.environ["INCREMENTAL_ASSETS_CONFIG"] = os.devnull

import pyarrow as pa  # noqa: E402
import pyspark  # noqa: E402
from dagster import DagsterInstance  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from incremental_assets.cli.runner import RunSummary, run_days, run_incremental  # noqa: E402
from incremental_assets.lib import environment  # noqa: E402
from incremental_assets.lib.sample.generator import SampleParams  # noqa: E402
from incremental_assets.lib.sample.stream import append_hours, generate_stream, read_stream_state  # noqa: E402
from incremental_assets.lib.settings import IncrementalSettings  # noqa: E402
from incremental_assets.lib.spark import DELTA_VERSION, build_spark_session  # noqa: E402
from incremental_assets.lib.timings import finished_jobs, seconds_by_name  # noqa: E402
from measure import cold_spark_start_seconds, floor_write, history_hours, loaded, users_for  # noqa: E402
from report import write_report  # noqa: E402

HERE = Path(__file__).parent
# The merged tables and their partition column (None: not partitioned, a MERGE reads all of it).
MERGED_TABLES = {
    "sessions_lifecycle_manifest": "start_date", "quarantined_sessions": None, "filtered_events": "event_date",
    "sessions": "start_date",
}


@dataclass(frozen=True)
class Size:
    events_per_day: int  # the steady-state streams (one hour = a 24th of it)
    histories: tuple[int, ...]  # days of history before the measured hour
    big_window_events: int  # new events in the big-window run
    backfill_events: int  # events of the first-backfill stream


SIZES = {
    "small": Size(events_per_day=2_000, histories=(7, 30, 90), big_window_events=200_000, backfill_events=500_000),
    "full": Size(events_per_day=20_000, histories=(7, 30, 90), big_window_events=1_000_000, backfill_events=5_000_000),
}


class Bench:
    """One Spark session and one Dagster instance; a fresh warehouse per scenario."""

    def __init__(self, root: Path, reps: int):
        self.root, self.reps = root, reps
        self.spark = build_spark_session()
        self.instance = DagsterInstance.ephemeral()
        self.jobs = SparkJobs(self.spark)

    def warehouse(self, name: str) -> str:
        path = self.root / name
        os.environ["INCREMENTAL_ASSETS_WAREHOUSE"] = str(path)
        os.environ.pop("INCREMENTAL_ASSETS_SOURCE", None)
        return environment.table_uri(environment.ATOMIC_EVENTS)

    def stream(self, name: str, days: int, events_per_day: int, shape: str = "dense") -> tuple[str, SampleParams]:
        """A sample stream of `days` days and the next morning (history_hours), started `days` + 2
        days before today (so its next hours are past)."""
        source = self.warehouse(name)
        params = SampleParams(
            users=users_for(events_per_day, shape), days=days + 10, events_per_day=events_per_day,
            start_date=date.today() - timedelta(days=days + 2), seed=11,
        )
        generate_stream(self.spark, source, params, hours=history_hours(days))
        return source, params

    def settings(self, params: SampleParams, **overrides) -> IncrementalSettings:
        return IncrementalSettings(start_date=params.start_date.isoformat(), backfill_limit_days=400, **overrides)

    def run(self, settings: IncrementalSettings, source: str) -> tuple[float, RunSummary]:
        """One run, with 'now' at the stream's last load: the sample replays time, as a loader would."""
        _, loaded_until = read_stream_state(source)
        started = time.perf_counter()
        summary = run_incremental(settings, now=loaded_until.isoformat(), instance=self.instance)
        if not summary.success:
            raise RuntimeError(f"run {summary.run_id} failed")
        return time.perf_counter() - started, summary

    def profiled_run(self, settings: IncrementalSettings, source: str) -> dict:
        """One run, and where its time went: per step, and Spark's jobs by call site."""
        mark = self.jobs.mark()
        seconds, summary = self.run(settings, source)
        spark_jobs = self.jobs.since(mark)
        return {
            "run_seconds": round(seconds, 2),
            "steps": rounded(summary.step_seconds),
            "spark_jobs_seconds": round(sum(spark_jobs.values()), 2),
            "outside_spark_jobs_seconds": round(seconds - sum(spark_jobs.values()), 2),
            "spark_jobs_by_call_site": spark_jobs,
        }

    def floor(self, source: str, loaded_after: datetime, loaded_until: datetime) -> float:
        """The same new source rows, read and appended once to a Delta table with plain Spark."""
        started = time.perf_counter()
        floor_write(self.spark, source, loaded_after, loaded_until, self._scratch("floor"))
        return time.perf_counter() - started

    def dedupe_floor(self, source: str, loaded_after: datetime, loaded_until: datetime) -> float:
        """The same rows deduplicated on event_id into event_date partitions with plain Spark: the
        least a run must do to store them as filtered_events, with no session or manifest."""
        started = time.perf_counter()
        rows = loaded(self.spark, source, loaded_after, loaded_until).dropDuplicates(["event_id"])
        rows = rows.withColumn("event_date", F.to_date("derived_tstamp"))
        rows.write.format("delta").partitionBy("event_date").save(self._scratch("dedupe-floor"))
        return time.perf_counter() - started

    def _scratch(self, name: str) -> str:
        return str(self.root / f"{name}-{time.monotonic_ns()}")


class SparkJobs:
    """Spark's own record of the jobs it ran (the driver's status store), to say where a run's time went."""

    def __init__(self, spark):
        self.spark = spark

    def mark(self) -> int:
        return max((job_id for job_id, _, _ in finished_jobs(self.spark)), default=-1)

    def since(self, mark: int) -> dict[str, float]:
        """Seconds of the jobs after `mark`, by where they were called (job name: action and line)."""
        root = str(Path(__file__).resolve().parents[1]) + "/"
        return {name.replace(root, ""): round(seconds, 2) for name, seconds in seconds_by_name(finished_jobs(self.spark, after=mark)).items()}


def rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 2) for name, value in seconds.items()}


def top(spark_jobs: dict[str, float], n: int = 8) -> dict[str, float]:
    return dict(list(spark_jobs.items())[:n])


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def daily_seconds(summary: RunSummary) -> float:
    """The seconds of the daily runs an incremental run started (their steps')."""
    return round(sum(sum(run.step_seconds.values()) for run in summary.daily_runs), 2)


def steady_state(bench: Bench, size: Size) -> dict:
    """First backfill of each history, then per history: empty runs and one-hour runs."""
    results, pruning = {}, {}
    for days in size.histories:
        source, params = bench.stream(f"history-{days}", days, size.events_per_day)
        settings = bench.settings(params)
        bench.run(settings, source)  # the backfill of the history
        quiet = bench.profiled_run(settings, source)
        empty = [bench.run(settings, source) for _ in range(bench.reps)]
        empty_profile = bench.profiled_run(settings, source)  # before the hours below bring new data
        hours, daily, floors = [], [], []
        for _ in range(bench.reps):
            _, before = read_stream_state(source)
            append_hours(bench.spark, source, 1)
            seconds, summary = bench.run(settings, source)
            hours.append(seconds)
            daily.append(daily_seconds(summary))
            floors.append(bench.floor(source, before, before + timedelta(hours=1)))
        results[f"{days}_days"] = {
            "quiet_run_seconds": quiet["run_seconds"],
            "quiet_run_where_the_time_goes": quiet,
            "empty_run_seconds": median([seconds for seconds, _ in empty]),
            "empty_run_where_the_time_goes": empty_profile,
            "one_hour_run_seconds": median(hours),
            "of_which_daily_runs_seconds": median(daily),
            "one_hour_floor_seconds": median(floors),
            "new_events_per_hour": summary.value("filtered_events", "rows_inserted", 0),
            "one_hour_steps": rounded(summary.step_seconds),
        }
        pruning = merge_scope(summary)
    first, last = size.histories[0], size.histories[-1]
    ratio = results[f"{last}_days"]["one_hour_run_seconds"] / results[f"{first}_days"]["one_hour_run_seconds"]
    return {"histories": results, f"ratio_{last}_to_{first}_days": round(ratio, 2), "merge_scope": pruning}


def merge_scope(summary: RunSummary) -> dict:
    """Per table a run merged into: the files its MERGE may read (those of partitions at or after
    the floor the asset declared, and the undated; OSS Delta records no skipping metrics) against
    all its files."""
    scope = {}
    for table, column in MERGED_TABLES.items():
        if "write_mode_operation" not in summary.metadata.get(table, {}):
            continue  # this run wrote nothing there
        floor = summary.value(table, "merge_target_floor")
        actions = pa.table(DeltaTable(environment.table_uri(table)).get_add_actions(flatten=True)).to_pydict()
        files = len(actions["path"])
        in_scope = files
        if column and floor:
            in_scope = sum(1 for value in actions[f"partition.{column}"] if value is None or str(value) >= floor)
        scope[table] = {"merge_target_floor": floor, "files_in_merge_scope": in_scope, "files_in_table": files}
    return scope


def big_window(bench: Bench, size: Size) -> dict:
    """One run over two days of loads holding `big_window_events` events, against its floors: the
    medians of `reps` repetitions, each in a fresh warehouse, with the profile of the median run."""
    reps = repeated(bench, "big-window", lambda name: _big_window_once(bench, size, name))
    result = summarised(reps, "run_seconds", ("of_which_daily_runs_seconds", "floor_seconds", "dedupe_floor_seconds"))
    run, daily, floor = result["run_seconds"], result["of_which_daily_runs_seconds"], result["floor_seconds"]
    return {
        **result,
        "ratio_to_floor": round(run / floor, 2),
        "incremental_run_ratio_to_floor": round((run - daily) / floor, 2),
        "dedupe_floor_ratio_to_floor": round(result["dedupe_floor_seconds"] / floor, 2),
    }


def _big_window_once(bench: Bench, size: Size, name: str) -> dict:
    per_day = size.big_window_events // 2
    source, params = bench.stream(name, 1, per_day)
    settings = bench.settings(params)
    bench.run(settings, source)
    _, before = read_stream_state(source)
    append_hours(bench.spark, source, 48)
    mark = bench.jobs.mark()
    seconds, summary = bench.run(settings, source)
    spark_jobs = bench.jobs.since(mark)
    return {
        "new_events": summary.value("events_this_run", "events_found"),
        "run_seconds": round(seconds, 2),
        "of_which_daily_runs_seconds": daily_seconds(summary),
        "floor_seconds": round(bench.floor(source, before, before + timedelta(hours=48)), 2),
        "dedupe_floor_seconds": round(bench.dedupe_floor(source, before, before + timedelta(hours=48)), 2),
        "steps": rounded(summary.step_seconds),
        "largest_spark_jobs": top(spark_jobs),
    }


def first_backfill(bench: Bench, size: Size) -> dict:
    """The whole pipeline (incremental run and its daily runs) over a stream, from an empty
    warehouse: the medians of `reps` repetitions, with the profile of the median one."""
    reps = repeated(bench, "backfill", lambda name: _first_backfill_once(bench, size, name))
    result = summarised(reps, "seconds", ("daily_one_partition_seconds", "daily_thirty_day_backfill_seconds"))
    return {**result, "events_per_second": round(result["source_events"] / result["seconds"])}


def _first_backfill_once(bench: Bench, size: Size, name: str) -> dict:
    days = 30
    source, params = bench.stream(name, days, size.backfill_events // days)
    events = bench.spark.read.format("delta").load(source).count()
    mark = bench.jobs.mark()
    seconds, summary = bench.run(bench.settings(params), source)
    spark_jobs = bench.jobs.since(mark)
    if not summary.caught_up:
        raise RuntimeError(f"the first backfill of {name} did not catch up in one run")
    day = params.start_date + timedelta(days=days // 2)
    started = time.perf_counter()
    run_days(bench.settings(params), day, day, bench.instance)
    first_day = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    run_days(bench.settings(params), params.start_date, params.start_date + timedelta(days=29), bench.instance)
    thirty = round(time.perf_counter() - started, 2)
    return {
        "source_events": events,
        "seconds": round(seconds, 2),
        "steps": rounded(summary.step_seconds),
        "largest_spark_jobs": top(spark_jobs),
        "daily_one_partition_seconds": first_day,
        "daily_thirty_day_backfill_seconds": thirty,
    }


def repeated(bench: Bench, name: str, once) -> list[dict]:
    """`once(warehouse_name)` `reps` times, each in a fresh warehouse, removed after it (the disk
    of a 5M-event backfill, times three)."""
    results = []
    for rep in range(bench.reps):
        results.append(once(f"{name}-{rep}"))
        shutil.rmtree(bench.root / f"{name}-{rep}", ignore_errors=True)
    return results


def summarised(reps: list[dict], key: str, figures: tuple[str, ...]) -> dict:
    """The repetition of median `key` (the lower middle of an even count), whose profile is shown,
    with the medians of `key` and `figures`, and each repetition's `key` (`runs_seconds`)."""
    shown = sorted(reps, key=lambda rep: rep[key])[(len(reps) - 1) // 2]
    medians = {figure: median([rep[figure] for rep in reps]) for figure in (key, *figures)}
    return {**shown, **medians, "runs_seconds": [rep[key] for rep in reps]}


def memory(bench: Bench) -> dict:
    jvm_pid = bench.spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    status = Path(f"/proc/{jvm_pid}/status").read_text().splitlines()
    jvm_peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return {
        "python_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "jvm_peak_mb": round(jvm_peak_kb / 1024),
    }


def write_results(results: dict, command: str) -> None:
    """results.json, then results.md and its charts rendered from what it holds."""
    text = json.dumps(results, indent=2, default=str) + "\n"
    (HERE / "results.json").write_text(text)
    write_report(json.loads(text), command, HERE)


PARTS = {"steady_state": steady_state, "big_window": big_window, "first_backfill": first_backfill}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=sorted(PARTS),
                        help="measure this part again, at the size of results.json, and keep the others there")
    args = parser.parse_args()
    size = SIZES[args.size]
    now = datetime.now().isoformat(timespec="seconds")
    if args.only:
        results = json.loads((HERE / "results.json").read_text())
        if results["size"]["name"] != args.size:
            parser.error(f"results.json holds the {results['size']['name']} size: measure {args.only} again at that size")
        results.setdefault("measured_again", {})[args.only] = {"measured_at": now, "reps": args.reps}
    else:
        results = {
            "machine": f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "measured_at": now,
            "engine": f"Spark {pyspark.__version__} with Delta {DELTA_VERSION}",
            "size": {"name": args.size, **asdict(size), "reps": args.reps},
            "spark_start_seconds": round(cold_spark_start_seconds(), 2),
        }
    with tempfile.TemporaryDirectory(prefix="incremental-assets-bench-") as root:
        bench = Bench(Path(root), args.reps)
        for name, measure in PARTS.items():
            if args.only not in (None, name):
                continue
            started = time.perf_counter()
            results[name] = measure(bench, size)
            print(f"{name}: {time.perf_counter() - started:.0f}s\n{json.dumps(results[name], indent=2, default=str)}", flush=True)
        if not args.only:
            results["memory"] = memory(bench)
            print(json.dumps(results["memory"]))
    write_results(results, "make bench" + ("" if args.size == "small" else f" BENCH_SIZE={args.size}"))


if __name__ == "__main__":
    main()
