"""Forgetting a person (SPEC §11): after `forget`, every table and the daily manifest's counts equal
a warehouse built from scratch over the same stream without that person's events; the audit record
holds no key in clear; the same command again erases nothing more and records the same request; a
keyhole over the whole stream, and a late load of the person's events again, bring nothing back; a
request killed half-way is finished by the same command."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets.cli import main
from incremental_assets.cli.runner import run_incremental, run_until_caught_up
from incremental_assets.definitions import build_definitions
from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.sample.stream import STREAM_SCHEMA
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.sessions import ERASED_USER
from incremental_assets.lib.utc import utcnow
from tests.warehouse_tables import COMPARED, REFERENCE_DAY, comparable_tables, scenario_environment

PARAMS = SampleParams(users=6, days=3, events_per_day=150, start_date=(utcnow() - timedelta(days=6)).date(), seed=41,
                      late_share=0.2)
# A day's window a run, and late rows left pending (deferred): the manifest's two counts both change.
HELD = ("filtered_events", "sessions", "sessions_lifecycle_manifest", "daily_aggregates", "attributes", "attributes_history")
SETTINGS = {"start_date": PARAMS.start_date.isoformat(), "attributes_reference_date": REFERENCE_DAY, "backfill_limit_days": 1,
            "min_rows_to_process": 1000}


def build(spark, root, rows) -> None:
    source = str(root / "source")
    write_events(spark, spark.createDataFrame(rows, STREAM_SCHEMA), source, "append")
    with scenario_environment(root / "warehouse", source, SETTINGS, home=root / "home"):
        runs = run_until_caught_up(IncrementalSettings(**SETTINGS), report=lambda line: None, instance=DagsterInstance.ephemeral())
    assert all(run.success for run in runs), [run.error for run in runs]


def days_counted(warehouse) -> dict:
    rows = DeltaTable(f"{warehouse}/daily_aggregation_manifest").to_pyarrow_table().to_pylist()
    return {row["event_date"]: (row["processed_events"], row["pending_late_events"]) for row in rows}


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """The stream's warehouse with the person, to copy, and the one built without their events."""
    base = tmp_path_factory.mktemp("erasure")
    rows = generate_table(PARAMS, PARAMS.start, PARAMS.start + timedelta(days=PARAMS.days + 2))
    person = sorted({user for user in rows.column("domain_userid").to_pylist() if user})[1]
    build(spark, base / "with", rows)
    build(spark, base / "without", rows.filter([user != person for user in rows.column("domain_userid").to_pylist()]))
    assert comparable_tables(base / "with" / "warehouse") != comparable_tables(base / "without" / "warehouse")
    return rows, person, base


