"""Full refresh: refused without allow_refresh (nothing dropped), otherwise every derived table and
both manifests are emptied under the lease, and the rebuild from start_date gives the same tables."""

from datetime import date

import pytest
from dagster import DagsterInstance, DagsterInvalidConfigError

from incremental_assets.cli import main
from incremental_assets.cli.runner import run_until_caught_up, settings_run_config
from incremental_assets.definitions import build_definitions
from incremental_assets.defs.incremental.filtered_events import manifest_consistent_with_tables
from incremental_assets.defs.operations import refresh_job
from incremental_assets.lib import environment
from incremental_assets.lib.catalog import refreshed_tables
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.upkeep.refresh import RefreshNotAllowed, refresh
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.store import StateStore

NOW = "2024-03-03T00:00:00"
COMPARED = ("filtered_events", "sessions", "sessions_lifecycle_manifest", "quarantined_sessions", "daily_aggregates", "attributes")


def _tables(spark, warehouse):
    return {t: sorted(map(tuple, read_table(spark, f"{warehouse}/{t}").collect())) for t in COMPARED}


def test_refresh_is_refused_without_allow_refresh_then_rebuilds_the_same_tables(spark, warehouse, capsys):
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, source, SampleParams(users=8, days=3, events_per_day=120, start_date=date(2024, 3, 1), seed=9), hours=48)
    settings = IncrementalSettings(start_date="2024-03-01", attributes_reference_date="2024-03-02")
    instance = DagsterInstance.ephemeral()
    assert all(s.success for s in run_until_caught_up(settings, report=lambda s: None, now=NOW, instance=instance))
    before = _tables(spark, warehouse)
    assert before["filtered_events"] and before["daily_aggregates"]
    assert manifest_consistent_with_tables(state=StateStore()).passed  # on real runs' microseconds

    with pytest.raises(RefreshNotAllowed, match="Nothing was dropped"):
        refresh(settings, instance)
    assert main(["refresh", "--set", "allow_refresh=false"]) == 2 and "allow_refresh" in capsys.readouterr().err
    assert _tables(spark, warehouse) == before and StateStore().entries()

    # From the launchpad: refresh_job, refused with the same message, then allowed by its config.
    # It also needs the warehouse's path typed: allow_refresh alone is one edit of a pre-filled field.
    job = build_definitions(settings).resolve_job_def(refresh_job.name)
    confirmed = {"ops": {"full_refresh": {"config": {"confirm_warehouse": warehouse}}}}
    refused = job.execute_in_process(run_config={**settings_run_config(settings), **confirmed}, instance=instance, raise_on_error=False)
    assert not refused.success and "Nothing was dropped" in str(refused.all_events)
    assert _tables(spark, warehouse) == before

    allowed = settings.model_copy(update={"allow_refresh": True})
    with pytest.raises(DagsterInvalidConfigError, match="confirm_warehouse"):
        job.execute_in_process(run_config=settings_run_config(allowed), instance=instance)
    mistyped = {"ops": {"full_refresh": {"config": {"confirm_warehouse": "/tmp/another-warehouse"}}}}
    refused = job.execute_in_process(run_config={**settings_run_config(allowed), **mistyped}, instance=instance, raise_on_error=False)
    assert not refused.success and f"this run's warehouse is {warehouse!r}" in str(refused.all_events)
    assert _tables(spark, warehouse) == before
    launched = job.execute_in_process(run_config={**settings_run_config(allowed), **confirmed}, instance=instance)
    deleted = {r["asset"]: r["rows"] for r in StateStore().run_log(run_id=launched.run_id) if r["status"] == "Processed"}
    assert set(deleted) == set(refreshed_tables()) and "new_event_limits" not in deleted
    assert deleted["filtered_events"] == len(before["filtered_events"])
    assert all(not rows for rows in _tables(spark, warehouse).values())
    assert not StateStore().entries() and not StateStore().days()

    assert all(s.success for s in run_until_caught_up(allowed, report=lambda s: None, now=NOW, instance=instance))
    assert _tables(spark, warehouse) == before
