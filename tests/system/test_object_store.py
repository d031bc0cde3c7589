"""Tables on an object store: with the source and the warehouse in a bucket of a real S3 API server
(moto's, tests/s3_server.py), the pipeline driven through its commands (an export loaded, a run
killed mid-write, two runs started at once, runs until caught up, a daily backfill, a quiet run,
plan, a full refresh, the maintenance job) leaves the tables a local warehouse leaves over the same events; one run writes at
a time; the sensors read the Delta logs there without a JVM; the credentials appear nowhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, SkipReason, build_sensor_context
from deltalake import DeltaTable, write_deltalake

from incremental_assets.defs.automation import source_events_sensor
from incremental_assets.definitions import build_definitions
from incremental_assets.lib.catalog import MAINTENANCE_JOB
from incremental_assets.lib.environment import PROJECT_ROOT
from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.run_log import FAILED
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow
from tests.s3_server import ACCESS_KEY, BUCKET, SECRET_KEY, refusing_store
from tests.soak.test_crash_safety import CHILD as KILLED_AT
from tests.warehouse_tables import REFERENCE_DAY, comparable_tables, reference_run, scenario_environment

PARAMS = SampleParams(users=6, days=2, events_per_day=80, start_date=(utcnow() - timedelta(days=6)).date(), seed=13, bot_share=0.2)
SETTINGS = {"start_date": PARAMS.start_date.isoformat(), "max_session_days": 1, "attributes_reference_date": REFERENCE_DAY}
DAYS = (PARAMS.start_date, PARAMS.start_date + timedelta(days=1))
COMMAND = [sys.executable, "-m", "incremental_assets"]


def test_the_pipeline_on_an_object_store_leaves_the_tables_of_a_local_warehouse_and_one_writer_at_a_time(
    spark, s3, tmp_path
):
    local_source, reference = reference_run(spark, PARAMS, SETTINGS, tmp_path / "local", days=DAYS)
    # Both schemes: deltalake and Spark read each (S3A serves s3:// too).
    source, warehouse = f"s3://{BUCKET}/source", f"s3a://{BUCKET}/warehouse"
    export = tmp_path / "export.parquet"  # the same events, as an export a user loads
    pq.write_table(DeltaTable(local_source).to_pyarrow_table().drop_columns(["load_date"]), export)
    (tmp_path / "home").mkdir()

    with scenario_environment(warehouse, source, SETTINGS, home=tmp_path / "home"):
        loaded = subprocess.run([*COMMAND, "load", str(export)], env=dict(os.environ), capture_output=True, text=True, timeout=900)
        assert loaded.returncode == 0, loaded.stdout[-3000:] + loaded.stderr[-3000:]
        printed = [loaded.stdout, loaded.stderr]
        # The first run is killed outright after its filtered_events write; the next recovers the lease and the work.
        killed = subprocess.run([sys.executable, "-c", KILLED_AT, "after filtered_events", "kill"], env=dict(os.environ),
                                capture_output=True, text=True, timeout=900)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
        printed += [killed.stdout, killed.stderr]
        # The next two start at the same moment: both take the lease at their first write.
        both = [subprocess.Popen([*COMMAND, "run"], env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(2)]
        outcomes = sorted((run.wait(timeout=900), run.stdout.read()) for run in both)
        printed += [output for _, output in outcomes]
        assert outcomes[0][0] == 0 and outcomes[1][0] == 2, outcomes
        assert "is still writing this warehouse" in outcomes[1][1], outcomes[1][1]

        steps = [
            (["run", "--until-caught-up"], "events this run"),
            (["backfill", "--start", str(DAYS[0]), "--end", str(DAYS[1])], "daily_aggregates"),
            (["run"], "no new events"),  # the quiet run
            (["plan"], "nothing to apply"),
            (["refresh", "--set", "allow_refresh=true"], "emptied filtered_events"),  # then rebuilds from start_date
        ]
        for command, says in steps:
            done = subprocess.run([*COMMAND, *command], env=dict(os.environ), capture_output=True, text=True, timeout=900)
            assert done.returncode == 0 and says in done.stdout, (command, done.stdout[-3000:], done.stderr[-3000:])
            printed += [done.stdout, done.stderr]
        log = StateStore().run_log()
        assert any(row["status"] == FAILED and "the run is gone" in (row["message"] or "") for row in log), "the kill, recovered"

        # The maintenance job (OPTIMIZE and VACUUM, with deltalake) on the bucket.
        maintained = build_definitions(IncrementalSettings(**SETTINGS)).resolve_job_def(MAINTENANCE_JOB).execute_in_process(
            instance=DagsterInstance.get())
        [output] = [event.event_specific_data.metadata for event in maintained.all_events if event.is_successful_output]
        assert maintained.success and output["files_after"].value < output["files_before"].value, output

        instance = DagsterInstance.get()
        tick = source_events_sensor(build_sensor_context(instance=instance, resources={"settings": IncrementalSettings(**SETTINGS)}))
        assert isinstance(tick, SkipReason) and "caught up" in tick.skip_message, tick

        # Secrets stay secret: the credentials are nowhere a user or an operator reads.
        events = [str(event) for run in instance.get_runs() for event in instance.all_logs(run.run_id)]
        run_log = [str(row) for row in StateStore().run_log()]
        # every file of the Dagster home: the instance's databases, compute logs, the JVM's and the CLI's logs
        logs = [path.read_bytes().decode("latin-1") for path in (tmp_path / "home").rglob("*") if path.is_file()]
        docs = [path.read_text() for path in [PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").glob("*.md")]]
        assert events and run_log and logs
        for secret in (ACCESS_KEY, SECRET_KEY):
            for where, texts in (("terminal", printed), ("event log", events), ("run log", run_log), ("Dagster home", logs), ("docs", docs)):
                assert not any(secret in text for text in texts), f"{secret} in the {where}"

    assert comparable_tables(warehouse) == reference


def test_a_store_that_ignores_conditional_writes_is_refused_before_a_run_writes(s3, tmp_path, monkeypatch):
    """deltalake's commits are exclusive only where the store honours If-None-Match: elsewhere two runs
    could both take the lease. Such a store (here moto behind a proxy that drops the header) is
    named and refused at the run's first write; the same store without the proxy passes."""
    from incremental_assets.lib.delta.conditional import ConditionalWritesUnsupported, ensure_conditional_writes
    from tests.s3_server import without_conditional_writes

    ensure_conditional_writes(f"s3://{BUCKET}/honoured")
    source = f"s3://{BUCKET}/refused/source"
    write_deltalake(source, generate_table(PARAMS, PARAMS.start, PARAMS.start + timedelta(days=1)))
    with without_conditional_writes(s3["AWS_ENDPOINT_URL"]) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with pytest.raises(ConditionalWritesUnsupported, match="overwrote an object that a conditional write"):
            ensure_conditional_writes(f"s3://{BUCKET}/ignored")
        with scenario_environment(f"s3://{BUCKET}/refused/warehouse", source, SETTINGS, home=tmp_path / "home"):
            refused = subprocess.run([*COMMAND, "run"], env=dict(os.environ), capture_output=True, text=True, timeout=900)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["AWS_ENDPOINT_URL"])  # the proxy is gone: the server itself
    assert refused.returncode == 2 and "overwrote an object that a conditional write" in refused.stderr, refused.stderr
    assert DeltaTable.is_deltatable(f"s3://{BUCKET}/refused/source") and not DeltaTable.is_deltatable(
        f"s3://{BUCKET}/refused/warehouse/run_log"), "nothing written"


