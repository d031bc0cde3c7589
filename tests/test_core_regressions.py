"""Regression tests for defects users found: each fails on the code before its fix.

One shared scenario runs the pipeline the way a user with a real export would: events from an
older loader (null load_tstamp) read with the collector_tstamp cursor, a stream whose last event
is ten months old, caught up with `--until-caught-up`, then run again and again with nothing new.
"""

import os
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets import delta_tables, environment
from incremental_assets.atomic_events import SAMPLE_SCHEMA
from incremental_assets.loader import write_events
from incremental_assets.resources.manifests import DAILY_MANIFEST, ManifestResource
from incremental_assets.runner import run_incremental, run_until_caught_up
from incremental_assets.sample.generator import SampleParams
from incremental_assets.sample.stream import append_hours, events_frame, generate_stream
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms import sessions as sessions_transforms
from incremental_assets.utc import utcnow

STREAM_START = (utcnow() - timedelta(days=300)).replace(hour=0, minute=0, second=0, microsecond=0)
LOAD_TSTAMP = SAMPLE_SCHEMA.fieldNames().index("load_tstamp")


def export_rows() -> list[tuple]:
    """Two days of page views by four users, two sessions a day each; every other event comes
    from an older loader that wrote no load_tstamp (and so no load_date)."""
    rows = []
    for day in range(2):
        for user in range(4):
            for session in range(2):
                start = STREAM_START + timedelta(days=day, hours=8 + 6 * session, minutes=user)
                for hit in range(3):
                    collector = start + timedelta(minutes=hit)
                    loaded = collector + timedelta(minutes=2)
                    values = {
                        "event_id": f"e-{day}-{user}-{session}-{hit}", "app_id": "website", "event_name": "page_view",
                        "collector_tstamp": collector, "dvce_created_tstamp": collector - timedelta(seconds=2),
                        "dvce_sent_tstamp": collector - timedelta(seconds=1), "derived_tstamp": collector,
                        "load_tstamp": loaded, "domain_sessionid": f"s-{day}-{user}-{session}",
                        "domain_userid": f"u-{user}", "page_url": f"/page/{hit}",
                    }
                    old_loader = hit % 2 == 1
                    row = [values.get(name) for name in SAMPLE_SCHEMA.fieldNames()] + [loaded.date()]
                    if old_loader:
                        row[LOAD_TSTAMP] = row[-1] = None
                    rows.append(tuple(row))
    return rows


EXPORT = export_rows()
SETTINGS = IncrementalSettings(start_date=STREAM_START.date().isoformat(), session_timestamp="collector_tstamp")


@pytest.fixture(scope="module")
def quiet_stream(spark, tmp_path_factory):
    """The whole scenario, run once: catch-up, then three runs with nothing new."""
    root = tmp_path_factory.mktemp("quiet")
    saved = {name: os.environ.get(name) for name in ("INCREMENTAL_ASSETS_WAREHOUSE", "INCREMENTAL_ASSETS_SOURCE")}
    os.environ["INCREMENTAL_ASSETS_WAREHOUSE"] = str(root / "warehouse")
    os.environ["INCREMENTAL_ASSETS_SOURCE"] = str(root / "export")
    write_events(spark, events_frame(spark, EXPORT), str(root / "export"), "append")
    instance = DagsterInstance.ephemeral()
    catch_up = run_until_caught_up(SETTINGS, report=lambda line: None, instance=instance)
    positions = [ManifestResource().entries()["filtered_events"].position]
    quiet = []
    for _ in range(3):
        quiet.append(run_incremental(SETTINGS, instance=instance))
        positions.append(ManifestResource().entries()["filtered_events"].position)
    stored = {r.event_id for r in delta_tables.read_table(spark, f"{root}/warehouse/filtered_events").collect()}
    assert delta_tables.read_table(spark, f"{root}/warehouse/events_this_run").count() == 0, "scratch holds this run only"
    yield catch_up, quiet, positions, stored
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def test_events_with_null_load_tstamp_are_processed_with_the_collector_cursor(quiet_stream):
    *_, stored = quiet_stream
    assert sum(1 for row in EXPORT if row[LOAD_TSTAMP] is None) == len(EXPORT) // 3
    assert stored == {row[0] for row in EXPORT}


def test_catch_up_on_a_stream_that_ended_months_ago_stops_once_every_event_was_in_a_window(quiet_stream):
    catch_up, *_ = quiet_stream
    assert len(catch_up) <= 3 and all(s.success for s in catch_up)
    assert catch_up[-1].caught_up


def test_quiet_hours_are_successful_runs_that_say_so_and_move_the_manifest(quiet_stream):
    _, quiet, positions, _ = quiet_stream
    assert [s.success for s in quiet] == [True, True, True]
    for summary in quiet:
        assert summary.value("filtered_events", "rows_inserted", 0) == 0
        assert "no new events" in summary.describe()
    assert positions == sorted(positions) and positions[-1] > positions[0], "each empty window moves it on"


