"""Settings and attribute definitions that change: every table knows what it was built
under; a change is refused until its plan is applied, and applying it leaves exactly the tables a
run from scratch with the new settings leaves. Never a broken daily layer, never a silent mix.

One warehouse is built once under the base settings; each case copies it, changes a setting, and
compares with a warehouse built from scratch under the new one (once for each setting compared).
"""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets.cli import main
from incremental_assets.cli.preview import preview
from incremental_assets.cli.runner import apply_changes, process_marked_days, run_incremental, run_until_caught_up
from incremental_assets.lib.attributes import SAMPLE_ATTRIBUTES
from incremental_assets.lib.delta.log import table_version
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.upkeep.refresh import refresh
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.store import StateStore
from tests.warehouse_tables import comparable_tables, sample_source, scenario_environment

PARAMS = SampleParams(users=5, days=2, events_per_day=120, start_date=date(2024, 3, 1), seed=41, bot_share=0.2)
NOW = "2024-03-05T00:00:00"
THREE = [a for a in SAMPLE_ATTRIBUTES if a["name"] in ("page_views", "page_views_7d", "distinct_apps")]
CARTS_3D = {"name": "carts_3d", "aggregation": "count", "event_names": ["add_to_cart"], "period": "last 3 days"}
BASE = {"start_date": "2024-03-01", "backfill_limit_days": 5, "attributes_reference_date": "2024-03-04", "attributes": THREE}


def settings_of(values: dict) -> IncrementalSettings:
    return IncrementalSettings(**values)


def build(root: Path, source: str, values: dict) -> None:
    """A warehouse under `root` from scratch: runs until caught up, and their daily runs."""
    with scenario_environment(root, source, {}):
        runs = run_until_caught_up(settings_of(values), report=lambda line: None, instance=DagsterInstance.ephemeral(), now=NOW)
    assert all(run.success for run in runs), [run.error for run in runs]


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """The source, and a warehouse built under the base settings (copied by each case)."""
    root = tmp_path_factory.mktemp("settings-changes")
    source = sample_source(spark, PARAMS, root)
    build(root / "base", source, BASE)
    return source, root / "base"


def copied(built, tmp_path: Path) -> Path:
    _, base = built
    warehouse = tmp_path / "warehouse"
    shutil.copytree(base, warehouse)
    return warehouse


def versions(warehouse: Path) -> dict[str, int | None]:
    return {table.name: table_version(str(table)) for table in warehouse.iterdir()}


def refused_then_applied(spark, built, tmp_path, changed: dict, instance=None) -> Path:
    """The warehouse copied, a run under `changed` refused without a write, the plan applied."""
    source, _ = built
    warehouse = copied(built, tmp_path)
    settings = settings_of(changed)
    instance = instance or DagsterInstance.ephemeral()
    with scenario_environment(warehouse, source, {}):
        before = versions(warehouse)
        refused = run_incremental(settings, instance=instance, now=NOW)
        assert not refused.success and refused.error.startswith("refused: the settings differ from those the tables")
        assert versions(warehouse) == before, "a refused run writes nothing"
        assert "incremental-assets apply" in refused.error
        applied = apply_changes(settings, instance=instance, report=lambda line: None, now=NOW)
        assert applied.success and not applied.plan.empty
    return warehouse


@pytest.fixture(scope="module")
def from_scratch(built, tmp_path_factory):
    """The warehouse a run from scratch under some settings leaves: built once per module for each
    (cases that change the same setting compare with the same one), and only read."""
    source, _ = built
    made: dict[str, Path] = {}

    def warehouse(changed: dict) -> Path:
        key = json.dumps(changed, sort_keys=True)
        if key not in made:
            made[key] = tmp_path_factory.mktemp("scratch")
            build(made[key], source, changed)
        return made[key]

    return warehouse


