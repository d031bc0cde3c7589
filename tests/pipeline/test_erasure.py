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
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from deltalake import DeltaTable, write_deltalake

from incremental_assets.cli import main
from incremental_assets.cli.runner import run_days, run_incremental, run_until_caught_up
from incremental_assets.definitions import build_definitions
from incremental_assets.lib.delta import write
from incremental_assets.lib.catalog import DAILY_AGGREGATES, FILTERED_EVENTS, INCREMENTAL_JOB, WINDOW_TAG
from incremental_assets.lib.delta.log import filesystem_of
from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.sample.stream import STREAM_SCHEMA
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.state.hooks import LIVE
from incremental_assets.lib.state.run_log import PROCESSED, PROCESSING
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.sessions import ERASED_USER, user_id
from incremental_assets.lib.utc import utcnow
from tests.s3_server import BUCKET
from tests.dagster_processes import BIN, a_home, a_workspace, ticks, wait_for
from tests.warehouse_tables import COMPARED, REFERENCE_DAY, comparable_tables, scenario_environment

PARAMS = SampleParams(users=6, days=3, events_per_day=150, start_date=(utcnow() - timedelta(days=6)).date(), seed=41,
                      late_share=0.2)
# A day's window a run, and late rows left pending (deferred): the manifest's three counts all change.
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
    """Per day of the daily manifest: its three counts, its latest load and its longest delay."""
    rows = DeltaTable(f"{warehouse}/daily_aggregation_manifest").to_pyarrow_table().to_pylist()
    return {row["event_date"]: (row["processed_events"], row["pending_late_events"], row["late_events_total"],
                                row["max_load_tstamp"], row["max_delay_hours"]) for row in rows}


def load_again(spark, rows: pa.Table, person: str, source: str, ids: str = "") -> pa.Table:
    """A loader appends the person's events again, loaded a minute ago (event and session ids
    prefixed with `ids`: "" for the same events, else new ones at the same times, in sessions of
    their own); returns them. New events in the person's old sessions would depend on the stream's
    day: sessions are timed by load_tstamp, so an old session the new loads extend beyond
    max_session_days is quarantined and the new events dropped as beyond its cap."""
    theirs = rows.filter(pc.equal(rows.column("domain_userid"), person))
    now, count = utcnow() - timedelta(minutes=1), theirs.num_rows
    prefixed = {name: pc.binary_join_element_wise(pa.array([ids] * count), theirs.column(name), "")
                for name in ("event_id", "domain_sessionid")}
    replaced = {"load_tstamp": pa.array([now] * count, theirs.schema.field("load_tstamp").type),
                "load_date": pa.array([now.date()] * count, pa.date32()), **prefixed}
    for name, values in replaced.items():
        theirs = theirs.set_column(theirs.schema.get_field_index(name), name, values)
    write_events(spark, spark.createDataFrame(theirs, STREAM_SCHEMA), source, "append")
    return theirs


def settled(instance: DagsterInstance, since: float) -> bool:
    """No run in flight, and the requesting sensors have each looked twice since `since` and since
    the last run ended."""
    records = instance.get_run_records()
    if any(record.dagster_run.status in LIVE for record in records):
        return False
    last = max([since, *(record.end_time for record in records if record.end_time)])
    return all(sum(tick.timestamp > last for tick in ticks(instance, name)) >= 2
               for name in ("source_events_sensor", "attributes_after_daily_aggregates"))


def unreadable_before(warehouse: str, request_id: str, person: str, source: str | None = None) -> None:
    """At every version of each table (and the source, if given) before the erasure (before the
    oldest one its log holds, once a purge has cut it): its files or its commits are gone, or none
    holds the person's rows."""
    for table in (*HELD, *(["source"] if source else [])):
        uri = source if table == "source" else f"{warehouse}/{table}"
        history = DeltaTable(uri).history()
        erasing = next((h["version"] for h in history if h.get("userMetadata") == request_id), min(h["version"] for h in history))
        column = {"filtered_events": "user_identifier", "sessions": "user_identifier", "sessions_lifecycle_manifest": "user_identifier",
                  "source": "domain_userid"}.get(table, "attribute_key")
        for version in range(erasing):
            try:
                rows = DeltaTable(uri, version=version).to_pyarrow_table(columns=[column])
            except Exception as unreadable:  # noqa: BLE001 - deltalake names a missing file in its own error types
                assert any(gone in str(unreadable).lower() for gone in ("not found", "no such file", "no files in log segment")), unreadable
                continue
            assert person not in rows.column(column).to_pylist(), f"{table} version {version} still reads the person"


