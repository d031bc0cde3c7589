"""Settings are data, never SQL text: injection-shaped values are matched literally or refused
before a run, and the code has no place that pastes a setting into SQL."""

import re
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest

from incremental_assets.lib.attributes import parse_attributes
from incremental_assets.lib.settings import IncrementalSettings, SettingsError, load_settings
from incremental_assets.lib.source.contract import REQUIRED_COLUMNS, contract_problems
from incremental_assets.lib.transforms.daily import event_filter
from incremental_assets.lib.transforms.sessions import app_allowed, sent_in_time

PACKAGE = Path(__file__).resolve().parents[2] / "incremental_assets"
INJECTED = "web' OR '1'='1"

# Where the package builds SQL text, and why each is safe. A new one fails the test below until it
# is added here with its reason (or, better, written with the DataFrame API).
SQL_TEXT = {
    ("lib/transforms/sessions.py", "F.expr(sql)"): "the deployment's own identifier expression (*_identifier_sql)",
    ("lib/delta/write.py", "mergeInto(target"): "the table's path as a quoted name (path_identifier), not SQL",
    ("lib/delta/write.py", "condition = \" AND \".join("): "key columns declared in code (deltalake MERGE)",
    ("lib/delta/write.py", "condition += f"): "a date computed by the run (deltalake MERGE floor)",
    ("lib/state/store.py", "snapshot.merge(data, f"): "a date computed by the run and the run log's own columns (deltalake MERGE)",
    ("lib/delta/spec.py", 'return f"{name} >='): "a partition window of dates computed by the run (Spark's replaceWhere, deltalake's predicate)",
}
SQL_CALL = re.compile(r"F\.expr\(|selectExpr\(|\.sql\(|\.where\(f|condition \+?= f?\"|return f\"`|>= '\{|mergeInto\(")


def test_no_setting_is_pasted_into_sql_text():
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for line in path.read_text().splitlines():
            if SQL_CALL.search(line):
                known = [key for key in SQL_TEXT if key[0] == str(path.relative_to(PACKAGE)) and key[1] in line]
                assert known, f"{path.relative_to(PACKAGE)} builds SQL text: {line.strip()}"
                found.update(known)
    assert found == set(SQL_TEXT), f"no longer in the code: {set(SQL_TEXT) - found}"


def test_injection_shaped_app_ids_and_attribute_values_are_matched_as_data(spark):
    rows = spark.createDataFrame(
        [("website", "page_view", "web"), (INJECTED, "page_view", INJECTED), ("other", "page_view", "other")],
        "app_id string, event_name string, platform string",
    )
    allowed = rows.where(app_allowed(IncrementalSettings(app_ids=[INJECTED])))
    assert [r.app_id for r in allowed.collect()] == [INJECTED]
    [spec] = parse_attributes(
        [{"name": "apps", "aggregation": "unique_list", "property": "app_id",
          "conditions": [{"column": "platform", "op": "=", "value": INJECTED}]}]
    )
    assert [r.app_id for r in rows.where(event_filter(spec)).collect()] == [INJECTED]


def test_an_interval_setting_is_a_number_not_text(spark):
    rows = spark.createDataFrame(
        [(datetime(2024, 1, 1), datetime(2024, 1, 3, 23)), (datetime(2024, 1, 1), datetime(2024, 1, 4, 1))],
        "dvce_created_tstamp timestamp, dvce_sent_tstamp timestamp",
    )
    kept = rows.where(sent_in_time(IncrementalSettings(days_late_allowed=3)))
    assert [r.dvce_sent_tstamp for r in kept.collect()] == [datetime(2024, 1, 3, 23)]
    with pytest.raises(SettingsError, match="days_late_allowed must be of type 'int'"):
        load_settings(overrides={"days_late_allowed": "3 DAYS + INTERVAL 100"}, environ={})


def test_injection_shaped_column_names_are_refused_before_a_run():
    schema = pa.schema({name: pa.timestamp("us", "UTC") if name.endswith("tstamp") else pa.string() for name in REQUIRED_COLUMNS})
    shaped = "domain_sessionid) OR (1=1"
    settings = IncrementalSettings(
        session_identifiers=[shaped],
        attributes=[{"name": "apps", "aggregation": "unique_list", "property": "app_id; DROP TABLE events"}],
    )
    assert contract_problems(schema, settings) == [
        f"column {shaped!r} (named in the settings) is missing",
        "column 'app_id; DROP TABLE events' (named in the settings) is missing",
    ]
    with pytest.raises(SettingsError, match="lower_snake_case"):
        IncrementalSettings(attributes=[{"name": "x'; DROP TABLE attributes; --", "aggregation": "count"}])


def test_the_ui_listens_on_the_loopback_interface_only():
    recipes = [line for line in (PACKAGE.parent / "Makefile").read_text().splitlines() if line.startswith("\t")]
    [command] = [line for line in recipes if "dagster dev" in line]
    assert "-h 127.0.0.1" in command
    [worker] = [line for line in recipes if "incremental-assets serve" in line]  # make ui's warm worker
    assert "--host" not in worker  # its default: 127.0.0.1
