"""Running the incremental job in-process (CLI, demo) and previewing the next run without writing."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any
from uuid import uuid4

from dagster import AssetKey, DagsterInstance

from incremental_assets.lib import environment, timings
from incremental_assets.lib.catalog import (
    DAILY_AGGREGATES,
    DAILY_JOB,
    EVENTS_THIS_RUN,
    FILTERED_EVENTS,
    INCREMENTAL_JOB,
    LIFECYCLE,
    NEW_EVENT_LIMITS,
    QUARANTINE,
    incremental_versions,
)
from incremental_assets.lib.delta.log import row_count
from incremental_assets.lib.errors import StepFailure, step_failure
from incremental_assets.lib.incremental.days import daily_runs, day_range, days_window_tags
from incremental_assets.lib.incremental.limits import RunState, next_standard_lower
from incremental_assets.lib.metadata import materialization_metadata
from incremental_assets.lib.upkeep.apply import apply_plan
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.arrivals import Arrival, ArrivalBounds
from incremental_assets.lib.source.loader import Load, LoadOptions, load
from incremental_assets.lib.state.fingerprints import Plan
from incremental_assets.lib.state.hooks import alive_in, behind_daily_aggregates, record_source_version, runs_in_flight
from incremental_assets.lib.state.settings_plan import pending_plan
from incremental_assets.lib.state.run_log import PROCESSED, ROWS_KEPT, ROWS_READ, skip_reasons
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow

MAX_CATCH_UP_RUNS = 1000
# Why a run's window stopped short of the newest source event, by its run state.
BEHIND = {
    RunState.NEW_MODEL.value: "a new incremental asset is backfilled from start_date one window at a time",
    RunState.OUT_OF_SYNC.value: "the incremental assets are brought in sync one window at a time",
}
# The steps a window's events pass through, each accounting for what it read.
WINDOW_STEPS = (LIFECYCLE, EVENTS_THIS_RUN, FILTERED_EVENTS)


@dataclass(frozen=True)
class WindowAccount:
    """Every event a run's window read: stored in filtered_events, or counted under a reason."""

    read: int
    stored: int
    counted: dict[str, int]

    @property
    def balanced(self) -> bool:
        return self.read == self.stored + sum(self.counted.values())

    def describe(self) -> str:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self.counted.items()))
        return f"read {self.read} = stored {self.stored} + counted {sum(self.counted.values())}" + (
            f" ({reasons})" if reasons else "")