def logged(uri: str, person: str) -> list[str]:
    """The files of a table's log (commits, checkpoints, checksums) that name the person: the
    statistics of a file they added (a column's minimum or maximum), say."""
    filesystem, root = filesystem_of(uri)
    named = []
    for info in filesystem.get_file_info(pafs.FileSelector(f"{root}/_delta_log")):
        if info.type != pafs.FileType.File:
            continue
        if info.base_name.endswith(".parquet"):
            text = str(pq.read_table(info.path, filesystem=filesystem).to_pylist())
        else:
            with filesystem.open_input_stream(info.path) as stream:
                text = stream.read().decode(errors="replace")
        if person in text:
            named.append(info.base_name)
    return named


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


# The tables a day's deferred late events (min_rows_to_process) do not touch.
EVENT_TABLES = ("filtered_events", "sessions_lifecycle_manifest", "quarantined_sessions", "sessions")


@dataclass(frozen=True)
class Rebuilt:
    """The warehouse built without the person: its tables, daily manifest and the limits its days
    were recomputed through as built, then its tables and counts once every late event a day held
    pending has been applied (`settle`)."""

    warehouse: Path
    tables: dict
    counted: dict
    through: dict
    settled_tables: dict
    settled_counted: dict


def settle(warehouse, source, home) -> dict:
    """Apply every late event a day still holds pending: a backfill of every day the daily manifest
    holds (SPEC §7.2's one-off update). The manifest's counts after it."""
    days = sorted(days_counted(warehouse))
    with scenario_environment(warehouse, source, SETTINGS, home=home):
        if str(warehouse).startswith("s3"):  # the CLI: this session's Spark has no S3 file system
            backfill = subprocess.run([sys.executable, "-m", "incremental_assets", "backfill", "--start", str(days[0]), "--end",
                                       str(days[-1])], env=dict(os.environ), capture_output=True, text=True, timeout=900)
            assert backfill.returncode == 0, backfill.stdout[-3000:] + backfill.stderr[-3000:]
        else:
            run = run_days(IncrementalSettings(**SETTINGS), days[0], days[-1], instance=DagsterInstance.ephemeral())
            assert run.success, run.error
    counted = days_counted(warehouse)
    assert not any(pending for _, pending, *_ in counted.values())
    return counted


def rows_of(warehouse, table: str, keep) -> list[str]:
    """The rows of a table that `keep` keeps, comparable."""
    rows = DeltaTable(f"{warehouse}/{table}").to_pyarrow_table().to_pylist()
    return sorted(repr(sorted(row.items())) for row in rows if keep(row))


@pytest.fixture(scope="module")
def rebuilt(built) -> Rebuilt:
    _, _, base = built
    built_without, settled = base / "without", base / "without-settled"
    shutil.copytree(built_without, settled)
    settled_counted = settle(settled / "warehouse", settled / "source", settled / "home")
    return Rebuilt(built_without / "warehouse", comparable_tables(built_without / "warehouse"), days_counted(built_without / "warehouse"),
                   applied_through(built_without / "warehouse"), comparable_tables(settled / "warehouse"), settled_counted)


def applied_through(warehouse) -> dict:
    """Per day, the upper limit of the last incremental run that succeeded before the day was last
    recomputed: the day holds pending the late rows loaded after it."""
    windows, upper, through = {}, None, {}
    for row in StateStore(warehouse_root=str(warehouse)).run_log():
        if row["asset"] == FILTERED_EVENTS and row["status"] == PROCESSING:
            windows[row["run_id"]] = row["upper_limit"]
        elif row["asset"] == FILTERED_EVENTS and row["status"] == PROCESSED:
            upper = windows.get(row["run_id"], upper)
        elif row["asset"] == DAILY_AGGREGATES and row["status"] == PROCESSED and row["partition"]:
            through[datetime.fromisoformat(row["partition"]).date()] = upper
    return through