def test_a_missing_bucket_and_refused_credentials_are_named_with_what_to_do(s3, tmp_path, monkeypatch):
    """Finding: both read "... cannot be read: Kernel error -> Generic S3 error ... restore the table
    from a backup", NoSuchBucket only in the log file."""
    source = f"s3://{BUCKET}/named/source"
    write_deltalake(source, generate_table(PARAMS, PARAMS.start, PARAMS.start + timedelta(days=1)))
    with scenario_environment("s3://no-such-bucket/warehouse", source, SETTINGS, home=tmp_path / "home"):
        missing = subprocess.run([*COMMAND, "run"], env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert missing.returncode != 0 and "refused with NoSuchBucket" in missing.stderr, missing.stderr[-3000:]
    assert "create the bucket, or correct the warehouse's URI" in missing.stderr and "backup" not in missing.stderr

    with refusing_store("InvalidAccessKeyId") as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with scenario_environment(f"s3://{BUCKET}/named/warehouse", source, SETTINGS, home=tmp_path / "home"):
            refused = subprocess.run([*COMMAND, "run"], env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert refused.returncode != 0 and "refused with InvalidAccessKeyId" in refused.stderr, refused.stderr[-3000:]
    assert "correct the credentials" in refused.stderr and "backup" not in refused.stderr