# Every setting that changes what a table holds (the fingerprints' SOURCE, EVENT and DAILY rules),
# and each kind of attribute change. make test runs one of each kind of rebuild; make soak all.
CHANGES = [
    pytest.param({"max_session_days": 1}, id="max_session_days"),
    pytest.param({"event_names": ["page_view", "page_ping"]}, id="event_names"),
    pytest.param({"attribute_key": "session_identifier"}, id="attribute_key"),
    pytest.param({"attributes": [*THREE, CARTS_3D]}, id="attribute added"),
    *(pytest.param(change, id=name, marks=pytest.mark.soak) for name, change in [
        ("start_date", {"start_date": "2024-03-02"}),
        ("session_timestamp", {"session_timestamp": "collector_tstamp"}),
        ("session_identifiers", {"session_identifiers": ["domain_userid"]}),
        ("session_identifier_sql", {"session_identifier_sql": "concat(domain_sessionid, '-web')"}),
        ("user_identifiers", {"user_identifiers": ["user_id", "domain_userid"]}),
        ("user_identifier_sql", {"user_identifier_sql": "upper(domain_userid)"}),
        ("days_late_allowed", {"days_late_allowed": 5}),  # keeps the events the sample sends 4 days late
        ("allow_null_dvce_tstamps", {"allow_null_dvce_tstamps": True}),
        ("app_ids", {"app_ids": ["website"]}),
        ("allow_null_app_id", {"app_ids": ["website", "docs", "mobile_app"], "allow_null_app_id": True}),
        ("attribute redefined", {"attributes": [{**THREE[0], "event_names": ["page_view", "add_to_cart"]}, *THREE[1:]]}),
        ("attribute removed", {"attributes": THREE[:2]}),
    ]),
]


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_setting_is_refused_until_applied_then_equals_a_run_from_scratch(spark, built, tmp_path, change, from_scratch):
    changed = {**BASE, **change}
    warehouse = refused_then_applied(spark, built, tmp_path, changed)
    assert comparable_tables(warehouse) == comparable_tables(from_scratch(changed))


def test_adding_an_attribute_computes_its_column_for_every_day_and_touches_nothing_else(spark, built, tmp_path, from_scratch):
    """Finding: a fourth attribute stopped the daily layer on a schema mismatch."""
    _, base = built
    before = read_table(spark, f"{base}/daily_aggregates")
    kept = sorted(map(tuple, before.select(*sorted(before.columns)).collect()))
    changed = {**BASE, "attributes": [*THREE, CARTS_3D]}
    warehouse = refused_then_applied(spark, built, tmp_path, changed)
    after = read_table(spark, f"{warehouse}/daily_aggregates")
    assert "carts_3d__partial" in after.columns
    assert sorted(map(tuple, after.select(*sorted(before.columns)).collect())) == kept, "no other column changed"
    scratch = from_scratch(changed)
    for table in ("attributes", "attributes_history"):
        assert comparable_tables(warehouse)[table] == comparable_tables(scratch)[table]
    assert "carts_3d" in DeltaTable(f"{warehouse}/attributes_history").schema().to_arrow().names
    logged = DeltaTable(f"{warehouse}/run_log").to_pyarrow_table(columns=["asset", "message"]).to_pylist()
    assert any(r["asset"] == "attributes_history" and "rebuilt for every key from start_date" in (r["message"] or "") for r in logged)


def test_a_redefined_attribute_is_refused_not_mixed_then_recomputed_for_every_day(spark, built, tmp_path, from_scratch):
    """Finding: redefining page_views used the new definition only for days recomputed since."""
    changed = {**BASE, "attributes": [{**THREE[0], "event_names": ["page_view", "add_to_cart"]}, *THREE[1:]]}
    warehouse = refused_then_applied(spark, built, tmp_path, changed)
    assert comparable_tables(warehouse)["attributes"] == comparable_tables(from_scratch(changed))["attributes"]