def assert_as_if_never_there(warehouse, source, home, person: str, rebuilt: Rebuilt) -> None:
    """SPEC §11: after `forget` the warehouse equals the one built without the person, but for what
    the person's events decided while they were there: which run recomputed a day. Their fresh
    events on a day made it be recomputed; and a run's window ends at the last event it read
    (SPEC §4), so where theirs was last, the runs after it read other windows, and a day's fresh
    rows may fall in another run. A day holds pending the late rows loaded after the last run before
    its last recompute, so its split of events into processed and pending may differ, never its
    total: more pending where that run ended earlier than the rebuild's, fewer where it ended later,
    the same where they ended alike. The days split alike hold the same aggregates, and the keys
    without a row on the others the same attributes; and once both have applied every pending event
    (a backfill), every table and count is the same."""
    tables, counted = comparable_tables(warehouse), days_counted(warehouse)
    assert person not in repr(tables)
    assert {t: tables[t] for t in EVENT_TABLES} == {t: rebuilt.tables[t] for t in EVENT_TABLES}
    assert set(counted) == set(rebuilt.counted)
    through = applied_through(warehouse)
    for day, (processed, pending, *late) in counted.items():
        processed_there, pending_there, *late_there = rebuilt.counted[day]
        assert (processed + pending, late) == (processed_there + pending_there, late_there), day
        ended, ended_there = through.get(day), rebuilt.through.get(day)
        if ended == ended_there:
            assert pending == pending_there, (day, ended)
        elif ended_there is None or (ended is not None and ended > ended_there):
            assert pending <= pending_there, (day, ended, ended_there)
        else:
            assert pending >= pending_there, (day, ended, ended_there)
    split_alike = {day for day in counted if counted[day][:2] == rebuilt.counted[day][:2]}

    def on_split_alike(row) -> bool:
        return row["event_date"] in split_alike

    assert rows_of(warehouse, "daily_aggregates", on_split_alike) == rows_of(rebuilt.warehouse, "daily_aggregates", on_split_alike)
    split_apart = {row["attribute_key"] for place in (warehouse, rebuilt.warehouse)
                   for row in DeltaTable(f"{place}/daily_aggregates").to_pyarrow_table(columns=["attribute_key", "event_date"]).to_pylist()
                   if row["event_date"] not in split_alike}

    def keys_alike(row) -> bool:
        return row["attribute_key"] not in split_apart

    for table in ("attributes", "attributes_history"):
        assert rows_of(warehouse, table, keys_alike) == rows_of(rebuilt.warehouse, table, keys_alike), table
    assert settle(warehouse, source, home) == rebuilt.settled_counted
    assert comparable_tables(warehouse) == rebuilt.settled_tables


def test_a_source_row_is_deleted_by_the_user_identifier_computed_from_it_and_the_commit_names_no_value(spark, tmp_path):
    """delete_rows with a derived key (a source's user identifier, the first non-blank of user_id and
    domain_userid): the person "zoe" is the row whose identifier is zoe, not every row with domain_userid zoe."""
    uri = str(tmp_path / "source")
    rows = [("u1", "zoe", 1), (" ", "zoe", 2), ("u2", "zoe", 3), (None, "d2", 4), (None, None, 5)]
    spark.createDataFrame(rows, "user_id string, domain_userid string, n int").write.format("delta").save(uri)
    identifier = user_id(IncrementalSettings(user_identifiers=["user_id", "domain_userid"]))
    person = spark.createDataFrame([("zoe",)], "user_identifier string")
    deleted = write.delete_rows(spark, uri, person, ["user_identifier"], user_metadata="erasure-test", derived={"user_identifier": identifier})
    left = sorted(row.n for row in spark.read.format("delta").load(uri).collect())
    [commit] = [h for h in DeltaTable(uri).history() if h.get("userMetadata") == "erasure-test"]
    assert (deleted, left) == (1, [1, 3, 4, 5])
    # Not hex: a commit's random ids (txnId) can hold a short hex string such as "d1" by chance
    assert "zoe" not in json.dumps(commit) and "domain_userid" in json.dumps(commit), commit