def _age_log(uri: str, days: int) -> None:
    """Make every commit file look `days` old: Delta's log cleanup goes by file time."""
    past = time.time() - days * 86_400
    for entry in Path(uri, "_delta_log").glob("*.json"):
        os.utime(entry, (past, past))


def _clean_up_log(uri: str) -> None:
    """What Delta does after a checkpoint once delta.logRetentionDuration has passed."""
    table = DeltaTable(uri)
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 1 hour"}, raise_if_not_exists=False)
    table = DeltaTable(uri)
    table.create_checkpoint()
    _age_log(uri, 2)
    table.cleanup_metadata()


def test_the_daily_layer_counts_every_insert_once_after_delta_log_cleanup(spark, warehouse):
    params = SampleParams(users=6, days=3, events_per_day=150, start_date=date(2024, 3, 1), seed=5, late_share=0.2)
    chosen = IncrementalSettings(start_date="2024-03-01", reprocess_days=30, min_rows_to_process=1)
    source = environment.table_uri(environment.SAMPLE_TABLE)
    generate_stream(spark, source, params, hours=36)
    instance = DagsterInstance.ephemeral()
    assert run_incremental(chosen, now="2024-03-02T12:00:00", instance=instance).success
    manifest = ManifestResource()
    consumed = manifest.consumed_version()
    daily_uri = manifest.uri(DAILY_MANIFEST)

    _clean_up_log(daily_uri)
    assert not Path(daily_uri, "_delta_log", f"{0:020}.json").exists(), "the first commits are gone"
    assert manifest.consumed_version() == consumed, "the consumed version outlives log cleanup"

    append_hours(spark, source, 36)
    assert run_incremental(chosen, now="2024-03-04T00:00:00", instance=instance).success
    per_day = {r.event_date: r["count"] for r in delta_tables.read_table(spark, f"{warehouse}/filtered_events").groupBy("event_date").count().collect()}
    days = manifest.days()
    assert {d: s.processed_events + s.pending_late_events for d, s in days.items()} == per_day
    assert {s.status for s in days.values()} == {"processed"}


def test_the_command_line_exits_with_its_own_status_whatever_python_teardown_does(tmp_path):
    """A native thread pool aborting during interpreter teardown must not turn success into failure."""
    DeltaTable.create(str(tmp_path / "t"), schema=_tiny_schema())
    script = (
        "import atexit, os, sys\n"
        "atexit.register(os.abort)  # stands in for a native pool that aborts at teardown\n"
        "from incremental_assets.cli import entry\n"
        "sys.argv = ['incremental-assets', 'show', sys.argv[1]]\n"
        "entry()\n"
    )
    env = {**os.environ, "INCREMENTAL_ASSETS_WAREHOUSE": str(tmp_path)}
    ok = subprocess.run([sys.executable, "-c", script, "t"], env=env, capture_output=True, text=True, timeout=120)
    missing = subprocess.run([sys.executable, "-c", script, "nope"], env=env, capture_output=True, text=True, timeout=120)
    assert (ok.returncode, missing.returncode) == (0, 2), ok.stderr + missing.stderr


def _tiny_schema():
    import pyarrow as pa

    return pa.schema([("id", pa.int64())])


def test_definitions_load_against_a_missing_warehouse_and_read_nothing(tmp_path):
    script = (
        "import deltalake, pyspark.sql\n"
        "def refuse(*a, **k): raise AssertionError('loading the definitions read storage')\n"
        "deltalake.DeltaTable.__init__ = refuse\n"
        "pyspark.sql.SparkSession.Builder.getOrCreate = refuse\n"
        "from incremental_assets.definitions import defs\n"
        "from incremental_assets.names import DAILY_AGGREGATES\n"
        "for job in ('incremental_job', 'daily_job'): defs.resolve_job_def(job)\n"
        "daily = defs.resolve_assets_def(DAILY_AGGREGATES)\n"
        "print(daily.partitions_def.start.date())\n"
    )
    missing = tmp_path / "no" / "such" / "warehouse"
    env = {
        **os.environ, "INCREMENTAL_ASSETS_WAREHOUSE": str(missing), "INCREMENTAL_ASSETS_SOURCE": str(missing / "src"),
        "INCREMENTAL_ASSETS_START_DATE": "2023-05-01", "INCREMENTAL_ASSETS_CONFIG": os.devnull,
    }
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "2023-05-01", "the first day comes from the settings"
    assert not missing.exists()


WRITE_CALLS = ("write_deltalake(", ".merge(", "delta_tables.write(", ".write.format(", "create_with_change_feed(")
# The one writer of each table: the IO manager (every asset table), the manifest resource (both
# manifests); delta_tables.py holds the write primitives they call; the loader writes the source;
# a plan (plans.py) changes the columns of daily_aggregates through those primitives.
WRITERS = {"io_managers/delta.py", "resources/manifests.py", "delta_tables.py", "loader.py", "plans.py"}


