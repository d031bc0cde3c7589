"""State 2 (a new incremental asset backfills while the others skip), state 3 (a failed asset makes
the next run sync), and an incremental asset materialized outside its job."""

import os

import pytest
from dagster import DagsterInstance, DagsterRunStatus, Definitions, materialize
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.definitions import build_definitions
from incremental_assets.defs.base.limits import new_event_limits
from incremental_assets.defs.base.sessions import session_batch, sessions_lifecycle_manifest
from incremental_assets.defs.incremental.sessions import sessions
from incremental_assets.defs.resources import WarehouseIOManager
from incremental_assets.lib import spark as spark_module
from incremental_assets.lib.catalog import INCREMENTAL_JOB
from incremental_assets.lib.delta.log import stored_table, table_exists
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.delta.write import last_commit
from incremental_assets.lib.incremental.asset import incremental_asset
from incremental_assets.lib.incremental.limits import RunLimits
from incremental_assets.lib.incremental.run_plan import NOTHING_NEW
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.state.store import StateStore
from tests.pipeline.test_session_layer import FIRST_LOADS, NOW, SETTINGS, event, t

FAIL_FLAG = {"fail": False}


@incremental_asset(write_mode="upsert", keys=["user_identifier"])
def events_per_user(events: DataFrame, limits: RunLimits) -> DataFrame:
    """A custom incremental asset, declared the way users declare theirs."""
    if FAIL_FLAG["fail"]:
        raise RuntimeError("forced failure")
    return events.groupBy("user_identifier").agg(F.count("event_id").alias("events"))


@pytest.fixture
def runner(spark, warehouse, monkeypatch, tmp_path):
    source = str(tmp_path / "source_events")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    write_events(spark, events_frame(spark, FIRST_LOADS), source, "append")
    instance = DagsterInstance.ephemeral()
    FAIL_FLAG["fail"] = False

    def run(*extra, now=NOW):
        defs = build_definitions(IncrementalSettings(**SETTINGS), Definitions(assets=list(extra)))
        result = defs.resolve_job_def(INCREMENTAL_JOB).execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"ops": {"new_event_limits": {"config": {"now": now}}}},
        )
        metadata = {
            e.asset_key.path[-1]: {k: v.value for k, v in e.materialization.metadata.items()}
            for e in result.get_asset_materialization_events()
        }
        return result.success, metadata

    def state():
        rows = read_table(spark, f"{warehouse}/incremental_manifest").collect()
        return {r.model: r.last_success for r in rows}

    return run, state


@pytest.fixture
def sessions_asked(monkeypatch) -> list[bool]:
    """The steps that ask for the run's Spark session (in a process of its own, where its JVM
    starts), each as whether it asked for a driver sized for a small step."""
    asked, build = [], spark_module.build_spark_session
    monkeypatch.setattr(spark_module, "build_spark_session", lambda **kw: asked.append(kw.get("small", False)) or build(**kw))
    return asked


def test_new_asset_backfills_while_others_skip_then_failure_forces_a_sync(runner):
    run, state = runner
    run()
    run()
    assert state() == {"filtered_events": t("01-02 12:00"), "sessions": t("01-02 12:00")}

    ok, meta = run(events_per_user)  # state 2: [start_date, least(max_ls, start_date + 1 day)]
    assert ok
    limits = meta["new_event_limits"]
    assert (limits["run_state"], limits["lower_limit"], limits["upper_limit"]) == (
        "new_model", "2021-01-01 00:00:00", "2021-01-02 00:00:00")
    assert meta["filtered_events"]["skipped"] == meta["sessions"]["skipped"] == "already ahead of this run's window"
    assert state() == {
        "filtered_events": t("01-02 12:00"), "sessions": t("01-02 12:00"), "events_per_user": t("01-01 12:00")
    }

    ok, meta = run(events_per_user)  # out of sync: the new asset catches up to the others
    assert (meta["new_event_limits"]["run_state"], meta["new_event_limits"]["lower_limit"]) == (
        "out_of_sync", "2021-01-01 06:00:00")
    assert state()["events_per_user"] == t("01-02 12:00")

    FAIL_FLAG["fail"] = True
    ok, meta = run(events_per_user)  # standard run in which one asset fails
    assert not ok and meta["new_event_limits"]["run_state"] == "standard"
    assert state() == {
        "filtered_events": t("01-03 12:00"), "sessions": t("01-03 12:00"), "events_per_user": t("01-02 12:00")
    }

    FAIL_FLAG["fail"] = False
    ok, meta = run(events_per_user)
    assert ok
    limits = meta["new_event_limits"]
    assert (limits["run_state"], limits["lower_limit"], limits["upper_limit"]) == (
        "out_of_sync", "2021-01-02 06:00:00", "2021-01-03 12:00:00")
    assert len(set(state().values())) == 1


