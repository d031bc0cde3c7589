"""Materialize on one asset of the incremental run (the UI's button, `dagster asset materialize
--select`): refused before it writes, as the lease refusal is. The run ends canceled with one line
naming what to click instead, its planned checks resolve as skipped, and no table, manifest row or
run-log record changes. Only a whole unit (the base chain and an incremental asset) runs."""

import asyncio
from datetime import date

from dagster import AssetCheckKey, AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionResolvedStatus

from incremental_assets.cli.runner import _execute, run_incremental
from incremental_assets.lib import environment
from incremental_assets.lib.catalog import RUN_STATE_TAG, TABLES, WINDOW_TAG
from incremental_assets.lib.delta.log import table_version
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.store import StateStore

SINGLE = ["sessions", "filtered_events", "daily_aggregation_manifest", "new_event_limits"]


def _versions(state: StateStore) -> dict[str, int | None]:
    return {table.name: table_version(state.uri(table.name)) for table in TABLES}


def _check_status(instance, check: AssetCheckKey, run_id: str):
    [planned] = instance.event_log_storage.get_asset_check_execution_history(check, limit=1)
    assert planned.run_id == run_id
    return asyncio.run(planned.resolve_status(LoadingContextForTest(instance)))


def test_materialize_on_one_asset_of_the_unit_is_refused_as_canceled_and_writes_nothing(spark, warehouse):
    generate_stream(spark, environment.table_uri(environment.ATOMIC_EVENTS),
                    SampleParams(users=5, days=2, events_per_day=60, start_date=date(2024, 3, 1), seed=5), hours=24)
    settings = IncrementalSettings(start_date="2024-03-01")
    instance = DagsterInstance.ephemeral()
    first = run_incremental(settings, now="2024-03-02T00:00:00", instance=instance)
    assert first.success
    tags = instance.get_run_by_id(first.run_id).tags  # the Runs page filters by the run's state and window
    assert (tags[RUN_STATE_TAG], tags[WINDOW_TAG]) == ("first_run", "2024-03-01T00:00:00..2024-03-02T00:00:00")
    state = StateStore()
    before, log_before, manifest_before = _versions(state), state.run_log(), state.entries()

    for asset in SINGLE:
        refused = _execute(None, settings, instance, assets=[AssetKey(asset)])

        run = instance.get_run_by_id(refused.run_id)
        assert run.status == DagsterRunStatus.CANCELED, f"{asset}: the run is canceled, not failed (no good data painted red)"
        assert refused.describe().startswith(f"refused: {asset} alone is part of an incremental run, which also needs ")
        assert "Materialize the job incremental_job instead" in refused.error
        canceling = instance.all_logs(refused.run_id, of_type=DagsterEventType.RUN_CANCELING)
        assert canceling and canceling[0].message.startswith(f"refused: {asset} alone is part of an incremental run")
        assert _versions(state) == before and state.entries() == manifest_before, asset
        assert state.run_log() == log_before, f"{asset}: a refused run leaves no record"
        if asset == "filtered_events":  # its checks, the blocking one included, are skipped, not failed
            for name in ("event_id_unique", "events_within_session_cap", "manifest_consistent_with_tables"):
                status = _check_status(instance, AssetCheckKey(AssetKey(asset), name), refused.run_id)
                assert status == AssetCheckExecutionResolvedStatus.SKIPPED, name

    # A whole unit still runs after them.
    assert run_incremental(settings, now="2024-03-02T06:00:00", instance=instance).success


def test_the_base_chain_without_an_incremental_asset_is_refused_by_its_first_step(spark, warehouse):
    generate_stream(spark, environment.table_uri(environment.ATOMIC_EVENTS),
                    SampleParams(users=3, days=1, events_per_day=30, start_date=date(2024, 3, 1), seed=5), hours=24)
    settings = IncrementalSettings(start_date="2024-03-01")
    instance = DagsterInstance.ephemeral()
    chain = ["new_event_limits", "sessions_lifecycle_manifest", "quarantined_sessions", "events_this_run"]
    refused = _execute(None, settings, instance, assets=[AssetKey(name) for name in chain])
    assert instance.get_run_by_id(refused.run_id).status == DagsterRunStatus.CANCELED
    assert "which also needs an incremental asset" in refused.error
    assert table_version(StateStore().uri("new_event_limits")) is None
