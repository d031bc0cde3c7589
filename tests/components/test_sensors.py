"""The source and daily sensors: what each requests, once, and when it waits."""

from datetime import datetime

from deltalake import DeltaTable

from incremental_assets.lib.catalog import INCREMENTAL_JOB
from incremental_assets.lib.settings import IncrementalSettings
from tests.warehouse_tables import built_under

SETTINGS = {"settings": IncrementalSettings()}  # the sensors' resource


def test_source_sensor_requests_one_run_per_new_source_version(spark, warehouse):
    from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.environment import source_table_uri

    instance = DagsterInstance.ephemeral()
    assert isinstance(source_events_sensor(build_sensor_context(instance=instance, resources=SETTINGS)), SkipReason)
    spark.range(3).write.format("delta").save(source_table_uri())
    context = build_sensor_context(instance=instance, resources=SETTINGS)
    request = source_events_sensor(context)
    assert isinstance(request, RunRequest) and request.run_key == "source-version-0"
    again = source_events_sensor(build_sensor_context(instance=instance, cursor=context.cursor, resources=SETTINGS))
    assert isinstance(again, SkipReason) and "unchanged" in again.skip_message


def test_daily_sensor_requests_each_range_of_marked_days_once(spark, warehouse):
    from datetime import date

    from dagster import AssetKey, DagsterInstance, build_sensor_context

    from incremental_assets.defs.automation import daily_partitions_sensor
    from incremental_assets.lib.incremental.days import PROCESSED, TO_PROCESS, DayStatus
    from incremental_assets.lib.state.store import StateStore

    days = [(date(2024, 3, 1), TO_PROCESS), (date(2024, 3, 2), TO_PROCESS), (date(2024, 3, 3), PROCESSED),
            (date(2024, 3, 4), TO_PROCESS)]
    StateStore().save_days([DayStatus(day, status=status) for day, status in days], consumed_version=0)
    built_under(SETTINGS["settings"])  # else the manifest's rows look built by an earlier release
    requests = daily_partitions_sensor(build_sensor_context(instance=DagsterInstance.ephemeral(), resources=SETTINGS))
    ranges = [(r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"]) for r in requests]
    assert ranges == [("2024-03-01", "2024-03-02"), ("2024-03-04", "2024-03-04")]
    assert len({r.run_key for r in requests}) == 2 and all(r.run_key.endswith("manifest-v0") for r in requests)
    # daily_aggregates alone for the first range; the whole of daily_job (attributes too) for the last
    assert [r.asset_selection for r in requests] == [[AssetKey("daily_aggregates")], None]


def test_source_sensor_waits_while_an_incremental_run_is_in_flight_then_requests_the_newest_load(spark, warehouse):
    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.environment import source_table_uri

    instance = DagsterInstance.ephemeral()
    spark.range(3).write.format("delta").save(source_table_uri())
    first = build_sensor_context(instance=instance, resources=SETTINGS)
    assert source_events_sensor(first).run_key == "source-version-0"

    # Two more loads land while the requested run is in flight: no request, and the cursor waits.
    run = instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="in-flight", status=DagsterRunStatus.STARTED))
    for _ in range(2):
        spark.range(1).write.format("delta").mode("append").save(source_table_uri())
    busy = build_sensor_context(instance=instance, cursor=first.cursor, resources=SETTINGS)
    skipped = source_events_sensor(busy)
    assert isinstance(skipped, SkipReason) and "in-flight" in skipped.skip_message and busy.cursor == "0"

    # Once it finished: one request for the newest version, which covers both loads.
    instance.handle_run_event(run.run_id, _run_success(run))
    after = build_sensor_context(instance=instance, cursor=busy.cursor, resources=SETTINGS)
    request = source_events_sensor(after)
    assert isinstance(request, RunRequest) and request.run_key == "source-version-2" and after.cursor == "2"