def test_a_changed_filter_is_refused_not_mixed_then_rebuilt_downstream(spark, built, tmp_path, from_scratch):
    """Finding: setting app_ids after runs kept the other apps' rows in old days."""
    changed = {**BASE, "app_ids": ["website"]}
    warehouse = refused_then_applied(spark, built, tmp_path, changed)
    tables = comparable_tables(warehouse)
    assert tables == comparable_tables(from_scratch(changed))
    apps = {row.app_id for row in read_table(spark, f"{warehouse}/filtered_events").select("app_id").distinct().collect()}
    assert apps == {"website"}


def test_a_forward_only_change_rebuilds_nothing_and_records_its_day(spark, built, tmp_path):
    source, _ = built
    warehouse = copied(built, tmp_path)
    changed = settings_of({**BASE, "app_ids": ["website"]})
    with scenario_environment(warehouse, source, {}):
        before = comparable_tables(warehouse)
        applied = apply_changes(changed, forward_only=True, instance=DagsterInstance.ephemeral(), report=lambda line: None)
        assert applied.success and not applied.runs
        recorded = StateStore().fingerprints()
        assert recorded["filtered_events"].effective_from is not None
        assert run_incremental(changed, instance=DagsterInstance.ephemeral(), now=NOW).success, "no longer refused"
    assert comparable_tables(warehouse) == before


def test_settings_that_change_nothing_stored_never_produce_a_plan(spark, built, tmp_path):
    source, _ = built
    warehouse = copied(built, tmp_path)
    quiet = {**BASE, "filtered_events_fresh_hours": 9, "daily_aggregates_fresh_hours": 50, "maintenance_retention_hours": 500,
             "maintenance_zorder_by": {"filtered_events": ["event_id"]}, "attributes_reference_date": "2024-03-03",
             "backfill_limit_days": 1, "lookback_window_hours": 2, "reprocess_days": 9, "min_rows_to_process": 3}
    with scenario_environment(warehouse, source, {}):
        assert preview(settings_of(quiet)).plan.empty
        assert run_incremental(settings_of(quiet), instance=DagsterInstance.ephemeral(), now=NOW).success


def test_plan_and_preview_show_the_change_and_the_command(built, tmp_path, capsys):
    source, _ = built
    warehouse = copied(built, tmp_path)
    with scenario_environment(warehouse, source, {}):
        assert main(["plan", "--set", "start_date=2024-03-01", "--set", "event_names=page_view"]) == 0
        out = capsys.readouterr().out
        assert main(["preview", "--set", "start_date=2024-03-01", "--set", "event_names=page_view"]) == 0
        shown = capsys.readouterr().out
    assert "filtered_events" in out and "settings event_names changed -> rebuilt for every day" in out
    assert "sessions_lifecycle_manifest" not in out, "upstream of the change: untouched"
    assert "incremental-assets apply" in out and "incremental-assets apply" in shown


def test_refresh_repairs_a_warehouse_whose_attributes_were_added_and_removed_several_times(spark, built, tmp_path):
    source, _ = built
    warehouse = copied(built, tmp_path)
    instance = DagsterInstance.ephemeral()
    with scenario_environment(warehouse, source, {}):
        for attributes in ([*THREE, CARTS_3D], THREE[:1], [*THREE, CARTS_3D], THREE):
            applied = apply_changes(settings_of({**BASE, "attributes": attributes}), instance=instance,
                                    report=lambda line: None, now=NOW)
            assert applied.success
        final = settings_of({**BASE, "attributes": THREE, "allow_refresh": True})
        refresh(final, instance)
        runs = run_until_caught_up(final, report=lambda line: None, instance=instance, now=NOW)
        assert all(run.success for run in runs) and process_marked_days(final, instance) == []
    daily = read_table(spark, f"{warehouse}/daily_aggregates")
    assert not [c for c in daily.columns if c.startswith("carts_3d")], "the schema of the current definitions"
    assert comparable_tables(warehouse) == comparable_tables(built[1])


