"""What users bring, end to end: a stream with every anomaly class, whose every
row a run reads is stored or counted under a reason; an archive loaded after go-live, processed by
the load itself; rows put behind the cursor by another route, surfaced by a warn check; and the
command line's failures, each one line. Each test is named after what it protects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, DagsterInstance

from incremental_assets.cli import main
from incremental_assets.cli.runner import load_export, run_days, run_incremental, run_until_caught_up
from incremental_assets.defs.base.limits import source_rows_behind_the_cursor
from incremental_assets.lib.delta.log import table_version
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.delta.write import last_commit
from incremental_assets.lib.sample.generator import ARROW_SCHEMA, SampleParams, generate_table
from incremental_assets.lib.sample.stream import STREAM_SCHEMA
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import LoadOptions, write_events
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.daily import attributes_from_daily
from incremental_assets.lib.utc import utcnow
from tests.warehouse_tables import COMPARED, attributes_values_from, comparable_tables, found_alike_by_checks, read_alike_by_checks, scenario_environment

DAY0 = datetime(2024, 3, 1)
NOW = (DAY0 + timedelta(days=8)).isoformat()
KEPT_NAMES = ["page_view", "screen_view", "page_ping", "add_to_cart", "submit_form"]  # link_click is filtered out


def row(event_id, session, at: datetime, loaded: datetime | None, **overrides) -> dict:
    values = {
        "event_id": event_id, "app_id": "website", "event_name": "page_view", "collector_tstamp": at,
        "dvce_created_tstamp": at, "dvce_sent_tstamp": at, "derived_tstamp": at, "load_tstamp": loaded,
        "domain_sessionid": session, "domain_userid": "u-extra", "load_date": loaded and loaded.date(),
    }
    return {**values, **overrides}


def anomalies() -> list[dict]:
    """The classes the generator does not make (it makes duplicates, late loads, late-sent and
    offline devices, null device times, null event_ids and bots)."""
    at = DAY0 + timedelta(days=1, hours=9)
    loaded = at + timedelta(minutes=5)
    return [
        row("   ", "extra-1", at, loaded),  # a blank event_id: counted as null, never stored
        row("no-session", None, at, loaded),
        row("other-app", "extra-1", at, loaded, app_id="intruder"),
        row("undated", "extra-1", at, loaded, derived_tstamp=None),
        row("before-start-derived", "extra-1", at, loaded, derived_tstamp=DAY0 - timedelta(days=2)),
        row("no-cursor", "extra-1", at, None),
        row("loaded-in-the-future", "extra-2", at, utcnow() + timedelta(days=30)),
        row("loaded-before-start", "extra-3", at, DAY0 - timedelta(days=1)),
    ]


def every_anomaly_source(spark, root: Path) -> str:
    params = SampleParams(users=8, days=6, events_per_day=160, start_date=DAY0.date(), seed=21, bot_share=0.25)
    table = generate_table(params, params.start, params.start + timedelta(days=params.days + 2))
    table = pa.concat_tables([table, pa.Table.from_pylist(anomalies(), ARROW_SCHEMA)])
    source = str(root / "source")
    write_events(spark, spark.createDataFrame(table, STREAM_SCHEMA), source)
    return source


ANOMALY_SETTINGS = {"start_date": DAY0.date().isoformat(), "backfill_limit_days": 2, "app_ids": "website,docs,mobile_app",
                    "event_names": ",".join(KEPT_NAMES), "attributes_reference_date": "2024-03-08"}


@pytest.fixture(scope="module")
def every_anomaly(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("every-anomaly")
    source = every_anomaly_source(spark, root)
    settings = IncrementalSettings(**{k: v.split(",") if k in ("app_ids", "event_names") else v
                                      for k, v in ANOMALY_SETTINGS.items()})
    with scenario_environment(root / "warehouse", source, {}):
        instance = DagsterInstance.ephemeral()
        runs = run_until_caught_up(settings, report=lambda line: None, instance=instance, now=NOW)
        log = StateStore().run_log()
        stored = {r.event_id for r in read_table(spark, f"{root}/warehouse/filtered_events").collect()}
        yield runs, log, stored, root, settings, instance


def test_every_row_a_run_reads_is_stored_or_counted_under_a_reason(every_anomaly):
    runs, log, _, _, _, _ = every_anomaly
    assert all(run.success for run in runs) and len(runs) >= 3
    reasons: dict[str, int] = {}
    for run in runs:
        records = {r["asset"]: r for r in log if r["run_id"] == run.run_id and r["status"] == "Processed"}
        chain = [records[a] for a in ("sessions_lifecycle_manifest", "events_this_run", "filtered_events")]
        for record in chain:  # each step: read = kept + skipped
            skipped = json.loads(record["skipped"] or "{}")
            assert record["rows_read"] == record["rows_kept"] + sum(skipped.values()), record
            for reason, n in skipped.items():
                reasons[reason] = reasons.get(reason, 0) + n
        # what a step keeps, the next one reads
        assert [r["rows_kept"] for r in chain[:-1]] == [r["rows_read"] for r in chain[1:]], run.run_id
        account = run.window
        assert account is not None and account.balanced and account.read == chain[0]["rows_read"] > 0
        assert f"window: read {account.read} = stored {account.stored}" in run.describe()
        arrived = records["new_event_limits"]
        assert arrived["rows_read"] == arrived["rows_kept"] + sum(json.loads(arrived["skipped"] or "{}").values())
    assert {
        "null_event_id", "null_session_id", "app_filtered", "null_dvce_tstamps", "late_sent", "quarantined",
        "duplicate", "beyond_session_cap", "event_name_filtered", "null_derived_tstamp", "before_start_date",
        "null_cursor",
    } <= set(reasons), reasons


def test_the_checks_read_every_table_of_every_anomaly_as_spark_reads_it_and_find_what_spark_finds(spark, every_anomaly):
    read_alike_by_checks(spark, every_anomaly[3] / "warehouse")
    found_alike_by_checks(spark, every_anomaly[3] / "warehouse")


def test_attributes_kept_by_the_runs_equal_every_key_recomputed_from_every_partial(spark, every_anomaly):
    """The runs' attributes take their keys' values from attributes_history (values_from): here
    the other way to them, each key from its every partial, gives the same rows."""
    _, _, _, root, settings, instance = every_anomaly
    ways = set(attributes_values_from(instance))
    assert ways == {"attributes_history's current intervals"}, ways
    stored = read_table(spark, f"{root}/warehouse/attributes")
    daily = read_table(spark, f"{root}/warehouse/daily_aggregates")
    recomputed = attributes_from_daily(daily, settings.attribute_specs(), settings.reference_day()).select(*stored.columns)
    assert recomputed.count() == stored.count() > 0
    assert recomputed.exceptAll(stored).count() == stored.exceptAll(recomputed).count() == 0


def test_the_version_a_loader_wrote_is_recorded_once_as_atomic_events(every_anomaly):
    """A source written outside this project's loads (here, before any run): the first run that reads
    it records its version in the instance as a materialization of atomic_events, so the UI shows
    when the source last changed and a launch there finds its upstream materialized (the finding:
    "upstream not materialized: atomic_events" on every launch). The runs after it add none."""
    runs, _, _, root, _, instance = every_anomaly
    [record] = instance.fetch_materializations(AssetKey("atomic_events"), limit=10).records
    metadata = record.asset_materialization.metadata
    source = str(root / "source")
    assert len(runs) >= 3 and (metadata["delta_version"].value, metadata["dagster/uri"].value) == (table_version(source), source)


def test_rows_no_window_reads_are_counted_when_they_arrive(every_anomaly):
    """A load time far in the future, and one before start_date while the event's own time is not:
    no window ever holds them. The first run counts them, once, under their reasons."""
    runs, log, stored, _, _, _ = every_anomaly
    arrived: dict[str, int] = {}
    for record in log:
        if record["asset"] == "new_event_limits" and record["status"] == "Processed":
            for reason, n in json.loads(record["skipped"] or "{}").items():
                arrived[reason] = arrived.get(reason, 0) + n
    assert arrived == {"cursor_in_future": 1, "cursor_before_start_date": 1}
    assert runs[0].value("new_event_limits", "arrived_cursor_in_future") == 1
    assert "arrived where no window reads: {'cursor_before_start_date': 1, 'cursor_in_future': 1}" in runs[0].describe()
    assert not {"loaded-in-the-future", "loaded-before-start"} & stored


def test_a_blank_event_id_is_counted_as_null_and_never_stored(every_anomaly):
    _, _, stored, _, _, _ = every_anomaly
    assert not [event_id for event_id in stored if not (event_id or "").strip()]
    assert "other-app" not in stored and "undated" not in stored and "no-session" not in stored


def test_the_run_log_holds_one_record_per_partition_with_its_own_rows(spark, every_anomaly):
    _, _, _, root, settings, instance = every_anomaly
    with scenario_environment(root / "warehouse", root / "source", {}):
        days = run_days(settings, date(2024, 3, 2), date(2024, 3, 5), instance)
        assert days.success
        records = [r for r in StateStore().run_log(run_id=days.run_id)
                   if r["asset"] == "daily_aggregates" and r["status"] == "Processed"]
    stored = read_table(spark, f"{root}/warehouse/daily_aggregates")
    per_day = {str(r.event_date): r["count"] for r in stored.groupBy("event_date").count().collect()}
    assert {r["partition"]: r["rows"] for r in records} == {d: per_day[d] for d in ("2024-03-02", "2024-03-03", "2024-03-04", "2024-03-05")}


def test_a_backfill_range_outside_the_partitions_is_named_before_a_run_starts(every_anomaly, capsys):
    _, _, _, root, _, _ = every_anomaly
    settings = [f"--set={name}={value}" for name, value in ANOMALY_SETTINGS.items()]
    with scenario_environment(root / "warehouse", root / "source", {}):
        assert main(["backfill", "--start", "2024-02-20", "--end", "2024-03-02", *settings]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --start 2024-02-20 is before the first daily partition, 2024-03-01 (start_date)")
        tomorrow = utcnow().date() + timedelta(days=1)
        assert main(["backfill", "--start", utcnow().date().isoformat(), "--end", tomorrow.isoformat(), *settings]) == 0
        out = capsys.readouterr().out
    assert f"note: {tomorrow} .. {tomorrow} have no daily partition yet" in out and ": ok (run" in out


def test_a_dry_run_counts_rows_behind_the_cursor_and_no_process_names_the_command(spark, every_anomaly, tmp_path, capsys):
    """The last test on this warehouse: it adds three late rows of 2024-03-02 to its source."""
    _, _, _, root, settings, instance = every_anomaly
    export = tmp_path / "late.jsonl"
    at = DAY0 + timedelta(days=1, hours=12)
    lines = [row(f"late-{i}", "late-session", at + timedelta(minutes=i), at + timedelta(minutes=i)) for i in range(3)]
    export.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "load_date"}, default=str) + "\n" for r in lines))
    flags = [f"--set={name}={value}" for name, value in ANOMALY_SETTINGS.items()]
    command = "incremental-assets run --lower 2024-03-02T12:00:00 --upper 2024-03-02T12:02:00"
    with scenario_environment(root / "warehouse", root / "source", {}):
        version = last_commit(str(root / "source")).version
        assert main(["load", str(export), "--dry-run", *flags]) == 0
        out = capsys.readouterr().out
        assert "Would load 3 rows" in out and "3 row(s) behind the incremental cursor" in out
        assert f"Process the rows behind the cursor with: {command}" in out
        assert last_commit(str(root / "source")).version == version, "a dry run writes nothing"

        assert main(["load", str(export), "--no-process", *flags]) == 0
        assert f"Process the rows behind the cursor with: {command}" in capsys.readouterr().out
        assert run_incremental(settings, instance=instance, now=NOW).value("new_event_limits", "arrived_behind_cursor") == 3
        check = source_rows_behind_the_cursor(state=StateStore())
    assert not check.passed and [r["process_with"] for r in check.metadata["ranges"].value] == [command]


# -- an archive loaded after go-live ----------------------------------------------------------------


def stream(spark, params: SampleParams) -> pa.Table:
    return generate_table(params, params.start, params.start + timedelta(days=params.days + 2))


ARCHIVE = SampleParams(users=6, days=2, events_per_day=90, start_date=date(2024, 2, 1), seed=31)
ARCHIVE_MORE = SampleParams(users=6, days=2, events_per_day=90, start_date=date(2024, 2, 10), seed=32)
LIVE = SampleParams(users=6, days=3, events_per_day=90, start_date=date(2024, 3, 1), seed=33)
# reprocess_days covers the stream: a catch-up with 10-day windows leaves no late row beyond the horizon
ARCHIVE_SETTINGS = {"start_date": "2024-02-01", "backfill_limit_days": 10, "reprocess_days": 60,
                    "attributes_reference_date": "2024-03-05"}


def test_an_archive_loaded_after_go_live_is_processed_by_the_load_and_equals_loading_it_first(spark, tmp_path):
    """One warehouse loads the archives and the live stream first, then runs. The other goes live
    first; then `load` brings one archive (processed by the load itself, with a keyhole run over its
    range) and another loader appends a second one behind the cursor, which a warn check names
    until the keyhole run it gives has processed it. The tables end equal."""
    archive, more, live = (stream(spark, params) for params in (ARCHIVE, ARCHIVE_MORE, LIVE))
    settings = IncrementalSettings(**ARCHIVE_SETTINGS)
    now = "2024-03-07T00:00:00"

    first = tmp_path / "loaded-first"
    write_events(spark, spark.createDataFrame(pa.concat_tables([archive, more, live]), STREAM_SCHEMA), str(first / "source"))
    with scenario_environment(first / "warehouse", first / "source", {}):
        runs = run_until_caught_up(settings, report=lambda line: None, instance=DagsterInstance.ephemeral(), now=now)
        assert all(run.success for run in runs)
    expected = comparable_tables(first / "warehouse")

    later = tmp_path / "archive-later"
    write_events(spark, spark.createDataFrame(live, STREAM_SCHEMA), str(later / "source"))
    export = tmp_path / "archive.parquet"
    pq.write_table(archive.drop(["load_date"]), export)
    lines: list[str] = []
    with scenario_environment(later / "warehouse", later / "source", {}):
        instance = DagsterInstance.ephemeral()
        assert all(run.success for run in run_until_caught_up(settings, report=lambda line: None, instance=instance, now=now))
        position = StateStore().entries()["filtered_events"].position
        outcome = load_export(settings, str(export), LoadOptions(), instance=instance, report=lines.append)
        assert outcome.success and outcome.keyhole is not None and outcome.keyhole.value("new_event_limits", "run_state") == "keyhole"
        assert StateStore().entries()["filtered_events"].position == position, "the keyhole does not move the manifest"
        assert f"{archive.num_rows} row(s) behind the incremental cursor" in "\n".join(lines)
        assert source_rows_behind_the_cursor(state=StateStore()).passed

        # Another loader appends an archive behind the cursor: the next run counts it, the check names it.
        write_events(spark, spark.createDataFrame(more, STREAM_SCHEMA), str(later / "source"))
        counted = run_incremental(settings, instance=instance, now=now)
        assert counted.success and counted.value("new_event_limits", "arrived_behind_cursor") == more.num_rows
        check = source_rows_behind_the_cursor(state=StateStore())
        assert not check.passed and check.metadata["rows_behind_the_cursor"].value == more.num_rows
        [waiting] = check.metadata["ranges"].value
        lower, upper = waiting["process_with"].split("--lower ")[1].split(" --upper ")
        keyhole = run_incremental(settings, lower=lower, upper=upper, instance=instance)
        assert keyhole.success
        assert source_rows_behind_the_cursor(state=StateStore()).passed
    assert comparable_tables(later / "warehouse") == expected, "the same tables as loading it first"
    assert set(expected) == set(COMPARED)


# -- the command line: one line for each failure a user can cause ---------------------------------


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "incremental_assets", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def test_a_column_whose_type_changes_between_loads_is_refused_in_one_line(tmp_path, warehouse):
    """A string, then an array: the second load is refused before it writes, and no Java or Python
    frame reaches the terminal."""
    base = row("e1", "s1", DAY0, DAY0 + timedelta(minutes=1))
    del base["load_date"]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(json.dumps({**base, "campaign": "spring"}, default=str) + "\n")
    second.write_text(json.dumps({**base, "event_id": "e2", "campaign": ["a", "b"]}, default=str) + "\n")
    assert _cli("load", str(first), "--set", "start_date=2024-03-01").returncode == 0
    refused = _cli("load", str(second), "--set", "start_date=2024-03-01")
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: nothing was loaded from {second}: values not of their column's type: column campaign "
                           "is array<string> here but string in the source table")
    assert "Traceback" not in refused.stdout + refused.stderr and "\tat " not in refused.stdout + refused.stderr


BROKEN = [
    (["load", "no-such-file.csv"], "No such file: no-such-file.csv"),
    (["load", "events.xlsx"], "Cannot tell the format of events.xlsx"),
    (["load", "mixed"], "Cannot load mixed: its files must be all CSV, all JSON lines or all Parquet; it holds csv: 1 file(s)"),
    (["load", "markers"], "Nothing to load in markers: it holds no data file"),
    (["load", "{empty}"], "lacks required column(s) event_id"),
    (["run", "--set", "backfill_limit_days=0"], "backfill_limit_days must be an integer >= 1"),
    (["run"], "No source events table at"),
    (["preview"], "No source events table at"),
    (["backfill", "--start", "2019-12-01", "--end", "2020-01-02"], "is before the first daily partition, 2020-01-01"),
    (["show", "no_such_table"], "No Delta table at"),
    (["refresh"], "allow_refresh"),
    (["resolve", "nobody"], "has no Failed record left to resolve"),
    (["generate", "--append-hours", "2"], "No sample stream at"),
]


@pytest.mark.parametrize("args, says", BROKEN, ids=[" ".join(a) for a, _ in BROKEN])
def test_a_broken_input_ends_in_one_error_line_naming_it(spark, warehouse, tmp_path, capsys, monkeypatch, args, says):
    empty = tmp_path / "empty.csv"
    empty.write_text("a,b\n1,2\n")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", str(tmp_path / "no-source"))
    (tmp_path / "events.xlsx").write_text("")
    for folder, files in {"mixed": ["a.csv", "b.jsonl"], "markers": ["_SUCCESS", ".a.csv.crc"]}.items():
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_text(empty.read_text())
    monkeypatch.chdir(tmp_path)
    code = main([arg.format(empty=empty) for arg in args])
    out, err = capsys.readouterr()
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("error: ") and says in line, line
    assert "Traceback" not in out + err


def _export_with_times(path: Path, times, fmt: str) -> None:
    """Three page views at 2024-03-01 10:00-10:02 with each time column as `times(datetime)` gives it."""
    rows = []
    for i in range(3):
        at = DAY0 + timedelta(hours=10, minutes=i)
        values = row(f"e{i}", "s1", at, at + timedelta(seconds=30))
        del values["load_date"]
        rows.append({k: times(v) if k.endswith("tstamp") else v for k, v in values.items()})
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)


def _epoch_ms(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1)) // timedelta(milliseconds=1)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_epoch_milliseconds_load_as_their_own_times_and_the_next_run_reads_them(warehouse, tmp_path, capsys, fmt):
    export = tmp_path / f"export.{fmt}"
    _export_with_times(export, _epoch_ms, fmt)
    assert main(["load", str(export), "--set", "start_date=2024-03-01"]) == 0
    out = capsys.readouterr().out
    assert "Loaded 3 rows" in out and "1 load day(s) from 2024-03-01 to 2024-03-01" in out
    assert "load_tstamp milliseconds" in out
    summary = run_incremental(IncrementalSettings(start_date="2024-03-01"), instance=DagsterInstance.ephemeral(), now=NOW)
    assert summary.value("filtered_events", "rows_inserted") == 3


def test_pandas_nanosecond_parquet_loads_instead_of_crashing(spark, warehouse, tmp_path, capsys):
    """pandas writes timestamps as Parquet TIMESTAMP(NANOS), which Spark alone refuses to read."""
    for zone in (None, "UTC"):
        export = tmp_path / f"pandas-{zone}.parquet"
        rows = []
        for i in range(3):
            at = DAY0 + timedelta(hours=10, minutes=i)
            values = row(f"{zone}-{i}", "s1", at, at + timedelta(seconds=30))
            del values["load_date"]
            rows.append(values)
        table = pa.Table.from_pylist(rows)
        for name in table.column_names:
            if name.endswith("tstamp"):
                table = table.set_column(table.schema.get_field_index(name), name,
                                         table.column(name).cast(pa.timestamp("ns", zone)))
        pq.write_table(table, export)  # Parquet 2.6: TIMESTAMP(NANOS, isAdjustedToUTC)
        assert main(["load", str(export), "--set", "start_date=2024-03-01"]) == 0
        assert "load_tstamp nanoseconds" in capsys.readouterr().out
    loaded = read_table(spark, f"{warehouse}/atomic_events").where("event_id = 'UTC-0'").first()
    assert loaded.load_tstamp == DAY0 + timedelta(hours=10, seconds=30)