def test_source_sensor_requests_catch_up_runs_until_caught_up_and_a_rebuild_after_a_refresh(spark, warehouse):
    from dagster import (
        AssetMaterialization,
        DagsterInstance,
        DagsterRun,
        DagsterRunStatus,
        RunRequest,
        SkipReason,
        build_sensor_context,
    )

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.catalog import EVENTS_THIS_RUN, RETRY_TAG
    from incremental_assets.lib.environment import source_table_uri
    from incremental_assets.lib.incremental.limits import BatchStats, Cursor, RunLimits, RunState
    from incremental_assets.lib.state.store import StateStore

    instance = DagsterInstance.ephemeral()
    spark.range(3).write.format("delta").save(source_table_uri())

    def tick(caught_up: bool | None = None):
        if caught_up is not None:  # what an incremental run's batch recorded
            instance.report_runless_asset_event(AssetMaterialization(EVENTS_THIS_RUN, metadata={"caught_up": caught_up}))
        return source_events_sensor(build_sensor_context(instance=instance, cursor="0", resources=SETTINGS))

    # The source is unchanged (cursor at its version 0): a run that left events past its window asks for
    # another, keyed by that run, so each is requested once; a caught-up run asks for none.
    behind = tick(caught_up=False)
    assert isinstance(behind, RunRequest) and behind.run_key.startswith("catch-up-after-")
    assert isinstance(tick(caught_up=True), SkipReason)

    # A run that failed after its batch is retried once, as its own window (not as a catch-up),
    # whatever its batch said; a retry that failed too is not retried again, and the skip says why.
    failed = instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="failed-run", status=DagsterRunStatus.FAILURE))
    _store_materialization(instance, failed.run_id, AssetMaterialization(EVENTS_THIS_RUN, metadata={"caught_up": False}))
    retry = tick()
    assert isinstance(retry, RunRequest) and retry.run_key == "retry-of-failed-run" and retry.tags[RETRY_TAG] == "failed-run"
    instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="retry-run", status=DagsterRunStatus.FAILURE, tags=retry.tags))
    given_up = tick()
    assert isinstance(given_up, SkipReason) and "already the retry of run failed-run" in given_up.skip_message
    instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="a-later-run", status=DagsterRunStatus.SUCCESS))

    # A full refresh empties the manifest: one rebuild run, keyed by the manifest's version.
    state = StateStore()
    moment = datetime(2024, 3, 1)
    limits = RunLimits(RunState.FIRST_RUN, moment, moment, moment)
    state.save_entry(Cursor("filtered_events", None, BatchStats(limits, 1, moment, None)).advanced(), "run")
    # An incremental asset without its row (new, or emptied by a plan) is backfilled: one run.
    assert tick().run_key == "rebuild-after-manifest-v0"
    state.save_entry(Cursor("sessions", None, BatchStats(limits, 1, moment, None)).advanced(), "run")
    assert isinstance(tick(), SkipReason)
    DeltaTable(state.uri("incremental_manifest")).delete()
    rebuild = tick()
    assert isinstance(rebuild, RunRequest) and rebuild.run_key == "rebuild-after-manifest-v2"


def test_a_terminated_run_is_requested_again_without_a_new_load(spark, warehouse):
    """The sensor requested a run for a new load, and a user terminated it before its batch: its
    window is requested again at the next tick, not left for the next load."""
    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.environment import source_table_uri

    instance = DagsterInstance.ephemeral()
    spark.range(3).write.format("delta").save(source_table_uri())
    first = build_sensor_context(instance=instance, resources=SETTINGS)
    assert source_events_sensor(first).run_key == "source-version-0"
    instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="terminated", status=DagsterRunStatus.CANCELED))
    again = source_events_sensor(build_sensor_context(instance=instance, cursor=first.cursor, resources=SETTINGS))
    assert isinstance(again, RunRequest) and again.run_key == "retry-of-terminated"
    instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="its-retry", status=DagsterRunStatus.SUCCESS, tags=again.tags))
    done = source_events_sensor(build_sensor_context(instance=instance, cursor=first.cursor, resources=SETTINGS))
    assert isinstance(done, SkipReason) and "unchanged since version 0" in done.skip_message


def _store_materialization(instance, run_id, materialization):
    import time

    from dagster import DagsterEvent, DagsterEventType
    from dagster._core.events import StepMaterializationData
    from dagster._core.events.log import EventLogEntry

    event = DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION.value, job_name=INCREMENTAL_JOB,
        event_specific_data=StepMaterializationData(materialization),
    )
    instance.store_event(EventLogEntry(
        error_info=None, level="debug", user_message="", run_id=run_id, timestamp=time.time(), dagster_event=event
    ))


