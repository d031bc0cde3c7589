"""A run as a whole process: what a schedule tick or the daemon's run launcher pays, since each
run is a fresh process. Each history gets its own warehouse, settings and Dagster home; its days
are processed first, then each repetition appends one hour of loads and times
`incremental-assets run` from the outside, with the process's own account of where its seconds
went (INCREMENTAL_ASSETS_TIMINGS: interpreter, imports, instance, definitions, JVM, steps, Spark's
jobs, exit). Right after each run, its floor as a whole process: a fresh Python process that starts
the session the run's first Spark step starts, reads the same hour's source rows and appends them
once to a Delta table with plain Spark, and exits (no Dagster, no state, no second table). Histories
are measured in turn, repetition by repetition, so that a drift of the machine's speed reaches them
alike.

Then the same one-hour run as Dagster launches it (`dagster job launch`, what a sensor tick or the
UI does): in a process of its own, and in the warm worker (`incremental-assets serve`, after its
first WARM_UP_PAIRS pairs, whose seconds are kept apart), timed from the run's creation to its end
in the instance's run records, with each step's seconds from the run's event log.

Each section (the runs as whole processes, with --before their twins, the launched runs in their
own process, in the warm worker) works on a copy of the same processed history and first runs
WARM_UP_PAIRS hours it does not measure: every section measures the same hours of the stream. (On
one warehouse, each section read the hours after the previous one's, later and busier ones.)

With --before DIR (a checkout of an earlier commit), each repetition also runs the same one-hour
run with that checkout's code, right after this one's, on its own copy: before and after, side by
side, over the same hours.

    .venv/bin/python benchmarks/process.py [--events-per-day N] [--shape dense|site] [--histories 7 60]
        [--reps 3] [--before DIR] [--no-launched]

Writes benchmarks/results/process.json (the dense shape) or process-site.json (measure.EVENTS_PER_USER).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from pathlib import Path

from dagster import DagsterEventType
from deltalake import DeltaTable
from measure import RESULTS, history_hours, users_for

from incremental_assets.lib.catalog import DAILY_JOB, INCREMENTAL_JOB
from incremental_assets.lib.environment import jar_cache_dir
from incremental_assets.lib.incremental.days import daily_runs, days_window_tags
from incremental_assets.lib.sample.stream import read_stream_state
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow

BIN = Path(sys.executable).parent
CLI = str(BIN / "incremental-assets")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SETUP = """
import sys
from datetime import date
from incremental_assets.cli.runner import run_until_caught_up
from incremental_assets.lib import environment
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import generate_stream
from incremental_assets.lib.settings import load_settings
from incremental_assets.lib.spark import build_spark_session

