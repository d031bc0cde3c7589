"""Damaged state: a table whose last commit a crash cut off (or garbled, or emptied), or whose data
file is gone, fails every command with one `error:` line naming the table, the file and the way
back, exit status 2 and no traceback on the terminal; Dagster steps fail with the same line.
Following the advice makes the command work again. The warehouse is written without a JVM: the
state store's own writes, and a source of two loads."""

import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from incremental_assets.cli import main
from incremental_assets.cli.runner import incremental_of
from incremental_assets.lib.catalog import ATOMIC_EVENTS, DAILY_MANIFEST, FINGERPRINTS, INCREMENTAL_MANIFEST, RUN_LOG
from incremental_assets.lib.delta.log import UnreadableTableError
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import REQUIRED_COLUMNS
from incremental_assets.lib.state.settings_plan import current_fingerprints
from incremental_assets.lib.state.records import DayStatus, ManifestEntry
from incremental_assets.lib.state.run_log import PROCESSED
from incremental_assets.lib.state.store import StateStore

T0 = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)
START_DATE = T0.date().isoformat()


def _source_load(uri: str, ids: range) -> None:
    schema = pa.schema({name: pa.timestamp("us", "UTC") if name.endswith("tstamp") else pa.string() for name in REQUIRED_COLUMNS})
    rows = [{**{name: T0 + timedelta(minutes=i) for name in schema.names if name.endswith("tstamp")},
             "event_id": f"e{i}", "app_id": "website", "event_name": "page_view", "domain_sessionid": "s1",
             "domain_userid": "u1"} for i in ids]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema), mode="append")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A warehouse whose state tables and source each hold two commits or more."""
    root = tmp_path_factory.mktemp("damaged") / "warehouse"
    state, settings = StateStore(warehouse_root=str(root)), IncrementalSettings(start_date=START_DATE)
    for model in ("filtered_events", "sessions"):
        state.save_entry(ManifestEntry(model, last_success=T0, last_upper=T0, first_success=T0), "first-run")
    for day in (T0.date(), T0.date() + timedelta(days=1)):
        state.save_days([DayStatus(day, processed_events=3, status="processed")], consumed_version=0)
    fingerprints = current_fingerprints(settings, incremental_of(settings))
    for _ in range(2):
        state.record_fingerprints(fingerprints, "first-run")
    state.acquire("first-run", ["filtered_events"], None, alive=lambda record: True)
    state.record("first-run", "filtered_events", PROCESSED, {})
    _source_load(state.uri(ATOMIC_EVENTS), range(3))
    _source_load(state.uri(ATOMIC_EVENTS), range(3, 6))
    return root


@pytest.fixture
def warehouse(built, tmp_path, monkeypatch) -> Path:
    """A copy of the built warehouse for one test to damage."""
    root = tmp_path / "warehouse"
    shutil.copytree(built, root)
    monkeypatch.setenv("INCREMENTAL_ASSETS_WAREHOUSE", str(root))
    monkeypatch.setenv("INCREMENTAL_ASSETS_START_DATE", START_DATE)
    monkeypatch.delenv("INCREMENTAL_ASSETS_SOURCE", raising=False)
    return root


def last_commit(table: Path) -> Path:
    return sorted((table / "_delta_log").glob("*.json"))[-1]


def cut_off(table: Path) -> Path:
    """The last commit file as a crash mid-write leaves it: its first half."""
    commit = last_commit(table)
    commit.write_bytes(commit.read_bytes()[: commit.stat().st_size // 2])
    return commit


def one_error_line(capsys, argv: list[str]) -> str:
    """The command's `error:` line, after checking it exits 2 and prints that line alone, no traceback."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "error:" not in out and "Traceback" not in out + err
    return err


def follow(line: str) -> None:
    """Do what the line says: move the damaged file to where it names."""
    damaged, destination = re.search(r"its last commit (\S+) is damaged .* \(e\.g\. to (\S+)\)", line).groups()
    os.rename(damaged, destination)


