"""Whole runs through both write engines: a source whose events carry no app (the public Snowplow
export that crashed every daily run: each key's distinct_apps an empty list) leaves the same
tables by deltalake's small writes as with every write through Spark; and a failure inside either
engine names the step and the table, on the terminal and in the run log, and the next run
finishes the work."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from incremental_assets.cli import main
from incremental_assets.lib.catalog import DAILY_AGGREGATES
from incremental_assets.lib.environment import WRITE_ENGINE_ENV
from incremental_assets.lib.source.contract import REQUIRED_COLUMNS
from incremental_assets.lib.state.run_log import FAILED
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow
from tests.warehouse_tables import comparable_tables, scenario_environment

T0 = (utcnow() - timedelta(days=4)).replace(hour=8, minute=0, second=0, microsecond=0, tzinfo=timezone.utc)
SETTINGS = {"start_date": T0.date().isoformat()}
FIRST_DAY = f"event_date={T0.date().isoformat()}"


@pytest.fixture(scope="module")
def no_app_source(tmp_path_factory) -> str:
    """Three users over two days, every event without an app_id, page views and pings."""
    uri = str(tmp_path_factory.mktemp("no-app") / "source")
    schema = pa.schema({name: pa.timestamp("us", "UTC") if name.endswith("tstamp") else pa.string() for name in REQUIRED_COLUMNS})
    rows = []
    for i in range(36):
        at = T0 + timedelta(days=i % 2, hours=i % 3, minutes=i)
        rows.append({**{name: at for name in schema.names if name.endswith("tstamp")}, "load_tstamp": at + timedelta(minutes=5),
                     "event_id": f"e{i}", "app_id": None, "event_name": "page_view" if i % 4 else "page_ping",
                     "domain_sessionid": f"s{i % 3}-{i % 2}", "domain_userid": f"u{i % 3}"})
    write_deltalake(uri, pa.Table.from_pylist(rows, schema), mode="append")
    return uri


def run_through(source: str, root: Path, engine: str | None, capsys=None) -> int:
    with scenario_environment(root / "warehouse", source, SETTINGS, home=root / "home"):
        os.environ.pop(WRITE_ENGINE_ENV, None)
        if engine:
            os.environ[WRITE_ENGINE_ENV] = engine
        try:
            return main(["run", "--until-caught-up"])
        finally:
            os.environ.pop(WRITE_ENGINE_ENV, None)


def test_lists_all_empty_leave_the_same_tables_by_either_engine(spark, no_app_source, tmp_path):
    assert run_through(no_app_source, tmp_path / "auto", None) == 0
    assert run_through(no_app_source, tmp_path / "spark", "spark") == 0
    auto, by_spark = comparable_tables(tmp_path / "auto" / "warehouse"), comparable_tables(tmp_path / "spark" / "warehouse")
    assert auto == by_spark
    assert auto["daily_aggregates"] and all([] in row for row in auto["daily_aggregates"])  # distinct_apps: empty


def test_the_engine_switch_refuses_a_value_it_does_not_know(no_app_source, tmp_path, capsys):
    assert run_through(no_app_source, tmp_path, "duckdb") == 2
    assert f"{WRITE_ENGINE_ENV}='duckdb': expected one of auto, spark" in capsys.readouterr().err


@pytest.mark.parametrize("engine, inside", [(None, "deltalake"), ("spark", "the JVM")])
def test_a_failure_inside_an_engine_names_the_step_and_the_table_and_the_next_run_finishes(
        spark, no_app_source, tmp_path, capsys, engine, inside):
    """A file where daily_aggregates' first day directory goes: deltalake's object store (Rust) or
    Spark's Hadoop file system (JVM) fails to write it."""
    table = tmp_path / "warehouse" / DAILY_AGGREGATES
    table.mkdir(parents=True)
    (table / FIRST_DAY).write_text("in the way")
    capsys.readouterr()
    assert run_through(no_app_source, tmp_path, engine) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run ") and len(err.splitlines()) == 1, err
    assert f" failed in daily_aggregates (writing {table}): " in err and ": None" not in err, err
    with scenario_environment(tmp_path / "warehouse", no_app_source, SETTINGS, home=tmp_path / "home"):
        failed = [r for r in StateStore().run_log() if r["status"] == FAILED and r["asset"] == DAILY_AGGREGATES]
    assert failed and failed[0]["message"].startswith(f"failed in daily_aggregates (writing {table}): "), failed
    (table / FIRST_DAY).unlink()
    assert run_through(no_app_source, tmp_path, engine) == 0
    assert run_through(no_app_source, tmp_path / "reference", engine) == 0
    assert comparable_tables(tmp_path / "warehouse") == comparable_tables(tmp_path / "reference" / "warehouse")


PANICS = """
import sys
from incremental_assets import cli
from incremental_assets.lib.delta import arrow
arrow.whole_offsets = lambda rows: rows  # the repair undone: deltalake panics on the empty lists
cli.entry()
"""


def test_a_panic_inside_deltalake_is_one_line_on_the_terminal_and_its_backtrace_in_the_log(no_app_source, tmp_path):
    with scenario_environment(tmp_path / "warehouse", no_app_source, SETTINGS, home=tmp_path / "home"):
        environ = {**os.environ, "RUST_BACKTRACE": "1"}
        environ.pop(WRITE_ENGINE_ENV, None)
    result = subprocess.run([sys.executable, "-c", PANICS, "run", "--until-caught-up"], capture_output=True, text=True,
                            env=environ, timeout=600)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr.startswith("error: run ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert " failed in daily_aggregates (writing " in result.stderr and "panicked with message" in result.stderr
    assert "stack backtrace" not in result.stdout + result.stderr
    log = (tmp_path / "home" / "logs" / "incremental-assets.log").read_text()
    assert "panicked at" in log and "stack backtrace" in log, result.stderr