def test_from_the_ui_the_apply_job_applies_the_plan_and_the_sensors_hold_until_then(spark, built, tmp_path):
    from dagster import RunRequest, SkipReason, build_sensor_context

    from incremental_assets.cli.runner import settings_run_config
    from incremental_assets.definitions import build_definitions
    from incremental_assets.defs.automation import (
        additive_changes_sensor,
        daily_partitions_sensor,
        source_events_sensor,
    )
    from incremental_assets.defs.operations import apply_plan_job

    source, _ = built
    warehouse = copied(built, tmp_path)
    added = settings_of({**BASE, "attributes": [*THREE, CARTS_3D]})
    instance = DagsterInstance.ephemeral()
    with scenario_environment(warehouse, source, {}):
        tick = source_events_sensor(build_sensor_context(instance=instance, resources={"settings": added}))
        assert isinstance(tick, SkipReason) and "carts_3d added" in tick.skip_message
        assert isinstance(daily_partitions_sensor(build_sensor_context(instance=instance, resources={"settings": added})), SkipReason)
        held = additive_changes_sensor(build_sensor_context(instance=instance, resources={"settings": added}))
        assert isinstance(held, SkipReason) and "waits for an operator" in held.skip_message
        automatic = settings_of({**BASE, "attributes": [*THREE, CARTS_3D], "apply_additive_changes": True})
        context = build_sensor_context(instance=instance, resources={"settings": automatic})
        assert isinstance(source_events_sensor(context), SkipReason), "the plan first"
        request = additive_changes_sensor(context)
        assert isinstance(request, RunRequest) and additive_changes_sensor.job_name == apply_plan_job.name

        job = build_definitions(added).resolve_job_def(apply_plan_job.name)
        assert job.execute_in_process(run_config=settings_run_config(added), instance=instance).success
        recorded = StateStore().fingerprints()
        assert set(recorded["daily_aggregates"].fingerprint.attributes) == {a["name"] for a in [*THREE, CARTS_3D]}
        assert "carts_3d__partial" in read_table(spark, f"{warehouse}/daily_aggregates").columns
        marked = process_marked_days(added, instance)  # what the daily sensor requests next
        assert marked and all(run.success for run in marked)
        assert "carts_3d" in read_table(spark, f"{warehouse}/attributes").columns


def test_an_earlier_release_warehouse_upgraded_with_a_breaking_change_is_planned_then_equals_a_run_from_scratch(
    spark, built, tmp_path, capsys, from_scratch
):
    """Finding: a warehouse of a release that recorded no fingerprints, upgraded together with
    max_session_days 3 -> 1, was adopted under the new settings: `plan` said nothing to apply, the
    run failed its blocking check and recorded a false fingerprint, and every later run failed."""
    source, _ = built
    warehouse = copied(built, tmp_path)
    shutil.rmtree(warehouse / "table_fingerprints")  # what an earlier release left
    changed = {**BASE, "max_session_days": 1}
    with scenario_environment(warehouse, source, {}):
        assert main(["plan", "--set", "max_session_days=1", "--set", "start_date=2024-03-01"]) == 0
        shown = capsys.readouterr().out
        assert "built by an earlier release, which recorded no settings -> rebuilt for every day" in shown
        assert "apply --forward-only adopts them as they are" in shown
        refused = run_incremental(settings_of(changed), instance=DagsterInstance.ephemeral(), now=NOW)
        assert not refused.success and "incremental-assets apply" in refused.error
        assert not (warehouse / "table_fingerprints").exists(), "no fingerprint recorded by a refused run"
        applied = apply_changes(settings_of(changed), instance=DagsterInstance.ephemeral(), report=lambda line: None, now=NOW)
        assert applied.success and all(change.earlier_release for change in applied.plan.changes)
    assert comparable_tables(warehouse) == comparable_tables(from_scratch(changed))