@dataclass
class RunSummary:
    run_id: str
    success: bool
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    daily_runs: list["RunSummary"] = field(default_factory=list)
    days: list[str] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)
    failure: StepFailure | None = None  # the first failed step's

    @property
    def error(self) -> str | None:
        """Why the first failed step failed."""
        return self.failure.cause if self.failure else None

    def failed_run(self) -> "RunSummary":
        """The run that failed: this one, or the first of its daily runs that failed."""
        return next((run for run in self.daily_runs if not run.success), self)

    def failure_text(self) -> str:
        """` in <step> (writing <table>): <cause>`, as a failed run's line ends."""
        return f" in {self.failure}" if self.failure else ": no step reported its error"

    def value(self, asset: str, key: str, default: Any = None) -> Any:
        return self.metadata.get(asset, {}).get(key, default)

    @property
    def caught_up(self) -> bool:
        """No source event lies past this run's window: every one loaded so far was inside one."""
        return bool(self.value(EVENTS_THIS_RUN, "caught_up"))

    @property
    def window(self) -> WindowAccount | None:
        """The account of the window's events, from the steps that read them (None: a step skipped)."""
        steps = [self.metadata.get(step, {}) for step in WINDOW_STEPS]
        if any(ROWS_READ not in step for step in steps):
            return None
        counted: dict[str, int] = {}
        for step in steps:
            for reason, n in skip_reasons(step).items():
                counted[reason] = counted.get(reason, 0) + n
        return WindowAccount(steps[0][ROWS_READ], steps[-1][ROWS_KEPT], counted)

    def left_behind(self) -> str | None:
        """What a single successful run leaves for the next one: None when every source event
        loaded so far was inside a processed window (or the run stopped before its batch)."""
        batch = self.metadata.get(EVENTS_THIS_RUN, {})
        if not self.success or "caught_up" not in batch or batch["caught_up"]:
            return None
        why = BEHIND.get(batch.get("run_state"), "its window ended at backfill_limit_days")
        return (f"Not caught up: {why}, and source events from {batch.get('next_event')} on wait for the next run. "
                "Run again, or: incremental-assets run --until-caught-up")

    def describe(self) -> str:
        if not self.success and EVENTS_THIS_RUN not in self.metadata:  # it ended before its batch
            error = self.error or ""
            return error.split(". ")[0] if error.startswith("refused:") else f"failed{self.failure_text()}"
        batch = self.metadata.get(EVENTS_THIS_RUN, {})
        new = self.value(FILTERED_EVENTS, "rows_inserted", 0)
        parts = [
            f"{batch.get('run_state', '?'):<12}",
            f"[{batch.get('lower_limit')} .. {batch.get('upper_limit')}]",
            f"events this run {batch.get('events_found', 0):>6}",
            f"duplicates dropped {batch.get('duplicates_dropped', 0):>4}",
            f"new events {new:>6}" if new else "no new events",
            f"already stored {self.value(FILTERED_EVENTS, 'events_offered', 0) - new:>5}",
            f"sessions quarantined {self.value(QUARANTINE, 'rows_inserted', 0)}",
            f"days recomputed {sum(len(r.days) for r in self.daily_runs)}",
        ]
        if self.window is not None:
            parts.append(f"| window: {self.window.describe()}")
        if batch.get("skipped"):  # nothing new, or a quiet window: nothing read
            parts.append(f"| {batch['skipped']}")
        unread = skip_reasons(self.metadata.get(NEW_EVENT_LIMITS, {}))
        if unread:
            parts.append(f"| arrived where no window reads: {unread}")
        return "  ".join(parts)


def settings_run_config(settings: IncrementalSettings) -> dict[str, Any]:
    return {"resources": {"settings": {"config": settings.model_dump(include=set(IncrementalSettings.model_fields))}}}