def _run_success(run):
    from dagster import DagsterEvent, DagsterEventType

    return DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name)


def assessed_by(run_id: str, limits, arrivals=None) -> None:
    """A run's row of new_event_limits, as a run of any surface (the command line's too) leaves it."""
    from incremental_assets.lib.catalog import NEW_EVENT_LIMITS
    from incremental_assets.lib.delta.log import snapshot
    from incremental_assets.lib.delta.write import Txn, append_rows
    from incremental_assets.lib.environment import source_table_uri, table_uri
    from incremental_assets.lib.incremental.run_plan import RunPlan, plan_table
    from incremental_assets.lib.source.arrivals import NOTHING_ARRIVED

    plan = RunPlan(limits, run_id, source=snapshot(DeltaTable(source_table_uri())), arrivals=arrivals or NOTHING_ARRIVED)
    append_rows(table_uri(NEW_EVENT_LIMITS), plan_table(plan), Txn(f"run-{run_id}"))


def test_on_its_first_start_the_source_sensor_requests_nothing_a_command_line_run_already_assessed(spark, warehouse):
    from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.environment import source_table_uri
    from incremental_assets.lib.incremental.limits import RunLimits, RunState

    spark.range(3).write.format("delta").save(source_table_uri())
    assessed_by("cli-run", RunLimits(RunState.FIRST_RUN, datetime(2024, 3, 1), datetime(2024, 3, 2), datetime(2024, 3, 2)))
    instance = DagsterInstance.ephemeral()
    first_start = source_events_sensor(build_sensor_context(instance=instance, resources=SETTINGS))
    assert isinstance(first_start, SkipReason) and "unchanged since version 0" in first_start.skip_message
    spark.range(2).write.format("delta").mode("append").save(source_table_uri())
    request = source_events_sensor(build_sensor_context(instance=instance, resources=SETTINGS))
    assert isinstance(request, RunRequest) and request.run_key == "source-version-1"


def test_rows_behind_the_cursor_get_a_keyhole_run_requested_once_until_one_covers_them(spark, warehouse):
    from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.environment import source_table_uri
    from incremental_assets.lib.incremental.limits import RunLimits, RunState
    from incremental_assets.lib.source.arrivals import Arrival, Arrivals
    from incremental_assets.lib.state.run_log import PROCESSED, PROCESSING
    from incremental_assets.lib.state.store import StateStore

    spark.range(3).write.format("delta").save(source_table_uri())
    behind = Arrivals({Arrival.BEHIND: 4}, datetime(2024, 2, 1, 8), datetime(2024, 2, 3, 9))
    assessed_by("standard", RunLimits(RunState.STANDARD, datetime(2024, 3, 1), datetime(2024, 3, 2), datetime(2024, 3, 2)), behind)
    instance = DagsterInstance.ephemeral()
    request = source_events_sensor(build_sensor_context(instance=instance, resources=SETTINGS))
    assert isinstance(request, RunRequest)
    config = request.run_config["ops"]["new_event_limits"]["config"]
    assert config == {"lower": "2024-02-01T08:00:00", "upper": "2024-02-03T09:00:00"}
    assert request.run_key == "keyhole-standard-2024-02-01T08:00:00-2024-02-03T09:00:00"

    # The keyhole run over that range succeeded: nothing waits, nothing is requested.
    keyhole = RunLimits(RunState.KEYHOLE, datetime(2024, 2, 1, 8), datetime(2024, 2, 3, 9), datetime(2024, 3, 2))
    assessed_by("keyhole", keyhole)
    state = StateStore()
    state.record("keyhole", "filtered_events", PROCESSING, {})
    state.record("keyhole", "filtered_events", PROCESSED, {})
    done = source_events_sensor(build_sensor_context(instance=instance, resources=SETTINGS))
    assert isinstance(done, SkipReason), done


