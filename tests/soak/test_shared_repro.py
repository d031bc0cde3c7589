"""The warehouse whose daily run crashed inside deltalake on a public Snowplow export
(../shared/repro/daily-write-panic/, beside the checkout): its README's command succeeds ten
times, each on a new copy, and every table then equals the one a run leaves with every write
through Spark (INCREMENTAL_ASSETS_WRITE_ENGINE=spark), and reads the same through the checks'
small path as through Spark's Delta reader. Its tables' rows, as Python values, make the same
frames from Arrow (lib/delta/arrow.from_rows) as Spark makes of them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from incremental_assets.cli import main
from incremental_assets.lib.delta.arrow import from_rows
from incremental_assets.lib.environment import WRITE_ENGINE_ENV
from tests.warehouse_tables import batch_scan, comparable_tables, found_alike_by_checks, read_alike_by_checks, run_accounts, scenario_environment

REPRO = Path(__file__).resolve().parents[3] / "shared" / "repro" / "daily-write-panic"
TRIES = 10
CLIENT_SESSION = "contexts_com_snowplowanalytics_snowplow_client_session_1_0_0"
SETTINGS = [
    "start_date=2020-07-03", "session_timestamp=collector_tstamp", "lookback_window_hours=6", "max_session_days=3",
    "days_late_allowed=3", "allow_null_dvce_tstamps=true", "backfill_limit_days=243",
    f"session_identifier_sql=coalesce(get_json_object({CLIENT_SESSION}, '$[0].sessionId'), domain_sessionid)",
    f"user_identifier_sql=coalesce(get_json_object({CLIENT_SESSION}, '$[0].userId'), domain_userid)",
]
# Records of the runs themselves, not of the data: who ran, when, under which id.
RUN_RECORDS = {"run_log", "new_event_limits", "table_fingerprints"}
RUN_COLUMNS = {"run_id", "last_run_id", "updated_at", "last_processed_at", "quarantined_at"}


def writable_copy(table: Path, to: Path) -> None:
    shutil.copytree(table, to)
    for path in to.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)  # shared/ comes without write bits


def run_on_a_copy(root: Path, engine: str | None) -> dict[str, list]:
    writable_copy(REPRO / "warehouse", root / "wh")
    environ = {**os.environ, "DAGSTER_HOME": str(root / "dh"), "INCREMENTAL_ASSETS_WAREHOUSE": str(root / "wh"),
               "INCREMENTAL_ASSETS_SOURCE": str(root / "wh" / "atomic_events")}
    environ.pop(WRITE_ENGINE_ENV, None)
    if engine:
        environ[WRITE_ENGINE_ENV] = engine
    command = [sys.executable, "-m", "incremental_assets", "run", *[part for s in SETTINGS for part in ("--set", s)]]
    result = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return every_table(root / "wh")


def every_table(warehouse: Path) -> dict[str, list]:
    tables = {}
    for table in sorted(p for p in warehouse.iterdir() if (p / "_delta_log").is_dir() and p.name not in RUN_RECORDS):
        rows = DeltaTable(str(table)).to_pyarrow_table()
        columns = sorted(c for c in rows.column_names if c not in RUN_COLUMNS)
        tables[table.name] = sorted(repr(tuple(row[c] for c in columns)) for row in rows.select(columns).to_pylist())
    return tables


@pytest.mark.skipif(not REPRO.is_dir(), reason=f"{REPRO} is not beside this checkout")
def test_the_crashing_export_runs_ten_times_and_leaves_what_spark_alone_leaves(spark, tmp_path):
    by_spark = run_on_a_copy(tmp_path / "spark", "spark")
    assert by_spark["daily_aggregates"] and by_spark["attributes_history"]
    read_alike_by_checks(spark, tmp_path / "spark" / "wh")
    found_alike_by_checks(spark, tmp_path / "spark" / "wh")
    for attempt in range(TRIES):
        assert run_on_a_copy(tmp_path / f"try-{attempt}", None) == by_spark, f"try {attempt + 1}"


@pytest.mark.skipif(not REPRO.is_dir(), reason=f"{REPRO} is not beside this checkout")
def test_the_exports_tables_as_python_rows_make_the_frames_spark_makes_of_them(spark):
    """Wide rows, JSON contexts, 2020 times, null device times: real values, not the generator's."""
    tables = [p for p in sorted((REPRO / "warehouse").iterdir()) if (p / "_delta_log").is_dir()]
    for table in tables:
        stored = spark.read.format("delta").load(str(table))
        rows = [tuple(row) for row in stored.collect()]
        made, expected = from_rows(spark, rows, stored.schema), spark.createDataFrame(rows, stored.schema)
        assert made.schema == expected.schema == stored.schema, table.name
        as_tuples = lambda frame: sorted(repr(tuple(row)) for row in frame.collect())  # noqa: E731
        assert as_tuples(made) == as_tuples(expected) == sorted(map(repr, rows)), table.name


@pytest.mark.skipif(not REPRO.is_dir(), reason=f"{REPRO} is not beside this checkout")
def test_the_export_a_day_a_run_leaves_the_same_whether_the_batch_scans_its_sessions_rows_or_every_row(spark, tmp_path):
    """From scratch over the export's own events, a day per run: the batch's scan narrowed to the
    run's sessions and window (sessions of up to three days, late rows) against the scan of every
    row of the sessions' span. The same tables, the same counts, and the narrowing left rows out."""
    settings = [s for s in SETTINGS if not s.startswith("backfill_limit_days=")] + ["backfill_limit_days=1"]
    left = {}
    for narrowed in (True, False):
        root = tmp_path / ("narrowed" if narrowed else "every-row")
        writable_copy(REPRO / "warehouse" / "atomic_events", root / "source")
        with scenario_environment(root / "wh", root / "source", {}, home=root / "dh"), batch_scan(narrowed) as narrowings:
            assert main(["run", "--until-caught-up", *[part for s in settings for part in ("--set", s)]]) == 0
        if narrowed:
            assert any(kept < scanned for scanned, kept in narrowings), narrowings
        left[narrowed] = comparable_tables(root / "wh"), run_accounts(root / "wh")
    assert left[True][0]["filtered_events"] and left[True][0]["sessions"]
    assert left[True] == left[False]