def instance_or_default(instance: DagsterInstance | None) -> DagsterInstance:
    """The given instance, or the project's (DAGSTER_HOME). Opened under a file lock: on a fresh
    home, Dagster creates its SQLite tables when first opened, and two processes opening it at the
    same moment would both try to ("table runs already exists")."""
    if instance is not None:
        return instance
    home = environment.dagster_home()
    environment.check_instance_storage(home)
    with open(home / ".instance.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        instance = DagsterInstance.get()
        instance.get_runs(limit=1)
        instance.get_latest_materialization_event(AssetKey("none"))
        instance.all_instigator_state()
    timings.mark("dagster instance")
    return instance


def _execute(job_name: str | None, settings: IncrementalSettings, instance, run_config=None, tags=None,
             assets: list[AssetKey] | None = None) -> RunSummary:
    """Run a job of definitions built from these settings (so the daily partitions start at their
    start_date), in this process, on `assets` if given; without a job name, Dagster's own asset job
    on `assets`, as the UI or a sensor's request runs them."""
    from incremental_assets.definitions import build_definitions

    log_file = environment.run_log_file()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    loggers = {"loggers": {"cli": {"config": {"path": str(log_file)}}}}
    config = {**settings_run_config(settings), **loggers, **(run_config or {})}
    definitions = build_definitions(settings)
    job = definitions.resolve_job_def(job_name) if job_name else definitions.resolve_implicit_global_asset_job_def()
    if assets is not None:
        job = job.get_subset(asset_selection=set(assets))
    job_name = job_name or job.name
    runs_in_flight(instance)  # fails the runs of killed processes in the instance, as the lease does in the run log
    timings.mark(f"{job_name}: definitions")
    result = job.execute_in_process(run_config=config, instance=instance, raise_on_error=False, tags=tags)
    timings.mark(f"{job_name}: run")
    if not result.success:  # steps skipped after a failure have no hook to close their records
        StateStore().close_open(result.run_id, "the run failed before this asset was written")
    metadata = {}
    for event in result.get_asset_materialization_events():
        values = materialization_metadata(event.materialization)
        metadata.setdefault(event.asset_key.path[-1], {}).update(values)
    steps = {e.step_key: e.event_specific_data.duration_ms / 1000 for e in result.all_events if e.is_step_success}
    timings.detail(f"{job_name} steps", {step: round(seconds, 3) for step, seconds in steps.items()})
    failures = [step_failure(e.step_key, e.event_specific_data.error) for e in result.all_events if e.is_step_failure]
    return RunSummary(result.run_id, result.success, metadata, step_seconds=steps, failure=failures[0] if failures else None)


def run_incremental(
    settings: IncrementalSettings,
    lower: str | None = None,
    upper: str | None = None,
    now: str | None = None,
    instance: DagsterInstance | None = None,
) -> RunSummary:
    """One run of the incremental job in this process, then the daily partitions it marked."""
    instance = instance_or_default(instance)
    limits_config = {k: v for k, v in {"lower": lower, "upper": upper, "now": now}.items() if v is not None}
    summary = _execute(INCREMENTAL_JOB, settings, instance, {"ops": {NEW_EVENT_LIMITS: {"config": limits_config}}})
    if summary.success:
        summary.daily_runs = process_marked_days(settings, instance)
        summary.success = all(run.success for run in summary.daily_runs)
    return summary


def run_days(settings: IncrementalSettings, first: date, last: date, instance: DagsterInstance | None = None,
             attributes: bool = True) -> RunSummary:
    """daily_aggregates for the days [first, last] in one run (one Spark session), then (unless
    `attributes` is false) attributes and attributes_history."""
    assets = None if attributes else [AssetKey(DAILY_AGGREGATES)]
    summary = _execute(DAILY_JOB, settings, instance_or_default(instance), tags=days_window_tags(first, last), assets=assets)
    summary.days = [d.isoformat() for d in day_range(first, last)]
    return summary


def process_marked_days(settings: IncrementalSettings, instance: DagsterInstance) -> list[RunSummary]:
    """What the daily sensors do, in-process: one run per range of days marked to_process (the
    last also writes attributes and attributes_history); then, when they succeeded, a run of those
    two if either is behind daily_aggregates (a daily run that failed or was killed after
    daily_aggregates, a UI backfill)."""
    runs = [run_days(settings, first, last, instance, attributes)
            for first, last, attributes in daily_runs(StateStore().days(), utcnow().date())]
    behind = behind_daily_aggregates(instance) if all(run.success for run in runs) else []
    return runs + ([_execute(None, settings, instance, assets=behind)] if behind else [])


def run_until_caught_up(settings: IncrementalSettings, report=print, **kwargs) -> list[RunSummary]:
    """Runs until no source event lies past the last window: every event loaded so far was inside one."""
    summaries = []
    for _ in range(MAX_CATCH_UP_RUNS):
        summary = run_incremental(settings, **kwargs)
        summaries.append(summary)
        report(summary.describe())
        if not summary.success or summary.caught_up:
            return summaries
    raise RuntimeError(f"Not caught up after {MAX_CATCH_UP_RUNS} runs: raise backfill_limit_days")


def incremental_models(settings: IncrementalSettings) -> list[str]:
    """The incremental assets a run of the incremental job holds (the manifest tracks these)."""
    return sorted(incremental_of(settings))


@dataclass
class LoadOutcome:
    """A load, and the keyhole run that processed its rows behind the cursor (if any)."""

    load: Load
    keyhole: RunSummary | None = None
    command: str | None = None  # what processes the rows behind the cursor, when the load did not

    @property
    def success(self) -> bool:
        return self.keyhole is None or self.keyhole.success


def arrival_bounds(settings: IncrementalSettings, now: datetime | None = None) -> ArrivalBounds:
    """How the next run will see rows loaded now: behind the cursor, before start_date, in the future."""
    entries = StateStore().entries()
    lower = next_standard_lower(entries, incremental_models(settings), settings.lookback_window_hours)
    return ArrivalBounds(datetime.combine(settings.start, time.min), now or utcnow(), lower)


def load_export(
    settings: IncrementalSettings, path: str, options: LoadOptions, dry_run: bool = False, process: bool = True,
    instance: DagsterInstance | None = None, report=print,
) -> LoadOutcome:
    """`incremental-assets load`: the export checked, counted and written to the source table (all or
    nothing), then its rows behind the incremental cursor processed by a keyhole run over exactly
    their range, which recomputes the days it changed, late or not (the manifest stays where it
    is). With `process` False, the command that processes them is given instead."""
    from incremental_assets.lib.source.loader import export_format
    from incremental_assets.lib.spark import build_spark_session

    export_format(path)  # a missing file or an unknown format costs no Spark start
    result = load(build_spark_session(), path, environment.source_table_uri(), options, arrival_bounds(settings),
                  settings.session_timestamp, dry_run=dry_run)
    for line in result.describe():
        report(line)
    if result.written:
        instance = instance_or_default(instance)
        record_source_version(instance, f"incremental-assets load {path}", result.rows)
    outcome = LoadOutcome(result)
    if not result.arrivals[Arrival.BEHIND]:
        return outcome
    lower, upper = (moment.isoformat() for moment in (result.arrivals.behind_from, result.arrivals.behind_to))
    outcome.command = f"incremental-assets run --lower {lower} --upper {upper}"
    if dry_run or not process:
        report(f"Process the rows behind the cursor with: {outcome.command}")
        return outcome
    report(f"Processing the rows behind the cursor: keyhole run over [{lower}, {upper}] (the manifest does not move)")
    instance = instance_or_default(instance)
    outcome.keyhole = run_incremental(settings, lower=lower, upper=upper, instance=instance)
    report(f"  run: {outcome.keyhole.describe()}")
    for run in outcome.keyhole.daily_runs:
        what = f"daily_aggregates {run.days[0]} .. {run.days[-1]}" if run.days else "what follows daily_aggregates"
        report(f"  {what}: {'ok' if run.success else 'FAILED'}")
    return outcome


def incremental_of(settings: IncrementalSettings) -> dict[str, str | None]:
    """The definitions' incremental assets and their code versions (what the plan fingerprints)."""
    from incremental_assets.definitions import build_definitions

    return incremental_versions(build_definitions(settings).resolve_asset_graph())


@dataclass
class Applied:
    """A plan carried out: its rows before, per table, and the runs that rebuilt what it emptied."""

    plan: Plan
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    runs: list[RunSummary] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return all(run.success for run in self.runs)


def apply_changes(
    settings: IncrementalSettings, forward_only: bool = False, instance: DagsterInstance | None = None, report=print,
    now: str | None = None,
) -> Applied:
    """`incremental-assets apply`: the pending plan carried out (plans.apply_plan), then runs until
    the tables it emptied are rebuilt and the days it marked are recomputed; the rows of each table
    before and after go to the run log."""
    from incremental_assets.lib.spark import build_spark_session

    instance = instance_or_default(instance)
    incremental = incremental_of(settings)
    changes, current = pending_plan(settings, StateStore(), incremental, forward_only)
    for line in changes.describe()[: -1 if not changes.empty else None]:  # not "nothing is written until..."
        report(line)
    applied = Applied(changes)
    if changes.empty:
        return applied
    run_id = f"apply-{uuid4()}"
    state = StateStore()
    applied.before = apply_plan(settings, changes, current, state, build_spark_session, run_id, alive_in(instance),
                                utcnow().date(), incremental)
    report("Applied" + (" forward-only: nothing rebuilt" if forward_only else "; rebuilding:"))
    if not forward_only:
        applied.runs = run_until_caught_up(settings, report=lambda line: report(f"  run: {line}"), instance=instance, now=now)
        applied.runs += process_marked_days(settings, instance)
        for table in applied.before:
            applied.after[table] = row_count(state.uri(table)) or 0
            state.record(run_id, table, PROCESSED, {"dagster/row_count": applied.after[table]},
                            message=f"rebuilt after the plan: {applied.before[table]} rows before, {applied.after[table]} after")
            report(f"  {table:<28} {applied.before[table]:>8} rows before {applied.after[table]:>8} after")
    return applied


def rehearse(session) -> list[RunSummary]:
    """The pipeline over a small sample stream in a scratch warehouse, source, Dagster home and
    in-memory instance (the process's environment restored after): what loads and compiles Spark's
    and Delta's code before a real run (the warm worker), or records it (the class archive). The
    stream's first runs create the tables; one more hour then takes the paths of an hourly run
    into tables that hold data (small merges, checks on the latest writes, the daily partials and
    attributes_history kept from what they hold)."""
    from incremental_assets.lib.sample.generator import SampleParams
    from incremental_assets.lib.sample.stream import append_hours, generate_stream

    params = SampleParams(users=4, days=2, events_per_day=60)
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="incremental-assets-rehearsal-") as scratch:
        source = f"{scratch}/source"
        os.environ.update({
            "INCREMENTAL_ASSETS_WAREHOUSE": f"{scratch}/warehouse", "INCREMENTAL_ASSETS_SOURCE": source,
            "INCREMENTAL_ASSETS_CONFIG": os.devnull, "DAGSTER_HOME": f"{scratch}/home",
        })
        try:
            generate_stream(session, source, params)
            settings = IncrementalSettings(start_date=params.start_date.isoformat())
            with DagsterInstance.ephemeral() as instance:
                runs = run_until_caught_up(settings, report=lambda line: None, instance=instance)
                if not runs[-1].success:  # interrupted (a SIGTERM to the worker) or failed: no more runs
                    return runs
                append_hours(session, source, 1)
                return [*runs, run_incremental(settings, instance=instance)]
        finally:
            os.environ.clear()
            os.environ.update(saved)