def test_a_keyhole_run_that_failed_is_requested_once_more_then_named_and_new_loads_go_on(spark, warehouse):
    """Finding: a keyhole run that failed left its range stranded, and the sensor requested another
    keyhole over it, keyed by the failed one, before anything else: after each failure the next,
    and no retry of a killed run's window or new load was requested meanwhile."""
    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.catalog import KEYHOLE_TAG, RETRY_TAG
    from incremental_assets.lib.environment import source_table_uri
    from incremental_assets.lib.incremental.limits import RunLimits, RunState
    from incremental_assets.lib.source.arrivals import Arrival, Arrivals

    spark.range(3).write.format("delta").save(source_table_uri())
    lower, upper = datetime(2024, 2, 1, 8), datetime(2024, 2, 3, 9)
    assessed_by("standard", RunLimits(RunState.STANDARD, datetime(2024, 3, 1), datetime(2024, 3, 2), datetime(2024, 3, 2)),
                Arrivals({Arrival.BEHIND: 4}, lower, upper))
    instance = DagsterInstance.ephemeral()

    def tick():
        return source_events_sensor(build_sensor_context(instance=instance, cursor="0", resources=SETTINGS))

    def failed(run_id: str, request: RunRequest) -> None:
        """The requested run, ended Failed after its plan counted the rows of its window."""
        instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id=run_id, status=DagsterRunStatus.FAILURE, tags=request.tags))
        keyhole = RunLimits(RunState.KEYHOLE, lower, upper, datetime(2024, 3, 2))
        assessed_by(run_id, keyhole, Arrivals({Arrival.IN_KEYHOLE: 4}, lower, upper))

    first = tick()
    assert isinstance(first, RunRequest) and first.run_key == "keyhole-standard-2024-02-01T08:00:00-2024-02-03T09:00:00"
    assert first.tags == {KEYHOLE_TAG: "2024-02-01T08:00:00..2024-02-03T09:00:00"}
    failed("keyhole", first)
    again = tick()
    assert isinstance(again, RunRequest) and again.run_key == "retry-of-keyhole"
    assert again.tags == {**first.tags, RETRY_TAG: "keyhole"} and again.run_config == first.run_config
    failed("keyhole-retry", again)

    # The range is an operator's now: the skip names both runs and the command; a new load gets its run.
    given_up = tick()
    assert isinstance(given_up, SkipReason), given_up
    assert "keyhole runs keyhole and its retry keyhole-retry ended without success" in given_up.skip_message
    assert "incremental-assets run --lower 2024-02-01T08:00:00 --upper 2024-02-03T09:00:00" in given_up.skip_message
    assert given_up.skip_message.count("keyhole runs") == 1  # two runs counted the range: named once
    spark.range(2).write.format("delta").mode("append").save(source_table_uri())
    new_load = tick()
    assert isinstance(new_load, RunRequest) and new_load.run_key == "source-version-1"


def test_attributes_follow_a_backfill_that_lands_between_the_same_two_ticks_as_a_daily_run():
    """Finding (a warm worker made runs quick enough): a daily run that wrote both tables, then a
    backfill's run that wrote daily_aggregates alone, between two ticks; the automation condition
    counted attributes as handled and never requested it. The history follows the same way, and
    only what is behind is requested."""
    from dagster import AssetKey, AssetMaterialization, DagsterInstance, DagsterRun, DagsterRunStatus, RunRequest, SkipReason, build_sensor_context

    from dagster._core.storage.tags import RUN_KEY_TAG

    from incremental_assets.defs.automation import attributes_after_daily_aggregates
    from incremental_assets.definitions import defs
    from incremental_assets.lib.catalog import ATTRIBUTES, ATTRIBUTES_HISTORY, DAILY_AGGREGATES

    instance = DagsterInstance.ephemeral()

    def tick():
        return attributes_after_daily_aggregates(build_sensor_context(instance=instance, definitions=defs))

    def written(*assets):
        for asset in assets:
            instance.report_runless_asset_event(AssetMaterialization(asset))

    def tick_after(write, *assets):
        write(*assets)
        return tick()

    assert isinstance(tick(), SkipReason)  # nothing written yet
    written(DAILY_AGGREGATES, ATTRIBUTES, ATTRIBUTES_HISTORY)  # daily_job
    assert isinstance(tick(), SkipReason)
    written(DAILY_AGGREGATES, ATTRIBUTES, ATTRIBUTES_HISTORY, DAILY_AGGREGATES)  # daily_job, then a backfill's run, between two ticks
    request = tick()
    assert isinstance(request, RunRequest) and request.asset_selection == [AssetKey(ATTRIBUTES), AssetKey(ATTRIBUTES_HISTORY)]
    assert tick().run_key == request.run_key  # requested once: the run key is the change's

    # While a run that writes daily_aggregates is in flight, attributes waits for it.
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="backfill-run", status=DagsterRunStatus.STARTED,
                                asset_selection=frozenset({AssetKey(DAILY_AGGREGATES)})))
    assert "in flight" in tick().skip_message
    instance.report_run_canceled(instance.get_run_by_id("backfill-run"))
    written(ATTRIBUTES)  # a run of attributes alone (a UI click): the history is still behind
    assert tick().asset_selection == [AssetKey(ATTRIBUTES_HISTORY)]
    written(ATTRIBUTES_HISTORY)
    assert isinstance(tick(), SkipReason)

    # Its materializations wiped after the run of a key succeeded: requested again under a new key,
    # not under the used one (which Dagster drops: "0 requested", no reason). A failed one is named.
    request = tick_after(written, DAILY_AGGREGATES)
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="done", status=DagsterRunStatus.SUCCESS,
                                tags={RUN_KEY_TAG: request.run_key}))
    again = tick()
    assert isinstance(again, RunRequest) and again.run_key == f"{request.run_key}-after-done"
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="broke", status=DagsterRunStatus.FAILURE,
                                tags={RUN_KEY_TAG: again.run_key}))
    assert "Run broke for this change to daily_aggregates ended FAILURE" in tick().skip_message