@pytest.mark.parametrize(
    "table, argv",
    [
        (INCREMENTAL_MANIFEST, ["preview"]),
        (DAILY_MANIFEST, ["preview"]),
        (FINGERPRINTS, ["plan"]),
        (RUN_LOG, ["show", RUN_LOG]),
        (ATOMIC_EVENTS, ["show", ATOMIC_EVENTS]),
    ],
    ids=[INCREMENTAL_MANIFEST, DAILY_MANIFEST, FINGERPRINTS, RUN_LOG, "source"],
)
def test_a_cut_off_last_commit_is_named_with_the_way_back_and_following_it_works(warehouse, capsys, table, argv):
    version = DeltaTable(str(warehouse / table)).version()
    commit = cut_off(warehouse / table)
    line = one_error_line(capsys, argv)
    assert f"The Delta table at {warehouse / table} cannot be read: its last commit {commit} is damaged" in line
    assert f"return the table to version {version - 1}" in line and "every run is idempotent" in line

    follow(line)
    assert main(argv) == 0
    assert DeltaTable(str(warehouse / table)).version() == version - 1


def _garbled(table: Path) -> None:
    last_commit(table).write_bytes(bytes(range(7, 250)))


def _emptied(table: Path) -> None:
    last_commit(table).write_text("")  # a crash before the file's data reached the disk


def _not_delta(table: Path) -> None:
    last_commit(table).write_text('{"hello": "world"}\n')


def _first_commit_cut_off(table: Path) -> None:
    last_commit(table).unlink()
    cut_off(table)


def _data_file_gone(table: Path) -> None:
    os.remove(DeltaTable(str(table)).file_uris()[0])


def _move_the_table_aside(line: str) -> None:
    os.rename(*re.search(r"its last commit (\S+)/_delta_log/\S+ is damaged .* \(e\.g\. to (\S+)\)", line).groups())


def _repair(line: str) -> None:
    subprocess.run([sys.executable, "-c", re.search(r'python -c "(.*)"', line).group(1)], check=True)


REPAIR = "Put back a good copy (from a backup); or, losing its rows, move it aside and drop it from the table"


@pytest.mark.parametrize(
    "table, damage, named, way_back, fix",
    [
        (INCREMENTAL_MANIFEST, _garbled, "is damaged (not JSON", "to return the table to version 0", follow),
        (INCREMENTAL_MANIFEST, _emptied, "is damaged (no Delta action in it)", "to return the table to version 0", follow),
        (INCREMENTAL_MANIFEST, _not_delta, "is damaged (no Delta action in it)", "to return the table to version 0", follow),
        (INCREMENTAL_MANIFEST, _first_commit_cut_off, "is damaged (not JSON",
         "It is the table's first commit: move the table aside", _move_the_table_aside),
        (INCREMENTAL_MANIFEST, _data_file_gone, "is missing or damaged", REPAIR, _repair),
        (ATOMIC_EVENTS, _data_file_gone, "is missing or damaged", REPAIR, _repair),
    ],
    ids=["garbled", "emptied", "not a Delta log", "first commit cut off", "data file gone", "source data file gone"],
)
def test_each_kind_of_damage_is_named_with_its_way_back(warehouse, capsys, table, damage, named, way_back, fix):
    damage(warehouse / table)
    line = one_error_line(capsys, ["preview"])
    assert f"The Delta table at {warehouse / table} cannot be read: its " in line
    assert named in line and way_back in line
    fix(line)
    assert main(["preview"]) == 0


def test_a_run_fails_its_step_with_the_line_the_read_layer_raises(warehouse, capsys):
    """The step reading the manifest (new_event_limits, before any Spark) fails with the message
    the state store raises; the command prints it in its one `error:` line."""
    cut_off(warehouse / INCREMENTAL_MANIFEST)
    with pytest.raises(UnreadableTableError) as raised:
        StateStore().entries()
    assert main(["run"]) == 2
    out, err = capsys.readouterr()
    assert f"failed in new_event_limits: {raised.value}\n" in out
    assert err.startswith("error: run ") and f" failed in new_event_limits: {raised.value} (the run's events: " in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["preview", "run"])
def test_the_process_exits_2_and_shows_no_rust_backtrace_even_when_asked_for_one(warehouse, command):
    """RUST_BACKTRACE makes deltalake's errors carry a backtrace: it stays in the log file."""
    cut_off(warehouse / INCREMENTAL_MANIFEST)
    environ = {**os.environ, "RUST_BACKTRACE": "1", "SPARK_MASTER": "no-such-master://spark-must-not-start"}
    result = subprocess.run([sys.executable, "-m", "incremental_assets", command], capture_output=True, text=True,
                            timeout=300, env=environ)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert "last commit" in result.stderr and "<unknown>" not in result.stdout + result.stderr