# Run in a fresh interpreter: a rehearsal by a driver launched with the given settings (the
# project's, and the option that records the classes it loaded when its JVM exits).
RECORD_SCRIPT = """
import json, sys
from incremental_assets.cli.runner import rehearse
from incremental_assets.lib.spark import build_spark_session

session = build_spark_session(extra_conf=json.loads(sys.argv[1]))
assert all(run.success for run in rehearse(session))
jvm = session.sparkContext._gateway.proc
session.stop()
jvm.stdin.close()  # the gateway exits on end of input, and writes the archive as it does
jvm.wait()
"""


def record_class_archive() -> Path | None:
    """The driver's class archive for this JVM and these jars (lib/spark.py), recorded first when
    it is missing (idempotent; two set-ups at once record it once). None under Spark Connect, whose
    server is started elsewhere."""
    from incremental_assets.lib.spark import class_archive, driver_conf, driver_jars, failure_cause, made_once

    if os.environ.get("SPARK_REMOTE"):
        return None
    archive = class_archive(driver_jars())

    def recorded() -> Path:
        partial = archive.with_suffix(".recording")
        partial.unlink(missing_ok=True)
        # The same jars as the drivers that will use it (S3A's too, for an object store), though the
        # rehearsal's scratch warehouse is local.
        conf = driver_conf(record_classes_to=partial)
        result = subprocess.run([sys.executable, "-c", RECORD_SCRIPT, json.dumps(conf)], capture_output=True, text=True)
        if result.returncode != 0 or not partial.exists():
            raise RuntimeError(f"Could not record the driver's class archive {archive}:\n{failure_cause(result.stdout + result.stderr)}")
        return partial.rename(archive)

    return made_once(archive.parent, lambda: archive if archive.exists() else None, recorded)