def test_a_window_of_few_rows_runs_its_spark_steps_with_the_small_step_settings(runner, spark, monkeypatch, sessions_asked, warehouse):
    """Up to SMALL_STEP_ROWS source rows in the window: no code generation (whole-stage or of
    expressions), no adaptive execution, one shuffle partition, and a driver started for the run
    (in a process of its own) compiles with C1 only; its batch, bounded by the source's rows its
    sessions span, is written by deltalake. Past it, the session's own settings (which the small
    ones would slow), and a driver with both compilers."""
    run, _ = runner
    ok, meta = run()
    assert ok
    written = meta["events_this_run"]["delta_version"]
    [commit] = [c for c in DeltaTable(f"{warehouse}/events_this_run").history() if c["version"] == written]
    assert commit["engineInfo"].startswith("delta-rs"), commit
    assert {key: spark.conf.get(key) for key in spark_module.SIZED_CONF} == spark_module.SIZED_CONF
    assert sessions_asked[0] is True, "the run's first Spark step asks for a driver sized for its few rows"
    monkeypatch.setattr(spark_module, "SMALL_STEP_ROWS", 0)  # the next window's rows are "many"
    sessions_asked.clear()
    ok, meta = run()
    assert ok and meta["sessions_lifecycle_manifest"]["events_in_window"] > 0
    assert sessions_asked[0] is False, "a driver for many rows keeps C2"
    codegen, adaptive, shuffle_partitions, expressions = (spark.conf.get(key) for key in spark_module.SIZED_CONF)
    assert (codegen, adaptive) == ("true", "true") and shuffle_partitions != "1"
    assert expressions == "FALLBACK", "expressions compiled again, as Spark does by default"


def test_identifier_expressions_are_checked_in_the_session_sized_for_the_window(spark, warehouse, monkeypatch, tmp_path, sessions_asked):
    """A deployment's own identifier expressions are parsed by Spark before the run writes: in the
    session its window's rows call for (the run's first Spark step), not in one started unsized."""
    source = str(tmp_path / "source_events")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    write_events(spark, events_frame(spark, FIRST_LOADS), source, "append")
    chosen = IncrementalSettings(**SETTINGS, session_identifier_sql="concat(domain_sessionid, '-web')")
    result = build_definitions(chosen).resolve_job_def(INCREMENTAL_JOB).execute_in_process(
        instance=DagsterInstance.ephemeral(), run_config={"ops": {"new_event_limits": {"config": {"now": NOW}}}})
    assert result.success
    assert sessions_asked[0] is True, "new_event_limits asks for the session sized for the window's few rows"
    assert read_table(spark, f"{warehouse}/sessions").where(F.col("session_identifier").endswith("-web")).count() > 0


def test_a_run_repeated_with_nothing_new_reads_and_writes_nothing(runner, warehouse, sessions_asked):
    """Once every asset reached 'now', a run at the same 'now' skips the session layer: no read,
    no write (no step asks for Spark), the manifest where it was, and an empty batch."""
    run, state = runner
    now = "2021-01-02T12:00:00"
    run(now=now)  # [01-01, 01-02]
    run(now=now)  # up to 'now': every asset's position reaches it
    tables = ("sessions_lifecycle_manifest", "quarantined_sessions", "filtered_events", "sessions")
    versions = {table: last_commit(f"{warehouse}/{table}").version for table in tables}
    before = state()

    sessions_asked.clear()
    ok, meta = run(now=now)
    assert not sessions_asked, "a run with nothing new starts no JVM"
    assert ok and meta["new_event_limits"]["run_state"] == "standard"
    assert meta["sessions_lifecycle_manifest"]["skipped"] == NOTHING_NEW
    assert meta["events_this_run"]["skipped"] == NOTHING_NEW
    assert (meta["events_this_run"]["events_found"], meta["events_this_run"]["caught_up"]) == (0, True)
    assert meta["filtered_events"]["skipped"] == meta["sessions"]["skipped"] == "already ahead of this run's window"
    assert {table: last_commit(f"{warehouse}/{table}").version for table in tables} == versions
    assert state() == before
    assert stored_table(f"{warehouse}/events_this_run").to_pyarrow_table().num_rows == 0


