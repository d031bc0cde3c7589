"""Fingerprints and plans on plain values: what a change of settings does to each table."""
from incremental_assets.lib.catalog import DAILY_RULES, EVENT_RULES, SOURCE_RULES
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.fingerprints import (
    ADDITIVE,
    BREAKING,
    FORWARD_ONLY,
    Fingerprint,
    Stored,
    TableChange,
    fingerprint_of,
    plan,
)

VALUES = IncrementalSettings(start_date="2024-03-01").model_dump()
PAGE_VIEWS = {"name": "page_views", "aggregation": "count", "event_names": ["page_view"]}
CARTS = {"name": "carts_3d", "aggregation": "count", "event_names": ["add_to_cart"], "period": "last 3 days"}


def tables(values=VALUES, attributes=(PAGE_VIEWS,)):
    by_name = {a["name"]: a for a in attributes}
    return {
        "sessions_lifecycle_manifest": fingerprint_of(values, SOURCE_RULES),
        "filtered_events": fingerprint_of(values, EVENT_RULES),
        "daily_aggregates": fingerprint_of(values, DAILY_RULES, by_name),
    }


def stored(fingerprints):
    return {table: Stored(f) for table, f in fingerprints.items()}


def test_the_same_settings_plan_nothing_and_a_table_without_a_fingerprint_is_adopted():
    assert plan(stored(tables()), tables()).empty
    adopted = plan({}, tables())
    assert adopted.empty and adopted.adopted == ("sessions_lifecycle_manifest", "filtered_events", "daily_aggregates")


def test_a_table_with_rows_and_no_fingerprint_was_built_by_an_earlier_release_and_is_planned():
    """Its settings were never recorded: rebuilt by the plan (a breaking change at the upgrade is
    caught), or, forward-only, adopted as built under the current settings; never silently."""
    upgraded = plan({}, tables(), built=["sessions_lifecycle_manifest", "filtered_events"])
    assert [(c.table, c.kind, c.earlier_release, c.rebuild) for c in upgraded.changes] == [
        ("sessions_lifecycle_manifest", BREAKING, True, True), ("filtered_events", BREAKING, True, True)]
    assert upgraded.adopted == ("daily_aggregates",)  # no rows yet: new, recorded when first written
    text = "\n".join(upgraded.describe())
    assert "built by an earlier release, which recorded no settings -> rebuilt for every day" in text
    assert "apply --forward-only adopts them as they are" in text
    adopting = plan({}, tables(), forward_only=True, built=["filtered_events"])
    [change] = adopting.changes
    assert (change.kind, change.rebuild) == (FORWARD_ONLY, False)
    assert "adopted as built under the current settings" in change.describe()


def test_settings_that_change_nothing_stored_are_in_no_fingerprint():
    quiet = {**VALUES, "backfill_limit_days": 3, "lookback_window_hours": 1, "filtered_events_fresh_hours": 9,
             "daily_aggregates_fresh_hours": 99, "maintenance_retention_hours": 500, "attributes_reference_date": "2024-03-04",
             "reprocess_days": 9, "min_rows_to_process": 4, "upsert_lookback_days": 3, "session_lookback_days": 10,
             "source_load_date_column": "date_load_tstamp", "allow_refresh": True}
    assert plan(stored(tables()), tables(quiet)).empty


def test_a_filter_rebuilds_the_tables_downstream_of_it_and_only_those():
    changed = plan(stored(tables()), tables({**VALUES, "event_names": ["page_view"]}))
    assert [(c.table, c.kind, c.settings, c.rebuild) for c in changed.changes] == [
        ("filtered_events", BREAKING, ("event_names",), True),
        ("daily_aggregates", BREAKING, ("event_names",), True),
    ]
    session_rule = plan(stored(tables()), tables({**VALUES, "max_session_days": 2}))
    assert [c.table for c in session_rule.changes] == ["sessions_lifecycle_manifest", "filtered_events", "daily_aggregates"]