def test_delta_writes_live_only_in_the_io_manager_and_the_manifest_resource():
    package = Path(environment.PROJECT_ROOT, "incremental_assets")
    writing = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(call in path.read_text() for call in WRITE_CALLS)
    }
    assert writing <= WRITERS, f"Delta writes outside their one writer: {sorted(writing - WRITERS)}"
    assert {"io_managers/delta.py", "resources/manifests.py"} <= writing


def test_a_first_run_over_an_empty_window_succeeds_and_moves_on_to_the_first_event(spark, warehouse, monkeypatch, tmp_path):
    source = str(tmp_path / "export")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    write_events(spark, events_frame(spark, EXPORT), source, "append")
    early = IncrementalSettings(
        start_date=(STREAM_START - timedelta(days=60)).date().isoformat(), session_timestamp="collector_tstamp",
        backfill_limit_days=10,
    )
    summary = run_incremental(early, instance=DagsterInstance.ephemeral())
    assert summary.success and summary.value("events_this_run", "events_found") == 0
    first_event = min(row[SAMPLE_SCHEMA.fieldNames().index("collector_tstamp")] for row in EXPORT)
    assert ManifestResource().entries()["filtered_events"].position == first_event
    for table in ("sessions_lifecycle_manifest", "quarantined_sessions", "events_this_run"):
        assert delta_tables.read_table(spark, f"{warehouse}/{table}").count() == 0


def bot_stream(spark, tmp_path, monkeypatch) -> IncrementalSettings:
    """BOT, whose late event caps its session in a run over a later window: in a source of its own,
    with the settings that process it (max_session_days 1, backfill_limit_days 1, cursor load_tstamp)."""
    source = str(tmp_path / "export")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    def hit(event_id, loaded):
        collector = loaded - timedelta(minutes=1)
        values = {
            "event_id": event_id, "app_id": "website", "event_name": "page_view", "collector_tstamp": collector,
            "dvce_created_tstamp": collector, "dvce_sent_tstamp": collector, "derived_tstamp": collector,
            "load_tstamp": loaded, "domain_sessionid": "BOT", "domain_userid": "u", "page_url": "/",
        }
        return tuple(values.get(name) for name in SAMPLE_SCHEMA.fieldNames()) + (loaded.date(),)
    day = STREAM_START
    rows = [hit("b1", day + timedelta(hours=10)), hit("b2", day + timedelta(hours=10, minutes=5)),
            hit("b3", day + timedelta(days=2, hours=12))]
    write_events(spark, events_frame(spark, rows), source, "append")
    return IncrementalSettings(start_date=day.date().isoformat(), max_session_days=1, backfill_limit_days=1)


def bot_runs(settings: IncrementalSettings, instance: DagsterInstance) -> list:
    return run_until_caught_up(settings, report=lambda line: None, instance=instance,
                               now=(STREAM_START + timedelta(days=4)).isoformat())


def bot_capped_and_quarantined(spark, warehouse) -> tuple[bool, list[str]]:
    [bot] = delta_tables.read_table(spark, f"{warehouse}/sessions_lifecycle_manifest").collect()
    quarantined = delta_tables.read_table(spark, f"{warehouse}/quarantined_sessions").collect()
    return bot.end_tstamp == bot.start_tstamp + timedelta(days=1), [row.session_identifier for row in quarantined]


def test_a_late_event_that_caps_a_session_older_than_the_window_quarantines_it(spark, warehouse, monkeypatch, tmp_path):
    # BOT starts 01-01 10:00; its late event loads 01-03 12:00, in a window whose sessions start
    # from 01-02 on. That run caps BOT's lifecycle row at 01-02 10:00, so it must quarantine BOT,
    # as one run over all would. (Found by the batching property, tests/test_batching_invariance.py.)
    runs = bot_runs(bot_stream(spark, tmp_path, monkeypatch), DagsterInstance.ephemeral())
    assert all(run.success for run in runs)
    assert bot_capped_and_quarantined(spark, warehouse) == (True, ["BOT"])


def test_a_session_capped_by_a_run_killed_before_its_quarantine_is_quarantined_by_the_next(
    spark, warehouse, monkeypatch, tmp_path
):
    # The run holding BOT's late event caps its lifecycle row, then dies before it writes the
    # quarantine. The next run finds that row already at its cap, nothing to change, and must
    # still quarantine BOT: its lifecycle step reports the row's day all the same.
    settings, instance = bot_stream(spark, tmp_path, monkeypatch), DagsterInstance.ephemeral()
    def killed(*args, **kwargs):
        raise RuntimeError("killed between the lifecycle's write and the quarantine's")
    with monkeypatch.context() as patch:
        patch.setattr(sessions_transforms, "capped_before_window", killed)
        runs = bot_runs(settings, instance)
    assert not runs[-1].success
    assert bot_capped_and_quarantined(spark, warehouse) == (True, [])
    runs = bot_runs(settings, instance)
    assert all(run.success for run in runs)
    assert bot_capped_and_quarantined(spark, warehouse) == (True, ["BOT"])