def test_the_sensors_that_request_runs_look_as_often_as_the_settings_say():
    import pytest
    from dagster import SensorDefinition

    from incremental_assets.definitions import build_definitions
    from incremental_assets.defs import automation
    from incremental_assets.lib.settings import SettingsError, load_settings

    requesting = {"source_events_sensor", "daily_partitions_sensor", "additive_changes_sensor", "attributes_after_daily_aggregates"}

    def intervals(settings):
        sensors = build_definitions(settings).sensors
        return {s.name: s.minimum_interval_seconds for s in sensors if s.name in requesting}

    assert intervals(IncrementalSettings()) == dict.fromkeys(requesting, 30)
    assert intervals(load_settings(overrides={"sensor_interval_seconds": "5"}, environ={})) == dict.fromkeys(requesting, 5)
    declared = [getattr(automation, name) for name in requesting]  # what a direct call evaluates
    assert all(isinstance(s, SensorDefinition) and s.minimum_interval_seconds == 30 for s in declared)
    with pytest.raises(SettingsError, match=r"sensor_interval_seconds must be an integer >= 5 \(got 2\)"):
        load_settings(overrides={"sensor_interval_seconds": "2"}, environ={})


def test_a_run_whose_process_is_gone_is_failed_and_holds_back_no_sensor_while_a_live_or_distant_one_does():
    """A killed process never reports its run's end. Its run, left started, kept the source sensor
    skipping every tick ("still processing") and the UI showing it running forever."""
    import os
    import socket
    import subprocess

    from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus
    from dagster._core.launcher import WorkerStatus

    from incremental_assets.lib.catalog import PROCESS_TAG
    from incremental_assets.lib.state.hooks import runs_in_flight
    from incremental_assets.lib.worker import WarmRunLauncher

    ended = subprocess.Popen(["true"])
    ended.wait()  # a pid that no process has now
    here = socket.gethostname()
    instance = DagsterInstance.ephemeral()
    runs = {name: instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id=name, status=DagsterRunStatus.STARTED,
                                              tags={PROCESS_TAG: process}))
            for name, process in [("killed", f"{here}:{ended.pid}"), ("alive", f"{here}:{os.getpid()}"),
                                  ("elsewhere", f"another-host:{ended.pid}")]}
    health = {name: WarmRunLauncher().check_run_worker_health(run) for name, run in runs.items()}
    assert health["killed"].status == WorkerStatus.FAILED and f"pid {ended.pid}" in health["killed"].msg
    assert health["alive"].status == health["elsewhere"].status == WorkerStatus.RUNNING

    assert sorted(run.run_id for run in runs_in_flight(instance)) == ["alive", "elsewhere"]
    killed = instance.get_run_by_id("killed")
    assert killed.status == DagsterRunStatus.FAILURE
    failure = instance.all_logs("killed")[-1]
    assert failure.dagster_event.event_type == DagsterEventType.RUN_FAILURE and f"process (pid {ended.pid})" in failure.message