def test_an_attribute_added_or_removed_is_additive_and_one_redefined_is_breaking_for_its_column():
    added = plan(stored(tables()), tables(attributes=(PAGE_VIEWS, CARTS)))
    assert added.changes == (TableChange("daily_aggregates", ADDITIVE, added=("carts_3d",)),) and added.additive_only
    assert not added.changes[0].rebuild
    removed = plan(stored(tables(attributes=(PAGE_VIEWS, CARTS))), tables())
    assert removed.changes == (TableChange("daily_aggregates", ADDITIVE, removed=("carts_3d",)),)
    redefined = plan(stored(tables()), tables(attributes=({**PAGE_VIEWS, "event_names": ["page_view", "add_to_cart"]},)))
    assert redefined.changes == (TableChange("daily_aggregates", BREAKING, redefined=("page_views",)),)
    assert not redefined.changes[0].rebuild, "the column is recomputed, not the table"


def test_forward_only_is_asked_for_and_rebuilds_nothing():
    forward = plan(stored(tables()), tables({**VALUES, "app_ids": ["website"]}), forward_only=True)
    assert {c.kind for c in forward.changes} == {FORWARD_ONLY} and not any(c.rebuild for c in forward.changes)


def test_a_setting_without_effect_under_the_others_is_left_out():
    with_sql = {**VALUES, "session_identifier_sql": "coalesce(domain_sessionid, 'x')"}
    other_columns = {**with_sql, "session_identifiers": ["other"]}
    assert fingerprint_of(with_sql, SOURCE_RULES) == fingerprint_of(other_columns, SOURCE_RULES)
    assert fingerprint_of(VALUES, SOURCE_RULES) == fingerprint_of({**VALUES, "allow_null_app_id": True}, SOURCE_RULES)


def test_a_fingerprint_survives_json_and_its_digest_is_stable():
    fingerprint = tables()["daily_aggregates"]
    assert Fingerprint.from_json(fingerprint.as_json()) == fingerprint
    assert fingerprint.digest == Fingerprint.from_json(fingerprint.as_json()).digest and len(fingerprint.digest) == 12


def test_the_plan_names_each_table_its_change_and_the_command():
    lines = plan(stored(tables()), tables({**VALUES, "event_names": ["page_view"]})).describe()
    assert lines[0] == "The settings differ from those 2 table(s) were built under:"
    assert "filtered_events" in lines[1] and "settings event_names changed -> rebuilt for every day" in lines[1]
    assert lines[-1].startswith("Nothing is written until the plan is applied: incremental-assets apply")


def test_the_attributes_history_is_rebuilt_whole_when_its_attributes_change_whatever_the_kind():
    """Its columns are the attributes: an attribute added is additive (the sensor may apply it) and
    still rebuilds it whole; a setting applied forward-only rebuilds nothing there either."""
    def with_history(values=VALUES, attributes=(PAGE_VIEWS,)):
        return {**tables(values, attributes), "attributes_history": tables(values, attributes)["daily_aggregates"]}

    added = plan(stored(with_history()), with_history(attributes=(PAGE_VIEWS, CARTS)), rebuilt_whole=["attributes_history"])
    assert [(c.table, c.kind, c.rebuild) for c in added.changes] == [
        ("daily_aggregates", ADDITIVE, False), ("attributes_history", ADDITIVE, True)]
    assert added.additive_only
    assert "attribute(s) carts_3d added -> rebuilt for every key from start_date" in added.changes[1].describe()
    forward = plan(stored(with_history()), with_history(attributes=()), forward_only=True, rebuilt_whole=["attributes_history"])
    assert [(c.table, c.rebuild) for c in forward.changes] == [("daily_aggregates", False), ("attributes_history", True)]
    setting = plan(stored(with_history()), with_history({**VALUES, "app_ids": ["website"]}), forward_only=True,
                   rebuilt_whole=["attributes_history"])
    assert not any(c.rebuild for c in setting.changes)