def test_a_delete_that_meets_a_loaders_append_is_tried_again_and_counts_its_own_commit(spark, tmp_path, monkeypatch):
    """A source's loader appends while an erasure deletes there (outside the lease): Delta refuses
    the delete's commit; it is tried again, deletes what the loader brought of the person too, and
    counts its own commit's rows, not the loader's next one. Any other failure is not tried again."""
    uri = str(tmp_path / "source")
    spark.createDataFrame([("zoe", 1), ("ann", 2), ("zoe", 3)], "user_identifier string, n int").write.format("delta").save(uri)
    person = spark.createDataFrame([("zoe",)], "user_identifier string")
    merged, calls = write._merged, []

    def loader_meanwhile(*args):
        calls.append(len(calls))
        write_deltalake(uri, pa.table({"user_identifier": ["zoe"], "n": [10 + len(calls)]}), mode="append")
        if len(calls) == 1:
            raise RuntimeError("[DELTA_CONCURRENT_APPEND] Files were added to partition [] by a concurrent update")
        result = merged(*args)
        write_deltalake(uri, pa.table({"user_identifier": ["ann"], "n": [99]}), mode="append")  # after its commit
        return result

    monkeypatch.setattr(write, "_merged", loader_meanwhile)
    monkeypatch.setattr(write.time, "sleep", lambda seconds: None)
    deleted = write.delete_rows(spark, uri, person, ["user_identifier"], user_metadata="erasure-retry")
    left = sorted(tuple(row) for row in spark.read.format("delta").load(uri).collect())
    assert (len(calls), deleted, left) == (2, 4, [("ann", 2), ("ann", 99)])

    monkeypatch.setattr(write, "_merged", lambda *args: (_ for _ in ()).throw(RuntimeError("DELTA_MISSING_DELTA_TABLE")))
    calls.clear()
    with pytest.raises(RuntimeError, match="DELTA_MISSING_DELTA_TABLE"):
        write.delete_rows(spark, uri, person, ["user_identifier"], user_metadata="erasure-other")


def test_a_forgotten_user_leaves_the_tables_of_a_stream_without_them(built, rebuilt, spark, tmp_path, capsys):
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
        theirs = load_again(spark, rows, person, str(tmp_path / "with" / "source"))
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
        # The same request again with --source, after it was recorded gone: it erases the source's
        # rows, and is gone again only once those files are.
        assert main(["forget", "--key", person, "--source"]) == 0
        assert main(["forget", "--status"]) == 0
        with_source = capsys.readouterr().out
        [reopened] = StateStore().erasure_log()

    assert reopened["request_id"] == request["request_id"] and reopened["physically_gone_at"] is None
    # the source held their events twice: as first loaded, and loaded again above
    assert json.loads(reopened["rows"])["source"] == 2 * theirs.num_rows and "  source " in with_source, with_source
    assert keyhole.success and keyhole.value("sessions_lifecycle_manifest", f"dropped_{ERASED_USER}") > 0
    account = keyhole.window
    assert account.balanced and account.counted.get(ERASED_USER), account.describe()  # as the terminal and the run log say
    # The same events loaded again are counted as the keyhole counted them: a malformed one (a null
    # event id, say) under the reason that comes before erasure, every other one as erased, and the
    # lookback's once more. Every late window accounts for every row it read.
    erased_again = sum(run.value("sessions_lifecycle_manifest", f"dropped_{ERASED_USER}", 0) for run in late)
    assert all(run.success for run in late) and erased_again >= keyhole.value("sessions_lifecycle_manifest", f"dropped_{ERASED_USER}")
    dropped = [{key: n for key, n in run.metadata.get("sessions_lifecycle_manifest", {}).items() if key.startswith("dropped_")}
               for run in late]
    assert sum(sum(reasons.values()) for reasons in dropped) >= theirs.num_rows, dropped
    assert all(run.window.balanced for run in late if run.window), [run.window.describe() for run in late if run.window]
    assert any(pending for _, pending, *_ in days_counted(tmp_path / "with" / "warehouse").values())  # deferred late events
    assert_as_if_never_there(tmp_path / "with" / "warehouse", tmp_path / "with" / "source", tmp_path / "with" / "home", person, rebuilt)
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
    assert "physically gone" in held_after and all(line.split()[-1] == "gone" for line in held_after.splitlines()
                                                   if line.startswith("  ")), held_after
    assert maintained.success and gone["physically_gone_at"] is not None
    unreadable_before(str(warehouse), request["request_id"], person)