days, per_day, start, users, hours = int(sys.argv[1]), int(sys.argv[2]), date.fromisoformat(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
params = SampleParams(users=users, days=days + 10, events_per_day=per_day, start_date=start, seed=11)
generate_stream(build_spark_session(), environment.table_uri(environment.ATOMIC_EVENTS), params, hours=hours)
assert all(run.success for run in run_until_caught_up(load_settings(), report=lambda line: None))
"""
FLOOR = """
import sys
from datetime import datetime

sys.path.insert(0, sys.argv[5])
from measure import floor_write
from incremental_assets.lib.spark import build_spark_session

source, after, until, scratch = sys.argv[1], datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3]), sys.argv[4]
floor_write(build_spark_session(small=True), source, after, until, scratch)
"""


def history(root: Path, days: int, events_per_day: int, warehouse: str | None = None,
            store_env: dict[str, str] | None = None, shape: str = "dense") -> dict[str, str]:
    """A warehouse holding `days` days of processed history and the next morning (history_hours;
    loads ending two days ago, so the hours appended later lie in the past); the environment its
    commands run in. By default the warehouse is a folder under `root`; an object store's takes
    its variables in `store_env`."""
    start = date.today() - timedelta(days=days + 2)
    place = root / f"history-{days}"
    place.mkdir(parents=True)
    (place / "settings.yaml").write_text(f"start_date: '{start}'\nbackfill_limit_days: 400\n")
    env = {
        **os.environ,
        **(store_env or {}),
        "INCREMENTAL_ASSETS_WAREHOUSE": warehouse or str(place / "warehouse"),
        "INCREMENTAL_ASSETS_CONFIG": str(place / "settings.yaml"),
        "DAGSTER_HOME": str(place / "dagster_home"),
    }
    env.pop("INCREMENTAL_ASSETS_SOURCE", None)
    users = str(users_for(events_per_day, shape))
    subprocess.run([sys.executable, "-c", SETUP, str(days), str(events_per_day), str(start), users, str(history_hours(days))],
                   env=env, check=True)
    return env


def append_hour(env: dict[str, str]) -> int:
    """The stream's next hour of loads appended to the history's source: the events it loaded."""
    subprocess.run([CLI, "generate", "--append-hours", "1"], env=env, check=True, capture_output=True)
    [commit] = DeltaTable(f"{env['INCREMENTAL_ASSETS_WAREHOUSE']}/atomic_events").history(1)
    return int(commit["operationMetrics"]["numOutputRows"])


def one_hour_run(env: dict[str, str], timings: Path, code: Path | None = None, floor: bool = True) -> dict:
    """One more hour of loads, then `incremental-assets run` timed as a whole process (with the
    package from `code`, a checkout, when given), then (`floor`: a local warehouse) its floor as a
    whole process."""
    source = f"{env['INCREMENTAL_ASSETS_WAREHOUSE']}/atomic_events"
    loaded_after = read_stream_state(source)[1] if floor else None
    events = append_hour(env)
    if code is not None:  # with this checkout's jars and class archive: another checkout's cache may hold no archive
        env = {**env, "PYTHONPATH": str(code), "INCREMENTAL_ASSETS_JAR_CACHE": str(jar_cache_dir())}
    started = time.perf_counter()
    # The driver's web UI stays off, as in a user's run: the timings read Spark's jobs from its status store.
    done = subprocess.run([CLI, "run"], env={**env, "INCREMENTAL_ASSETS_TIMINGS": str(timings)}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"run failed:\n{done.stdout}\n{done.stderr}")
    measured = {"seconds": round(seconds, 2), "events_loaded": events, "said": done.stdout.splitlines()[0],
                **json.loads(timings.read_text())}
    if floor:
        measured["floor_seconds"] = floor_process(env, source, loaded_after, loaded_after + timedelta(hours=1), timings.parent)
    return measured


def floor_process(env: dict[str, str], source: str, after: datetime, until: datetime, scratch: Path) -> float:
    """The hour's source rows read and appended once with plain Spark, in a process of its own."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR, source, after.isoformat(), until.isoformat(),
                    str(scratch / f"floor-{time.monotonic_ns()}"), str(HERE)], env=env, check=True, capture_output=True)
    return round(time.perf_counter() - started, 2)


# Hours each section runs before those it measures: the warm worker's first runs after its
# rehearsal still compile the code paths of a real warehouse's sizes (a deployment's worker serves
# hourly runs for days), and the other sections run them too, so that all measure the same hours.
# Each section's first pairs are reported apart (`first_pairs`).
WARM_UP_PAIRS = 2


# What places a history: its warehouse, its settings and its Dagster home, all in one folder.
HISTORY_KEYS = ("INCREMENTAL_ASSETS_WAREHOUSE", "INCREMENTAL_ASSETS_CONFIG", "DAGSTER_HOME")


def section_copy(env: dict[str, str], name: str) -> dict[str, str]:
    """A copy of a history's folder (warehouse, settings, Dagster home) for one section, and the
    environment its commands run in."""
    place = Path(env["DAGSTER_HOME"]).parent
    copy = place.with_name(f"{place.name}-{name}")
    shutil.copytree(place, copy)
    return {**env, **{key: env[key].replace(str(place), str(copy), 1) for key in HISTORY_KEYS}}


