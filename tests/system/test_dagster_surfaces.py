"""Dagster's own surfaces obey the contract of the project's command line: a partition run of
Dagster's asset job (what a UI backfill and `dagster asset materialize` launch) takes and closes
the lease with its run-log records, and attributes follows it; the daemon, left alone, processes
new rows and rows behind the cursor into attributes, and launches nothing over a caught-up
warehouse. The daemon runs with the production instance (dagster.postgres.yaml: runs, events and
sensor ticks in Debian's PostgreSQL); the UI test runs the default one (SQLite) with `dagster dev`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunRequest, RunsFilter, SkipReason, build_sensor_context
from dagster._core.execution.backfill import PartitionBackfill
from dagster._core.storage.tags import RUN_KEY_TAG
from pyspark.sql import functions as F

from incremental_assets.cli.runner import run_days, run_until_caught_up
from incremental_assets.definitions import build_definitions
from incremental_assets.lib.catalog import (
    ATTRIBUTES, ATTRIBUTES_HISTORY, DAILY_AGGREGATES, FILTERED_EVENTS, INCREMENTAL_JOB, KEYHOLE_TAG, NEW_EVENT_LIMITS, RETRY_TAG,
    LIFECYCLE, WAREHOUSE_POOL, WORKER_TAG,
)
from incremental_assets.lib.delta.log import read_rows, stored_table
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.incremental.run_plan import plan_from_row
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import append_hours, generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.hooks import LIVE
from incremental_assets.lib.state.records import TO_PROCESS
from incremental_assets.lib.state.run_log import FAILED, PROCESSED, PROCESSING
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow
from incremental_assets.lib.worker import serving
from tests.dagster_processes import BIN, WORKER_START_S, a_home, a_workspace, append_events, ticks, wait_for
from tests.postgres_server import postgres_instance_env
from tests.warehouse_tables import REFERENCE_DAY, sample_source, scenario_environment

PARAMS = SampleParams(users=6, days=3, events_per_day=90, start_date=(utcnow() - timedelta(days=6)).date(), seed=11)
# The daemon's sensors look every 5 s (at the default 30 s the test would mostly wait).
SETTINGS = {"start_date": PARAMS.start_date.isoformat(), "sensor_interval_seconds": 5, "attributes_reference_date": REFERENCE_DAY}


def rows_of(spark, table: str) -> list[tuple]:
    frame = read_table(spark, StateStore().uri(table))
    rows = (tuple(row) for row in frame.select(*sorted(frame.columns)).collect())
    return sorted(rows, key=lambda row: tuple((value is None, value) for value in row))  # nulls last


def test_dagster_asset_materialize_of_a_partition_leaves_the_contracts_records_and_attributes_follow(spark, tmp_path):
    home = a_home(tmp_path)
    source = sample_source(spark, PARAMS, tmp_path)
    with scenario_environment(tmp_path / "warehouse", source, SETTINGS, home):
        settings, instance = IncrementalSettings(**SETTINGS), DagsterInstance.get()
        assert all(run.success for run in run_until_caught_up(settings, report=lambda line: None, instance=instance))
        defs = build_definitions(settings)
        follow_sensor = defs.resolve_sensor_def("attributes_after_daily_aggregates")
        assert isinstance(follow_sensor(build_sensor_context(instance=instance, definitions=defs)), SkipReason)
        day = PARAMS.start_date.isoformat()
        materialize = subprocess.run(
            [BIN / "dagster", "asset", "materialize", "-m", "incremental_assets.definitions", "--select", DAILY_AGGREGATES,
             "--partition", day], capture_output=True, text=True, timeout=600, env=os.environ,
        )
        assert materialize.returncode == 0, materialize.stderr[-3000:]
        [run] = instance.get_runs(limit=1)
        assert run.job_name == "__ASSET_JOB"
        statuses = [(r["asset"], r["status"]) for r in StateStore().run_log(run_id=run.run_id)]
        assert statuses == [(DAILY_AGGREGATES, PROCESSING), (DAILY_AGGREGATES, PROCESSED)]

        # The sensor asks for attributes and their history now that daily_aggregates changed ...
        request = follow_sensor(build_sensor_context(instance=instance, definitions=defs))
        following = [AssetKey(ATTRIBUTES), AssetKey(ATTRIBUTES_HISTORY)]
        assert isinstance(request, RunRequest) and request.asset_selection == following
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=set(following))
        follow = job.execute_in_process(instance=instance, raise_on_error=False)
        assert follow.success
        # ... and the next writer found the lease of `dagster asset materialize` closed: nothing Failed.
        assert FAILED not in {r["status"] for r in StateStore().run_log()}
        records = sorted((r["asset"], r["status"]) for r in StateStore().run_log(run_id=follow.run_id))
        assert records == sorted((key.path[-1], status) for key in following for status in (PROCESSING, PROCESSED))
        through_dagster = rows_of(spark, ATTRIBUTES), rows_of(spark, ATTRIBUTES_HISTORY)

        # What the project's own backfill of the same day leaves.
        first = date.fromisoformat(day)
        assert run_days(settings, first, first, instance).success
        assert (rows_of(spark, ATTRIBUTES), rows_of(spark, ATTRIBUTES_HISTORY)) == through_dagster


def writers(instance: DagsterInstance) -> list:
    """Runs that materialize assets (a freshness sensor's run only evaluates its checks)."""
    return [run for run in instance.get_runs() if run.job_name != "__ASSET_JOB" or run.asset_selection]


def keyed(instance: DagsterInstance, prefix: str) -> list:
    """The runs a sensor requested with a run key that starts with `prefix`."""
    return [run for run in instance.get_runs() if run.tags.get(RUN_KEY_TAG, "").startswith(prefix)]


def start_worker(tmp_path: Path) -> subprocess.Popen:
    """`incremental-assets serve` for the home in the environment, its lines appended to worker.log."""
    with open(tmp_path / "worker.log", "a") as log:
        return subprocess.Popen([BIN / "incremental-assets", "serve"], env=os.environ, cwd=tmp_path, start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT)


def in_a_spark_step(instance: DagsterInstance) -> str | None:
    """The id of an incremental run the warm worker executes that has started its first Spark step."""
    for run in instance.get_runs(RunsFilter(job_name=INCREMENTAL_JOB, statuses=[DagsterRunStatus.STARTED])):
        steps = [log.dagster_event for log in instance.all_logs(run.run_id) if log.dagster_event]
        if run.tags.get(WORKER_TAG) and any(e.is_step_start and e.step_key == LIFECYCLE for e in steps):
            return run.run_id
    return None


def not_yet_stored(spark, source: str) -> set[str]:
    """The source's events whose load time has come that filtered_events does not hold."""
    due = spark.read.format("delta").load(source).where(F.col("load_tstamp") <= F.lit(utcnow())).select("event_id")
    return {row.event_id for row in due.subtract(read_table(spark, StateStore().uri(FILTERED_EVENTS)).select("event_id")).collect()}


def day_totals(spark, table: str, events: str | None = None) -> dict:
    """Events per event_date in `table`: its rows, or the sum of its `events` column."""
    frame = read_table(spark, StateStore().uri(table)).groupBy("event_date")
    totals = frame.agg(F.sum(events).alias("n")) if events else frame.agg(F.count("*").alias("n"))
    return {row.event_date: row.n for row in totals.collect()}


def runs_told(instance: DagsterInstance, tmp_path: Path) -> str:
    """What a failed assertion about the daemon's runs needs: each run, when and where it executed
    and how a failed one ended, the last ticks of the source and daily sensors, the daily
    manifest's days, and the worker's last lines."""
    lines = []
    for record in reversed(instance.get_run_records(limit=12)):
        run, logs = record.dagster_run, instance.all_logs(record.dagster_run.run_id)
        where = run.tags.get(WORKER_TAG) or next((log.message for log in logs if "in its own process" in (log.message or "")), "?")
        why = next((log.message for log in logs if log.dagster_event and log.dagster_event.is_failure), "")
        key = run.tags.get(RUN_KEY_TAG, "no run key")
        when = " .. ".join(time.strftime("%H:%M:%S", time.gmtime(t)) if t else "-" for t in (record.start_time, record.end_time))
        lines.append(f"{run.run_id[:8]} {run.job_name} {run.status.value} {when} {key}: {where} {why[:500]}")
    lines += [f"{name} tick {time.strftime('%H:%M:%S', time.gmtime(tick.timestamp))} {tick.status.value}: "
              f"{tick.skip_reason or tick.run_keys or tick.error}"
              for name in ("source_events_sensor", "daily_partitions_sensor") for tick in ticks(instance, name)[:6]]
    lines.append(f"daily manifest: {sorted((str(day), status.status) for day, status in StateStore().days().items())}")
    return "\n".join(lines) + "\n" + (tmp_path / "worker.log").read_text()[-2000:]


def test_the_daemon_left_alone_launches_nothing_over_a_caught_up_warehouse_then_brings_attributes_up_to_date(
    spark, tmp_path, monkeypatch
):
    """Findings: on its first start after command-line runs, the source sensor launched a run nobody
    needed; rows that reached the source behind the cursor waited for a person to type a command; a
    UI partition backfill was closed as Failed by the next writer, and left attributes stale."""
    home = a_home(tmp_path, "dagster.postgres.yaml")
    a_workspace(tmp_path)
    source = str(tmp_path / "source")
    generate_stream(spark, source, PARAMS, hours=PARAMS.days * 24)
    with postgres_instance_env() as postgres, scenario_environment(tmp_path / "warehouse", source, SETTINGS, home):
        for name, value in postgres.items():
            monkeypatch.setenv(name, value)  # for this process's instance, the worker's and the daemon's
        settings, instance = IncrementalSettings(**SETTINGS), DagsterInstance.get()
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert all(run.success for run in run_until_caught_up(settings, report=lambda line: None, instance=instance))
        runs_before = len(writers(instance))
        # The warm worker executes the runs the daemon launches (one at a time; a second goes to a process of its own).
        worker = start_worker(tmp_path)
        wait_for("the worker to serve", lambda: serving(home), WORKER_START_S)
        daemon = subprocess.Popen(
            [BIN / "dagster-daemon", "run", "-w", tmp_path / "workspace.yaml"], env=os.environ, cwd=tmp_path,
            stdout=open(tmp_path / "daemon.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
        )

        def told() -> str:
            return runs_told(instance, tmp_path)

        try:
            wait_for("two ticks of the source sensor", lambda: len(ticks(instance, "source_events_sensor")) >= 2, 240, told)
            assert len(writers(instance)) == runs_before, "nothing launched over a caught-up warehouse"

            # Another writer appends two hours of the stream, and rows whose cursor lies behind the manifest.
            append_hours(spark, source, 2)
            old = spark.read.format("delta").load(source).where(F.to_date("load_tstamp") == PARAMS.start_date).limit(5)
            behind = old.withColumn("event_id", F.concat(F.lit("behind-"), "event_id"))
            behind.write.format("delta").mode("append").save(source)

            def attributes_caught_up():
                """The keyhole run ended, the rows behind the cursor are stored (by it, or by the run of
                the new hours when their session had an event there too), no day waits, and attributes
                were written after the last write of daily_aggregates, with nothing in flight."""
                keyholes = [r for r in instance.get_run_records() if r.dagster_run.tags.get(KEYHOLE_TAG)]
                if not keyholes or not all(r.end_time for r in keyholes) or instance.get_runs(RunsFilter(statuses=list(LIVE))):
                    return False
                stored = read_table(spark, StateStore().uri(FILTERED_EVENTS)).where(F.col("event_id").startswith("behind-"))
                daily, latest = (instance.get_latest_materialization_event(AssetKey(key)) for key in (DAILY_AGGREGATES, ATTRIBUTES))
                waiting = [day for day, status in StateStore().days().items() if status.status == TO_PROCESS]
                return stored.count() > 0 and not waiting and latest and daily and latest.timestamp > daily.timestamp

            wait_for("the keyhole run, the rows behind the cursor stored, and attributes after daily_aggregates",
                     attributes_caught_up, 900, told)
            behind_days = {row.event_date for row in read_table(spark, StateStore().uri(FILTERED_EVENTS))
                           .where(F.col("event_id").startswith("behind-")).select("event_date").distinct().collect()}
            aggregated, stored = day_totals(spark, DAILY_AGGREGATES, "events"), day_totals(spark, FILTERED_EVENTS)
            assert {day: aggregated.get(day) for day in behind_days} == {day: stored[day] for day in behind_days}, \
                "daily_aggregates holds every stored event of the days of the rows behind the cursor"
            wait_for("the runs in flight", lambda: not instance.get_runs(RunsFilter(statuses=list(LIVE))), 600, told)

            # The worker killed outright (kill -9) in the daemon's run of a new load, in a Spark step
            # (its JVM paused first, so the run cannot end before the kill). Restarted, as a
            # supervisor would. With no new load, the killed run's window is run again.
            last = next(run for run in instance.get_runs() if run.tags.get(WORKER_TAG))
            wait_for("the worker to be done with its last run", lambda: f"run {last.run_id}" in (tmp_path / "worker.log").read_text(), 60, told)
            jvm = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()]
            dropped = not_yet_stored(spark, source)  # rows the filters drop (no event id, ...)
            for pid in jvm:
                os.kill(pid, signal.SIGSTOP)
            append_events(spark, source)
            loaded = stored_table(source).version()
            killed = wait_for("the daemon's run in a Spark step in the worker", lambda: in_a_spark_step(instance), 300, told)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(60)
            worker = start_worker(tmp_path)
            assert not_yet_stored(spark, source) > dropped, f"the new load was stored before the kill: {jvm}\n{told()}"
            [plan] = [plan_from_row(row) for row in read_rows(StateStore().uri(NEW_EVENT_LIMITS)) if row["run_id"] == killed]
            assert plan.source.version == loaded, f"the killed run assessed version {plan.source.version}, not the load's {loaded}"
            wait_for("the killed run's window run again", lambda: any(
                run.status == DagsterRunStatus.SUCCESS for run in instance.get_runs(RunsFilter(tags={RETRY_TAG: killed}))), 900, told)
            assert instance.get_run_by_id(killed).status == DagsterRunStatus.FAILURE
            assert not_yet_stored(spark, source) == dropped and stored_table(source).version() == loaded

            # Rows a loader stamped 3 minutes ahead of the clock: the run of their load reads up to its now,
            # the sensor names them, and requests a run once their time has come, with no new load.
            ahead = (spark.read.format("delta").load(source).where(F.to_date("load_tstamp") == PARAMS.start_date).limit(5)
                     .withColumn("event_id", F.concat(F.lit("ahead-"), "event_id"))
                     .withColumn("domain_sessionid", F.concat(F.lit("ahead-"), "domain_sessionid"))  # sessions of now
                     .withColumn("load_tstamp", F.lit(utcnow() + timedelta(seconds=180)))
                     .withColumn("load_date", F.to_date("load_tstamp")))
            ahead.write.format("delta").mode("append").save(source)
            loaded = stored_table(source).version()
            wait_for("a tick naming rows ahead of the clock", lambda: any(
                "stamped ahead of the clock come due from" in (tick.skip_reason or "")
                for tick in ticks(instance, "source_events_sensor")), 300, told)
            assert not_yet_stored(spark, source) == dropped, "rows whose time has not come are not due"
            wait_for("a run for the rows ahead of the clock once due", lambda: any(
                run.status == DagsterRunStatus.SUCCESS for run in keyed(instance, "due-after-")), 600, told)
            assert not_yet_stored(spark, source) == dropped and stored_table(source).version() == loaded
            wait_for("the runs in flight", lambda: not instance.get_runs(RunsFilter(statuses=list(LIVE))), 600, told)

            # A partition backfill of two days, as the UI's Launch backfill makes it: the backfill daemon runs it.
            days = [PARAMS.start_date + timedelta(days=n) for n in range(2)]
            instance.add_backfill(PartitionBackfill.from_asset_partitions(
                backfill_id="uibackfill", asset_graph=build_definitions(settings).resolve_asset_graph(),
                partition_names=[day.isoformat() for day in days], asset_selection=[AssetKey(DAILY_AGGREGATES)],
                backfill_timestamp=time.time(), tags={}, dynamic_partitions_store=instance, all_partitions=False,
                title=None, description=None, run_config=None,
            ))

            def attributes_after_the_backfill():
                runs = instance.get_run_records(RunsFilter(tags={"dagster/backfill": "uibackfill"}))
                latest = instance.get_latest_materialization_event(AssetKey(ATTRIBUTES))
                done = runs and all(r.end_time for r in runs) and latest.timestamp > max(r.end_time for r in runs)
                return done and not instance.get_runs(RunsFilter(statuses=list(LIVE)))

            # The daemon's process group holds the runs it launched: it is stopped once they have ended.
            wait_for("the backfill's run, then attributes", attributes_after_the_backfill, 900, told)
        finally:
            for process in (daemon, worker):
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(60)
        logs = "".join((tmp_path / log).read_text()[-3000:] for log in ("daemon.log", "worker.log"))
        assert all(run.status.value == "SUCCESS" for run in instance.get_runs() if run.run_id != killed), logs
        assert any(run.tags.get(WORKER_TAG) for run in writers(instance)), "the daemon's runs went to the warm worker"
        [backfill_run] = instance.get_runs(RunsFilter(tags={"dagster/backfill": "uibackfill"}))
        assert WAREHOUSE_POOL in backfill_run.run_op_concurrency.all_pools, "it queues behind every other writer"
        records = StateStore().run_log(run_id=backfill_run.run_id)  # one Processed per partition, with its own rows
        assert (records[0]["status"], records[0]["partition"]) == (PROCESSING, None)
        assert sorted((r["status"], r["partition"]) for r in records[1:]) == [(PROCESSED, day.isoformat()) for day in days]
        through_the_daemon = rows_of(spark, ATTRIBUTES)
        assert run_days(settings, *days, instance).success  # what the project's own backfill of those days leaves
        assert rows_of(spark, ATTRIBUTES) == through_the_daemon
        assert {r["run_id"] for r in StateStore().run_log() if r["status"] == FAILED} <= {killed}, "only the killed run failed"
        events = read_table(spark, StateStore().uri("filtered_events"))
        page_views = read_table(spark, StateStore().uri(ATTRIBUTES)).agg(F.sum("page_views")).first()[0]
        assert page_views == events.where(F.col("event_name") == "page_view").count(), "attributes hold every stored event"


# A command-line run killed outright once it holds the lease, as the OOM killer or a lost terminal would.
KILLED_HOLDING_THE_LEASE = """
import os, signal
from incremental_assets import cli
from incremental_assets.lib.state.store import StateStore

acquire = StateStore.acquire
def acquire_then_die(self, *args, **kwargs):
    acquire(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
StateStore.acquire = acquire_then_die
cli.leave(cli.main(["run"]))
"""


def test_a_killed_command_line_run_is_failed_by_the_sensor_and_run_monitoring_and_holds_back_nothing(spark, tmp_path):
    """Finding: a SIGKILLed `incremental-assets run` stayed STARTED in the instance, and the daemon's
    source sensor skipped every tick after it ("still processing"): a stuck pipeline."""
    from dagster._core.launcher import WorkerStatus

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.catalog import PROCESS_TAG

    source = sample_source(spark, PARAMS, tmp_path)
    with scenario_environment(tmp_path / "warehouse", source, SETTINGS, home=a_home(tmp_path)):
        killed = subprocess.Popen([sys.executable, "-c", KILLED_HOLDING_THE_LEASE], env=dict(os.environ),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, errors = killed.communicate(timeout=600)
        assert killed.returncode == -signal.SIGKILL, errors[-3000:]
        with DagsterInstance.get() as instance:
            [run] = instance.get_runs(RunsFilter(job_name=INCREMENTAL_JOB))
            assert run.status == DagsterRunStatus.STARTED and run.tags[PROCESS_TAG].endswith(f":{killed.pid}")
            assert [r["status"] for r in StateStore().run_log(run_id=run.run_id)].count(PROCESSING) > 0

            health = instance.run_launcher.check_run_worker_health(run)  # what run monitoring asks
            assert health.status == WorkerStatus.FAILED and f"pid {killed.pid}" in health.msg

            tick = source_events_sensor(build_sensor_context(instance=instance, resources={"settings": IncrementalSettings(**SETTINGS)}))
            assert isinstance(tick, RunRequest), tick
            assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