def purged(spark, built, root, capsys, unread: bool = False) -> dict:
    """A copy of the warehouse with the person: `forget --key K --purge` (after a commit to
    filtered_events the daily manifest has not read, if `unread`); then the person's events loaded
    again, runs until caught up, `forget --purge` again and `forget --status`. What each said."""
    rows, person, base = built
    shutil.copytree(base / "with", root)
    said = {}
    with scenario_environment(root / "warehouse", root / "source", SETTINGS, home=root / "home"):
        if unread:
            DeltaTable(str(root / "warehouse" / "filtered_events")).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
        capsys.readouterr()
        for step, command in (("first", ["forget", "--key", person, "--purge"]), ("runs", None), ("again", ["forget", "--purge"]),
                              ("status", ["forget", "--status"])):
            if command is None:
                load_again(spark, rows, person, str(root / "source"), ids="new-")
                runs = run_until_caught_up(IncrementalSettings(**SETTINGS), report=lambda line: None, instance=DagsterInstance.ephemeral())
                said[step] = runs
                continue
            assert main(command) == 0
            said[step], said[f"{step}_log"] = capsys.readouterr().out, StateStore().erasure_log()
    return said


def test_a_purge_makes_the_erased_rows_unreadable_at_once_and_runs_read_on(built, rebuilt, spark, tmp_path, capsys):
    """forget --purge deletes at once the files that hold the erased rows, where maintenance_job
    waits for its retention: every earlier version is then unreadable for the person. The runs
    after it read on (the daily manifest had counted filtered_events up to the erasure, so its
    change feed needs none of those files) and leave the warehouse built without the person."""
    rows, person, base = built
    said = purged(spark, built, tmp_path / "with", capsys)
    [request] = said["first_log"]
    assert all(f"  {table:<28} " in said["first"] for table in HELD) and "not purged" not in said["first"], said["first"]
    assert f"Erasure {request['request_id']}: physically gone" in said["first"] and request["physically_gone_at"] is not None
    assert "physically gone" in said["status"] and "readable" not in said["status"], said["status"]
    assert all(f"  {table:<28} log cut at its current version" in said["first"] for table in HELD), said["first"]
    unreadable_before(str(tmp_path / "with" / "warehouse"), request["request_id"], person)
    assert {table: logged(str(tmp_path / "with" / "warehouse" / table), person) for table in HELD} == {table: [] for table in HELD}
    assert all(run.success for run in said["runs"]), [run.error for run in said["runs"]]
    assert_as_if_never_there(tmp_path / "with" / "warehouse", tmp_path / "with" / "source", tmp_path / "with" / "home", person, rebuilt)


def test_a_purge_leaves_filtered_events_until_the_daily_manifest_has_read_its_change_feed(built, spark, tmp_path, capsys):
    """While the daily manifest has not read a filtered_events commit made before the erasure, its
    next read takes the erasure's change data too: the purge leaves that table, says why, and the
    request is not gone; after a run, a purge deletes the rest and records it gone."""
    rows, person, base = built
    said = purged(spark, built, tmp_path / "with", capsys, unread=True)
    [waiting], [gone] = said["first_log"], said["again_log"]
    assert "filtered_events              not purged: the daily manifest has read" in said["first"], said["first"]
    assert all(f"  {table:<28} " in said["first"] for table in HELD) and waiting["physically_gone_at"] is None
    assert all(run.success for run in said["runs"]), [run.error for run in said["runs"]]
    assert "  filtered_events" in said["again"] and "not purged" not in said["again"], said["again"]
    assert f"Erasure {gone['request_id']}: physically gone" in said["again"] and gone["physically_gone_at"] is not None
    assert "physically gone" in said["status"] and "readable" not in said["status"], said["status"]
    assert "log cut" not in said["first"] and all(f"  {table:<28} log cut" in said["again"] for table in HELD), said
    unreadable_before(str(tmp_path / "with" / "warehouse"), gone["request_id"], person)
    assert {table: logged(str(tmp_path / "with" / "warehouse" / table), person) for table in HELD} == {table: [] for table in HELD}