def launched_runs(env: dict[str, str], reps: int, warm: bool) -> tuple[list[dict], list[dict]]:
    """`reps` one-hour runs launched through the instance: the incremental run, then the daily run
    its days call for (what the daily sensor requests), each timed from its creation to its end,
    after WARM_UP_PAIRS pairs (`warm`: in the warm worker). (The first pairs, the runs measured.)"""
    from dagster import DagsterInstance

    from incremental_assets.lib.worker import serving

    home = Path(env["DAGSTER_HOME"])
    place = home.parent
    config = (ROOT / "dagster.yaml").read_text()  # launched at once: no queue (no daemon) in the way
    (home / "dagster.yaml").write_text(config + "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n")
    workspace = place / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_module:\n      module_name: incremental_assets.definitions\n      working_directory: {ROOT}\n")
    worker = None
    if warm:
        worker = subprocess.Popen([CLI, "serve"], env=env, stdout=open(place / "worker.log", "w"), stderr=subprocess.STDOUT)
        while serving(home) is None:  # its rehearsal first
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited: {(place / 'worker.log').read_text()[-2000:]}")
            time.sleep(1)
    runs = []
    try:
        os.environ.update({key: env[key] for key in HISTORY_KEYS})
        with DagsterInstance.get() as instance:
            for _ in range(WARM_UP_PAIRS + reps):
                events = append_hour(env)
                incremental = {**launch_and_wait(instance, env, workspace, INCREMENTAL_JOB, {}), "events_loaded": events}
                # then the daily run the daily sensor requests for the days the incremental run marked
                [(first, last, _)] = daily_runs(StateStore().days(), utcnow().date())
                daily = launch_and_wait(instance, env, workspace, DAILY_JOB, days_window_tags(first, last))
                runs.append({**incremental, "daily_seconds": daily["seconds"], f"{DAILY_JOB} steps": daily[f"{DAILY_JOB} steps"],
                             "with_daily_seconds": round(incremental["seconds"] + daily["seconds"], 2)})
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
    return runs[:WARM_UP_PAIRS], runs[WARM_UP_PAIRS:]


def launch_and_wait(instance, env: dict[str, str], workspace: Path, job: str, tags: dict[str, str]) -> dict:
    """`job` launched as the UI or a sensor launches it, timed from the run's creation to its end."""
    before = {run.run_id for run in instance.get_runs()}
    subprocess.run([BIN / "dagster", "job", "launch", "-w", workspace, "-j", job, "--tags", json.dumps(tags)], env=env,
                   check=True, capture_output=True)
    [run_id] = {run.run_id for run in instance.get_runs()} - before
    while not (record := instance.get_run_record_by_id(run_id)).dagster_run.is_finished:
        time.sleep(0.1)
    if record.dagster_run.status.value != "SUCCESS":
        errors = [e.dagster_event.event_specific_data.error.to_string()[-3000:] for e in instance.all_logs(run_id)
                  if e.dagster_event and e.dagster_event.is_step_failure]
        raise RuntimeError(f"launched run {run_id} ended {record.dagster_run.status.value}: {errors}")
    created = record.create_timestamp.timestamp()
    return {"seconds": round(record.end_time - created, 2), "until_started": round(record.start_time - created, 2),
            f"{job} steps": step_seconds(instance, run_id)}


def step_seconds(instance, run_id: str) -> dict[str, float]:
    """Each step's seconds, as its success event reports them (as the command line's timings do)."""
    successes = instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)
    return {e.dagster_event.step_key: round(e.dagster_event.event_specific_data.duration_ms / 1000, 2) for e in successes}