def test_rows_stamped_ahead_of_the_clock_are_requested_once_their_time_has_come(spark, warehouse):
    """Finding: a batch loaded with load times up to 36 minutes ahead; at their time `preview`
    showed them not yet in filtered_events while the sensor said caught up, until a hand-launched
    run. Here the last run read up to noon and its source holds the afternoon already: by the
    sensor's clock those rows are due, and a run is requested for them, once per run they follow."""
    from datetime import date, timedelta

    from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.environment import source_table_uri
    from incremental_assets.lib.incremental.limits import RunLimits, RunState
    from incremental_assets.lib.sample.generator import SampleParams
    from incremental_assets.lib.sample.stream import generate_stream
    from incremental_assets.lib.utc import utcnow
    from pyspark.sql import functions as F

    generate_stream(spark, source_table_uri(), SampleParams(users=4, days=2, events_per_day=60, start_date=date(2024, 3, 1), seed=4))
    settings = IncrementalSettings(start_date="2024-03-01")
    instance = DagsterInstance.ephemeral()
    noon = datetime(2024, 3, 2, 12)
    assessed_by("noon", RunLimits(RunState.STANDARD, datetime(2024, 3, 1), noon, noon))  # by its clock, caught up
    resources = {"settings": settings}
    request = source_events_sensor(build_sensor_context(instance=instance, resources=resources))
    assert isinstance(request, RunRequest) and request.run_key == "due-after-noon"

    # Stamped ahead of the sensor's clock too (a later run read up to now): named, not requested.
    # Restamped rows, not a stream of today: the sample's users sleep at night, when its next
    # hours hold no row.
    future = utcnow().replace(minute=0, second=0, microsecond=0)
    ahead = (spark.read.format("delta").load(source_table_uri()).limit(5)
             .withColumn("event_id", F.concat(F.lit("ahead-"), "event_id"))
             .withColumn("load_tstamp", F.lit(future + timedelta(hours=2)))
             .withColumn("load_date", F.to_date("load_tstamp")))
    ahead.write.format("delta").mode("append").save(source_table_uri())
    now = utcnow()
    assessed_by("later", RunLimits(RunState.STANDARD, now - timedelta(hours=1), now, now))
    skip = source_events_sensor(build_sensor_context(instance=instance, resources=resources))
    assert isinstance(skip, SkipReason) and "source rows stamped ahead of the clock come due from" in skip.skip_message, skip
    assert utcnow() < datetime.fromisoformat(skip.skip_message.split("come due from ")[1].split(",")[0]) <= future + timedelta(hours=3)


def test_a_killed_runs_window_is_requested_again_without_a_new_load(spark, warehouse):
    """Finding: after kill -9 of the worker during filtered_events, the source sensor said 'the
    last run was caught up' for nine minutes while the killed run had written nothing. The sensor
    fails the run whose process is gone, then requests its window again."""
    import socket
    import subprocess

    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunRequest, build_sensor_context

    from incremental_assets.defs.automation import source_events_sensor
    from incremental_assets.lib.catalog import WORKER_TAG
    from incremental_assets.lib.environment import source_table_uri

    instance = DagsterInstance.ephemeral()
    spark.range(3).write.format("delta").save(source_table_uri())
    first = build_sensor_context(instance=instance, resources=SETTINGS)
    assert source_events_sensor(first).run_key == "source-version-0"
    gone = subprocess.Popen(["true"])
    gone.wait()
    instance.add_run(DagsterRun(job_name=INCREMENTAL_JOB, run_id="killed", status=DagsterRunStatus.STARTED,
                                tags={WORKER_TAG: f"{socket.gethostname()}:{gone.pid}"}))
    again = source_events_sensor(build_sensor_context(instance=instance, cursor=first.cursor, resources=SETTINGS))
    assert instance.get_run_by_id("killed").status == DagsterRunStatus.FAILURE
    assert isinstance(again, RunRequest) and again.run_key == "retry-of-killed"