def test_a_day_whose_only_events_were_forgotten_leaves_the_daily_manifest(built, tmp_path):
    """Everyone with events on the day fewest people were active (the first such) forgotten in one
    request: that day has no manifest row afterwards, as a warehouse built without their events has
    none (it kept a row of zero counts), and every day left is one that filtered_events holds rows of."""
    rows, person, base = built
    shutil.copytree(base / "with", tmp_path / "with")
    warehouse = tmp_path / "with" / "warehouse"
    events = DeltaTable(str(warehouse / "filtered_events")).to_pyarrow_table(columns=["event_date", "user_identifier"]).to_pylist()
    active = {}
    for row in events:
        active.setdefault(row["event_date"], set()).add(row["user_identifier"])
    day = min(active, key=lambda d: (len(active[d]), d))
    alone = sorted(active[day])
    assert day in days_counted(warehouse) and len(alone) < len({row["user_identifier"] for row in events})
    with scenario_environment(warehouse, tmp_path / "with" / "source", SETTINGS, home=tmp_path / "with" / "home"):
        assert main(["forget", "--by", "user_identifier", *(arg for user in alone for arg in ("--key", user))]) == 0
    held = {row["event_date"] for row in DeltaTable(str(warehouse / "filtered_events")).to_pyarrow_table(columns=["event_date"]).to_pylist()}
    assert day not in held and held and set(days_counted(warehouse)) == held, (day, held, days_counted(warehouse))


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


def test_a_forget_killed_half_way_is_finished_by_the_same_command(built, rebuilt, spark, tmp_path):
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
    after = {table: DeltaTable(str(warehouse / table)).to_pyarrow_table().num_rows for table in HELD}
    erased = json.loads(done["rows"])
    assert {table: erased[table] for table in HELD} == {table: before[table] - after[table] for table in HELD}, "each row counted once"
    assert_as_if_never_there(warehouse, tmp_path / "with" / "source", tmp_path / "with" / "home", person, rebuilt)


def test_a_forgotten_user_on_an_object_store_leaves_the_tables_of_a_stream_without_them(built, rebuilt, s3, tmp_path, capsys):
    """The same warehouse and its source in a bucket of moto's S3 server: `forget --source` as a
    command deletes the person's rows from the source too; `--status` reads there; once the
    source's owner has vacuumed it, `forget --purge` deletes the warehouse's files that held the
    rows and records the request gone; the maintenance job runs on; no earlier version of a table
    reads the person."""
    rows, person, base = built
    warehouse, source = f"s3a://{BUCKET}/erasure/warehouse", f"s3://{BUCKET}/erasure/source"
    for local, remote in ((base / "with" / "warehouse", warehouse), (base / "with" / "source", source)):
        filesystem, root = filesystem_of(remote)
        pafs.copy_files(str(local), root, destination_filesystem=filesystem)
    shutil.copytree(base / "with" / "home", tmp_path / "home")

    with scenario_environment(warehouse, source, SETTINGS, home=tmp_path / "home"):
        forgot = subprocess.run([sys.executable, "-m", "incremental_assets", "forget", "--key", person, "--source"],
                                env=dict(os.environ), capture_output=True, text=True, timeout=900)
        assert forgot.returncode == 0, forgot.stdout[-3000:] + forgot.stderr[-3000:]
        [request] = StateStore().erasure_log()
        status = subprocess.run([sys.executable, "-m", "incremental_assets", "forget", "--status"], env=dict(os.environ),
                                capture_output=True, text=True, timeout=300)
        # the source's owner vacuums it (every file no version needs); the warehouse is purged
        DeltaTable(source).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        purged = subprocess.run([sys.executable, "-m", "incremental_assets", "forget", "--purge"], env=dict(os.environ),
                                capture_output=True, text=True, timeout=600)
        assert purged.returncode == 0, purged.stdout[-3000:] + purged.stderr[-3000:]
        [gone] = StateStore().erasure_log()
        maintained = build_definitions(IncrementalSettings(**SETTINGS)).resolve_job_def("maintenance_job").execute_in_process(
            instance=DagsterInstance.ephemeral())
        capsys.readouterr()
        assert main(["forget", "--status"]) == 0
        after = capsys.readouterr().out

    assert all(f"{table:<28} " in status.stdout and "readable through time travel" in status.stdout for table in (*HELD, "source")), status
    assert "owner's to vacuum" in status.stdout, status.stdout
    left = DeltaTable(source).to_pyarrow_table(columns=["domain_userid"]).column(0).to_pylist()
    assert person not in left and len(left) == rows.num_rows - rows.column("domain_userid").to_pylist().count(person)
    assert json.loads(request["rows"])["source"] == rows.num_rows - len(left)
    assert all(f"  {table:<28} " in purged.stdout for table in HELD) and "not purged" not in purged.stdout, purged.stdout
    assert f"Erasure {request['request_id']}: physically gone" in purged.stdout and gone["physically_gone_at"] is not None
    assert maintained.success and "physically gone" in after and "readable" not in after, after
    assert request["status"] == "Processed" and all(json.loads(request["rows"])[table] > 0 for table in HELD), request
    assert person not in json.dumps(DeltaTable(f"{warehouse}/erasure_log").to_pyarrow_table().to_pylist(), default=str)
    unreadable_before(warehouse, request["request_id"], person, source)
    assert {table: logged(f"{warehouse}/{table}", person) for table in HELD} == {table: [] for table in HELD}
    assert_as_if_never_there(warehouse, source, tmp_path / "home", person, rebuilt)