def test_a_forgotten_user_leaves_the_tables_of_a_stream_without_them(built, spark, tmp_path, capsys):
    rows, person, base = built
    shutil.copytree(base / "with", tmp_path / "with")

    with scenario_environment(tmp_path / "with" / "warehouse", tmp_path / "with" / "source", SETTINGS, home=tmp_path / "with" / "home"):
        capsys.readouterr()
        assert main(["forget", "--key", person]) == 0
        said = capsys.readouterr().out
        [request] = StateStore().erasure_log()
        # Again, from the UI's forget_job, as after a crash: nothing more to erase, the same request.
        settings, instance = IncrementalSettings(**SETTINGS), DagsterInstance.ephemeral()
        again = build_definitions(settings).resolve_job_def("forget_job").execute_in_process(
            instance=instance, run_config={"ops": {"forget_keys": {"config": {"keys": [person]}}}})
        [output] = [e.event_specific_data.metadata for e in again.all_events if e.is_successful_output]
        [same] = StateStore().erasure_log()

        # The source still holds the person's rows (no --source): a keyhole over all of it, then a
        # loader that brings their events again, loaded now. Every one is dropped as erased.
        keyhole = run_incremental(settings, lower=str(PARAMS.start), upper=str(utcnow()), instance=instance)
        theirs = rows.filter(pc.equal(rows.column("domain_userid"), person))
        now = utcnow() - timedelta(minutes=1)
        again_loaded = theirs.set_column(theirs.schema.get_field_index("load_tstamp"), "load_tstamp",
                                         pa.array([now] * theirs.num_rows, theirs.schema.field("load_tstamp").type))
        again_loaded = again_loaded.set_column(again_loaded.schema.get_field_index("load_date"), "load_date",
                                               pa.array([now.date()] * theirs.num_rows, pa.date32()))
        write_events(spark, spark.createDataFrame(again_loaded, STREAM_SCHEMA), str(tmp_path / "with" / "source"), "append")
        late = run_until_caught_up(settings, report=lambda line: None, instance=instance)

        # Physically: the rewritten files stay for time travel until VACUUM (here as if its
        # retention had passed), then nothing holds them and the maintenance job records so.
        assert main(["forget", "--status"]) == 0
        held_before = capsys.readouterr().out
        warehouse = tmp_path / "with" / "warehouse"
        for table in json.loads(request["rows"]):
            DeltaTable(str(warehouse / table)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        assert main(["forget", "--status"]) == 0
        cdc_left = capsys.readouterr().out  # deltalake's VACUUM leaves the change data files: the maintenance job's does not
        a_week_ago = time.time() - 8 * 24 * 3600
        for written in (warehouse / "filtered_events" / "_change_data").rglob("*.parquet"):
            os.utime(written, (a_week_ago, a_week_ago))
        maintained = build_definitions(settings).resolve_job_def("maintenance_job").execute_in_process(instance=instance)
        assert main(["forget", "--status"]) == 0
        held_after = capsys.readouterr().out
        [gone] = StateStore().erasure_log()

    assert keyhole.success and keyhole.value("sessions_lifecycle_manifest", f"dropped_{ERASED_USER}") > 0
    account = keyhole.window
    assert account.balanced and account.counted.get(ERASED_USER), account.describe()  # as the terminal and the run log say
    assert all(run.success for run in late) and sum(run.value("sessions_lifecycle_manifest", f"dropped_{ERASED_USER}", 0)
                                                  for run in late) >= theirs.num_rows  # and the lookback's
    assert comparable_tables(tmp_path / "with" / "warehouse") == comparable_tables(base / "without" / "warehouse")
    counted = days_counted(tmp_path / "with" / "warehouse")
    assert counted == days_counted(base / "without" / "warehouse") and any(pending for _, pending in counted.values())
    erased = json.loads(request["rows"])
    assert request["status"] == "Processed" and all(erased[table] > 0 for table in HELD), erased
    printed = {line.split()[0]: int(line.split()[1]) for line in said.splitlines() if line.endswith("rows erased")}
    assert printed == erased, said
    assert again.success and output["request_id"].value == request["request_id"]
    rows_again = output["rows_erased"].value.splitlines()[2:]
    assert len(rows_again) == len(erased) and all(line.endswith("| 0 |") for line in rows_again), rows_again
    assert same["request_id"] == request["request_id"] and json.loads(same["rows"]) == erased, "one request, its rows once"
    log = DeltaTable(f"{tmp_path}/with/warehouse/erasure_log").to_pyarrow_table().to_pylist()
    assert person not in json.dumps(log, default=str), "the audit holds no key in clear"
    # Nor do the erasure's own commits, and the salt is in no table's log (a DELETE would record it in its predicate).
    secret = (tmp_path / "with" / "home" / "erasure_salt").read_text().strip()
    commits = [path.read_text() for path in (tmp_path / "with" / "warehouse").glob("*/_delta_log/*.json")]
    assert not any(secret in text for text in commits), "the salt in a Delta log"
    erasing = [text for text in commits if request["request_id"] in text]
    assert len(erasing) >= len(HELD) and not any(person in text for text in erasing)
    assert set(erased) <= set(COMPARED) | {"events_this_run"}

    assert all(f"{table:<28} " in held_before and "readable through time travel" in held_before for table in HELD), held_before
    assert "filtered_events" in cdc_left and "readable through time travel" in cdc_left, cdc_left
    assert all(line.split()[-1] == "gone" for line in held_after.splitlines() if line.startswith("  ")), held_after
    assert maintained.success and gone["physically_gone_at"] is not None
    for table in HELD:  # every version before the erasure: its files gone, or none with the person's rows
        erasing = next(h["version"] for h in DeltaTable(str(warehouse / table)).history() if h.get("userMetadata") == request["request_id"])
        column = "user_identifier" if table in ("filtered_events", "sessions", "sessions_lifecycle_manifest") else "attribute_key"
        for version in range(erasing):
            try:
                rows = DeltaTable(str(warehouse / table), version=version).to_pyarrow_table(columns=[column])
            except Exception as unreadable:  # noqa: BLE001 - deltalake names a missing file in its own error types
                assert "not found" in str(unreadable).lower() or "no such file" in str(unreadable).lower(), unreadable
                continue
            assert person not in rows.column(column).to_pylist(), f"{table} version {version} still reads the person"


KILLED = """
import os, signal, sys
from incremental_assets import cli
from incremental_assets.lib.upkeep import erasure

delete = erasure.delete_rows

def deleted_then_killed(spark, uri, matching, on, user_metadata):
    rows = delete(spark, uri, matching, on, user_metadata=user_metadata)
    if uri.rstrip("/").endswith("/" + sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return rows

erasure.delete_rows = deleted_then_killed
cli.main(["forget", "--key", sys.argv[2]])
"""


def test_a_forget_killed_half_way_is_finished_by_the_same_command(built, spark, tmp_path):
    rows, person, base = built
    shutil.copytree(base / "with", tmp_path / "with")
    warehouse = tmp_path / "with" / "warehouse"
    before = {table: DeltaTable(str(warehouse / table)).to_pyarrow_table().num_rows for table in HELD}
    with scenario_environment(warehouse, tmp_path / "with" / "source", SETTINGS, home=tmp_path / "with" / "home"):
        killed = subprocess.run([sys.executable, "-c", KILLED, "daily_aggregates", person], env=dict(os.environ),
                                capture_output=True, text=True, timeout=900)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
        [half_way] = StateStore().erasure_log()
        assert main(["forget", "--key", person]) == 0
        [done] = StateStore().erasure_log()
    assert half_way["status"] == "Processing" and done["request_id"] == half_way["request_id"] and done["status"] == "Processed"
    assert comparable_tables(warehouse) == comparable_tables(base / "without" / "warehouse")
    assert days_counted(warehouse) == days_counted(base / "without" / "warehouse")
    after = {table: DeltaTable(str(warehouse / table)).to_pyarrow_table().num_rows for table in HELD}
    erased = json.loads(done["rows"])
    assert {table: erased[table] for table in HELD} == {table: before[table] - after[table] for table in HELD}, "each row counted once"