def test_a_quiet_window_reads_nothing_moves_on_and_a_row_arriving_in_the_lookback_is_read(runner, warehouse, spark, sessions_asked):
    """An hour later with nothing arrived, the window (its lookback) holds only rows read already:
    no step reads the source, no table is written, and every asset moves on to the upper limit.
    The last row read was dropped (a null event_id), so it lies past what the assets processed, and
    the window is quiet all the same. A row that then arrives behind the position, inside the
    lookback, is read by the next run."""
    run, state = runner
    dropped = events_frame(spark, [event(None, "S8", "U8", "01-02 12:15")])
    write_events(spark, dropped, os.environ["INCREMENTAL_ASSETS_SOURCE"], "append")
    run(now="2021-01-02T12:30:00")  # up to 01-02 00:00 (backfill_limit_days 1)
    run(now="2021-01-02T12:30:00")  # up to 12:00
    ok, meta = run(now="2021-01-02T12:30:00")  # 12:00 to 12:30 holds the dropped row alone
    assert ok and meta["sessions_lifecycle_manifest"]["dropped_null_event_id"] == 1
    assert set(state().values()) == {t("01-02 12:00")}, "b2, the last event processed"
    tables = ("sessions_lifecycle_manifest", "quarantined_sessions", "filtered_events", "sessions")
    versions = {table: last_commit(f"{warehouse}/{table}").version for table in tables}

    sessions_asked.clear()
    ok, meta = run(now="2021-01-02T13:30:00")
    assert not sessions_asked, "a quiet run starts no JVM: a schedule's quiet tick costs seconds"
    quiet = meta["sessions_lifecycle_manifest"]["skipped"]
    assert ok and quiet.startswith("quiet: nothing arrived in the source since run ")
    assert meta["events_this_run"]["skipped"] == quiet and meta["events_this_run"]["events_found"] == 0
    assert meta["filtered_events"]["manifest_position"] == meta["sessions"]["manifest_position"] == "2021-01-02 13:30:00"
    assert {table: last_commit(f"{warehouse}/{table}").version for table in tables} == versions

    late = events_frame(spark, [event("late", "S9", "U9", "01-02 11:00")])
    write_events(spark, late, os.environ["INCREMENTAL_ASSETS_SOURCE"], "append")
    ok, meta = run(now="2021-01-02T14:00:00")  # lower limit 07:30: the row lies behind 13:30, in the lookback
    assert ok and "skipped" not in meta["sessions_lifecycle_manifest"]
    assert "late" in {row.event_id for row in read_table(spark, f"{warehouse}/filtered_events").collect()}


def test_an_incremental_asset_alone_refuses_and_names_the_job(spark, spark_resource, warehouse):
    state = StateStore()
    result = materialize(
        [new_event_limits, sessions_lifecycle_manifest, session_batch, sessions],  # the whole graph, as in the UI; only sessions selected
        selection=[sessions.key],
        resources={
            "spark": spark_resource, "state": state, "settings": IncrementalSettings(**SETTINGS),
            "io_manager": WarehouseIOManager(spark=spark_resource, state=state),
        },
        raise_on_error=False,
    )
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert f"Materialize the job {INCREMENTAL_JOB} instead" in str(failure.step_failure_data.error)
    assert result.dagster_run.status != DagsterRunStatus.FAILURE  # refused (canceled): tests/pipeline/test_single_asset_materialize.py
    assert not table_exists(f"{warehouse}/sessions")