def test_a_person_forgotten_while_the_daemons_sensors_run_is_erased_from_what_their_runs_stored(built, rebuilt, spark, tmp_path):
    """The daemon left alone with its sensors (every 5 s): a loader brings new events of the person;
    while the sensors' run of that load executes, forget_job is launched as the UI's launchpad
    launches it, with a purge. It queues behind the run (the warehouse's pool), erases what that run
    stored and vacuums the files that held the person's rows; whatever the sensors launch after it
    leaves the warehouse built without the person."""
    rows, person, base = built
    shutil.copytree(base / "with", tmp_path / "with")
    home, workspace = a_home(tmp_path), a_workspace(tmp_path)
    settings = {**SETTINGS, "sensor_interval_seconds": 5}
    with scenario_environment(tmp_path / "with" / "warehouse", tmp_path / "with" / "source", settings, home):
        instance = DagsterInstance.get()
        daemon = subprocess.Popen([BIN / "dagster-daemon", "run", "-w", workspace], env=dict(os.environ), cwd=tmp_path,
                                  stdout=open(tmp_path / "daemon.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # Whatever the sensors make of the copied warehouse first (time has passed since it was built).
            started = time.time()
            wait_for("the sensors to have nothing to launch", lambda: settled(instance, started), 600)
            loaded_at = load_again(spark, rows, person, str(tmp_path / "with" / "source"), ids="new-")["load_tstamp"][0].as_py().replace(tzinfo=None)

            def storing_the_load():  # the first run's window may end before the load (a window is a day at most here)
                started = instance.get_runs(RunsFilter(job_name=INCREMENTAL_JOB, statuses=[DagsterRunStatus.STARTED]))
                return next((run for run in started  # a run is tagged with its window once it has planned it
                             if WINDOW_TAG in run.tags and datetime.fromisoformat(run.tags[WINDOW_TAG].split("..")[1]) >= loaded_at), None)

            load = wait_for("the sensors' run of the load to start", storing_the_load, 600)
            config = {"ops": {"forget_keys": {"config": {"keys": [person], "purge": True}}}}
            launched = subprocess.run([BIN / "dagster", "job", "launch", "-w", workspace, "-j", "forget_job", "--config-json",
                                       json.dumps(config)], env=dict(os.environ), cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
            [forget], launched_at = instance.get_runs(RunsFilter(job_name="forget_job")), time.time()
            wait_for("forget_job, then every run the sensors launch after it", lambda: settled(instance, launched_at), 900)
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(60)
        runs = instance.get_run_records()
        [request] = StateStore().erasure_log()
        stored_then = json.loads(request["rows"])

    logs = (tmp_path / "daemon.log").read_text()[-3000:]
    assert all(r.dagster_run.status == DagsterRunStatus.SUCCESS for r in runs), logs
    [load_record] = [r for r in runs if r.dagster_run.run_id == load.run_id]
    [forget_record] = [r for r in runs if r.dagster_run.run_id == forget.run_id]
    assert forget_record.start_time >= load_record.end_time, "forget_job waited for the run in flight"
    assert request["physically_gone_at"] is not None, "purged with the request: the later runs needed none of the files"
    stored = DeltaTable(str(base / "with" / "warehouse" / "filtered_events")).to_pyarrow_table(columns=["user_identifier"])
    assert stored_then["filtered_events"] > pc.sum(pc.equal(stored.column(0), person)).as_py(), "and the person's new events"
    assert_as_if_never_there(tmp_path / "with" / "warehouse", tmp_path / "with" / "source", home, person, rebuilt)