def summary(runs: list[dict]) -> dict:
    """The median run's figures, and every run's seconds."""
    ordered = sorted(runs, key=lambda run: run["seconds"])
    medians = {f"median_{key}": round(statistics.median(r[key] for r in runs), 2)
               for key in ("floor_seconds", "daily_seconds", "with_daily_seconds") if key in runs[0]}
    if "daily_job steps" in runs[0]:  # the step whose cost grew with the history
        medians["median_history_step_seconds"] = round(statistics.median(r["daily_job steps"].get("attributes_history", 0) for r in runs), 2)
    return {"median_seconds": round(statistics.median(r["seconds"] for r in runs), 2), **medians,
            "seconds": [r["seconds"] for r in runs], "events_loaded": [r.get("events_loaded") for r in runs],
            "median_run": ordered[len(ordered) // 2]}


def launched_summary(first: list[dict], measured: list[dict]) -> dict:
    """summary() of the runs measured, with the seconds of the first, unmeasured pairs beside them."""
    return {**summary(measured), **({"first_pairs_with_daily_seconds": [r["with_daily_seconds"] for r in first]} if first else {})}


def checkout_commit(checkout: Path) -> str:
    """The commit a --before checkout holds, as results.md names it; its path when it is no git checkout."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else str(checkout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events-per-day", type=int, default=20_000)
    parser.add_argument("--shape", choices=["dense", "site"], default="dense", help="events per user a day (measure.py)")
    parser.add_argument("--histories", type=int, nargs="+", default=[7, 60])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit, measured side by side")
    parser.add_argument("--no-launched", action="store_true", help="skip the runs launched through the instance")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-process-") as tmp:
        root = Path(tmp)
        envs = {days: history(root, days, args.events_per_day, shape=args.shape) for days in args.histories}
        sides = {"after": None, **({"before": args.before} if args.before else {})}  # the code each side runs
        cold = {(side, days): section_copy(env, side) for side in sides for days, env in envs.items()}
        runs = {key: [] for key in cold}
        for rep in range(-WARM_UP_PAIRS, args.reps):  # the first hours unmeasured
            for (side, days), env in cold.items():
                run = one_hour_run(env, root / f"timings-{days}-{rep}-{side}.json", sides[side], floor=rep >= 0)
                if rep >= 0:
                    runs[side, days].append(run)
        launched = {} if args.no_launched else {
            f"{days}_days_{how}": launched_summary(*launched_runs(section_copy(env, how), args.reps, warm=how == "warm"))
            for how in ("own_process", "warm") for days, env in envs.items()
        }
    first, last = args.histories[0], args.histories[-1]
    results = {
        "measured": datetime.now().isoformat(timespec="seconds"),
        "unmeasured_hours": WARM_UP_PAIRS,
        "events_per_day": args.events_per_day,
        "shape": args.shape,
        "users": users_for(args.events_per_day, args.shape),
        "one_hour_run_whole_process": {f"{days}_days": summary(runs["after", days]) for days in args.histories},
        "one_hour_run_launched": launched,
    }
    if args.before:
        results["before"] = {"code": checkout_commit(args.before), "one_hour_run_whole_process": {f"{days}_days": summary(runs["before", days]) for days in args.histories}}
    medians = results["one_hour_run_whole_process"]
    results[f"ratio_{last}_to_{first}_days"] = round(
        medians[f"{last}_days"]["median_seconds"] / medians[f"{first}_days"]["median_seconds"], 2)
    RESULTS.mkdir(exist_ok=True)
    name = "process.json" if args.shape == "dense" else f"process-{args.shape}.json"
    (RESULTS / name).write_text(json.dumps(results, indent=1) + "\n")
    for label, measured in (("", results), ("before, ", results.get("before"))):
        for days, figures in (measured or {}).get("one_hour_run_whole_process", {}).items():
            print(f"{label}{days}: {figures['median_seconds']} s (runs {figures['seconds']}), floor {figures.get('median_floor_seconds')} s, "
                  f"attributes_history {figures.get('median_history_step_seconds')} s")
            for phase, seconds in figures["median_run"]["phases"]:
                print(f"  {phase:<40}{seconds:>8.2f}")
    for name, figures in launched.items():
        print(f"launched, {name}: {figures['median_seconds']} s (runs {figures['seconds']}), "
              f"daily {figures['median_daily_seconds']} s, both {figures['median_with_daily_seconds']} s")
        median = figures["median_run"]
        for step, seconds in (*median[f"{INCREMENTAL_JOB} steps"].items(), *median[f"{DAILY_JOB} steps"].items()):
            print(f"  {step:<70}{seconds:>8.2f}")


if __name__ == "__main__":
    main()
