"""The run log and its lease: the rules on hand-made records, the table (deltalake, no JVM), and two
writers at once on a real run."""

import asyncio
import json
import os
import re
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone

import pytest
from deltalake import DeltaTable
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionResolvedStatus

from incremental_assets.cli import main
from incremental_assets.cli.runner import run_incremental
from incremental_assets.lib import environment
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.catalog import WORKER_TAG
from incremental_assets.lib.state.hooks import alive_in
from incremental_assets.lib.state.run_log import (
    FAILED,
    PROCESSED,
    PROCESSING,
    RESOLVED,
    Record,
    lease_holder,
    open_leases,
    skip_reasons,
)
from incremental_assets.lib.state.store import LeaseHeld, StateStore

T0 = datetime(2024, 3, 1, 12, tzinfo=timezone.utc)


def rec(run, asset, status, minute, pid=None):
    return Record(run, asset, status, T0 + timedelta(minutes=minute), pid, "h")


def test_a_processing_record_without_its_pair_is_a_lease():
    records = [
        rec("r1", "a", PROCESSING, 0), rec("r1", "b", PROCESSING, 0), rec("r1", "a", PROCESSED, 1),
        rec("r1", "b", FAILED, 2),                              # r1 is closed: Processed and Failed
        rec("r2", "a", PROCESSING, 3), rec("r2", "b", PROCESSING, 3), rec("r2", "a", PROCESSED, 4),  # r2 b open
        rec("r3", "a", PROCESSING, 5),                          # r3 open, later than r2
    ]
    leases = open_leases(records)
    assert {run: [r.asset for r in held] for run, held in leases.items()} == {"r2": ["b"], "r3": ["a"]}
    assert lease_holder(leases) == "r2"  # the earlier Processing wins
    assert lease_holder({}) is None
    # Two writers who recorded at the same moment agree on one holder: the smaller run id.
    assert lease_holder(open_leases([rec("zz", "a", PROCESSING, 0), rec("aa", "a", PROCESSING, 0)])) == "aa"


def test_skip_reasons_come_from_the_steps_metadata_under_the_run_log_names():
    metadata = {"duplicates_dropped": 3, "dropped_late_sent": 2, "null_cursor_rows": 0, "rows_inserted": 9,
                "late_events_deferred": 4}
    assert skip_reasons(metadata) == {"duplicate": 3, "late_sent": 2, "late_deferred": 4}


def test_the_lease_is_refused_while_its_holder_lives_then_recovered(warehouse):
    state = StateStore()
    state.acquire("first", ["x", "y"], None, alive=lambda record: True)
    with pytest.raises(LeaseHeld, match="refused: lease held by first. Run first is still writing"):
        state.acquire("second", ["x"], None, alive=lambda record: True)
    statuses = [(r["run_id"], r["asset"], r["status"]) for r in state.run_log()]
    assert [run for run, _, _ in statuses] == ["first", "first"], "a refused run writes nothing"

    state.acquire("third", ["x"], None, alive=lambda record: False)  # "first" died: recovered
    log = state.run_log()
    recovered = [r for r in log if r["run_id"] == "first" and r["status"] == FAILED]
    assert {r["asset"] for r in recovered} == {"x", "y"} and "recovered by run third" in recovered[0]["message"]
    assert list(open_leases(Record(r["run_id"], r["asset"], r["status"], r["recorded_at"]) for r in log)) == ["third"]

    assert state.resolve("first") == 2 and state.resolve("first") == 0
    assert [r["status"] for r in state.run_log(run_id="first")][-2:] == [RESOLVED, RESOLVED]
    assert main(["resolve", "nobody"]) == 2  # a failure the user can act on: one error line, exit 2


def test_a_run_reads_the_recent_run_log_once_to_find_the_lease_free_and_take_it(warehouse, monkeypatch):
    """A run's first writer asks whether the lease is the run's already (holds_lease), then takes it
    (acquire): both look at the same days of the same version, which is read once."""
    state = StateStore()
    state.acquire("earlier", ["x"], None, alive=lambda record: False)
    state.record("earlier", "x", PROCESSED, {})
    scans, dataset = [], DeltaTable.to_pyarrow_dataset  # every read of rows (log.scan) opens one
    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", lambda self, **kw: scans.append(self.version()) or dataset(self, **kw))
    assert not state.holds_lease("run")
    state.acquire("run", ["x"], None, alive=lambda record: True)
    assert len(scans) == 1, scans
    assert state.holds_lease("run")


def test_a_lease_is_alive_while_its_process_exists_or_for_a_worker_run_while_the_instance_says_live():
    """Finding: run monitoring marked a live run failed, and the next writer, trusting the
    instance, took the lease while that run's process was still writing."""
    instance = DagsterInstance.ephemeral()
    here = __import__("socket").gethostname()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = {WORKER_TAG: f"{here}:{holder.pid}"}
    for run_id, status, tags in (("live", DagsterRunStatus.STARTED, {}), ("failed", DagsterRunStatus.FAILURE, {}),
                                 ("in-worker", DagsterRunStatus.STARTED, worker),
                                 ("ended-in-worker", DagsterRunStatus.CANCELED, worker),
                                 ("elsewhere-ended", DagsterRunStatus.FAILURE, {})):
        instance.add_run(DagsterRun(job_name="incremental_job", run_id=run_id, status=status, tags=tags))
    try:
        alive = alive_in(instance)
        assert alive(Record("live", "a", PROCESSING, T0, holder.pid, here))
        assert alive(Record("failed", "a", PROCESSING, T0, holder.pid, here)), "its process may still write"
        assert alive(Record("in-worker", "a", PROCESSING, T0, holder.pid, here))
        assert not alive(Record("ended-in-worker", "a", PROCESSING, T0, holder.pid, here)), "the worker outlives its runs"
        assert not alive(Record("live", "a", PROCESSING, T0, os.getpid(), here))  # an older run of this process
        assert alive(Record("unknown", "a", PROCESSING, T0, 1, "another-host"))  # only an operator can tell
        assert not alive(Record("elsewhere-ended", "a", PROCESSING, T0, 1, "another-host"))  # the instance says it ended
    finally:
        holder.kill()
        holder.wait()
    assert not alive(Record("live", "a", PROCESSING, T0, holder.pid, here))  # killed: its run is gone
    assert not alive(Record("in-worker", "a", PROCESSING, T0, holder.pid, here))


def test_a_second_writer_is_refused_with_the_holders_name_until_the_holder_is_gone(spark, warehouse):
    """Two `incremental-assets run` at once: the second fails before writing anything, naming the first."""
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    params = SampleParams(users=6, days=2, events_per_day=60, start_date=date(2024, 3, 1), seed=3)
    generate_stream(spark, source, params, hours=24)
    settings = IncrementalSettings(start_date="2024-03-01")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    state = StateStore()
    try:
        state._log([state._row("other-run", "filtered_events", PROCESSING, None, pid=holder.pid,
                                     host=__import__("socket").gethostname())])
        instance = DagsterInstance.ephemeral()
        refused = run_incremental(settings, now="2024-03-02T00:00:00", instance=instance)
        assert not refused.success and "Run other-run is still writing" in refused.error
        assert refused.describe() == "refused: lease held by other-run"
        # Shown as refused, not as failed data: the run ends canceled, and the checks it planned
        # resolve as skipped (a failed run's would each show "execution failed").
        assert instance.get_run_by_id(refused.run_id).status == DagsterRunStatus.CANCELED
        check = AssetCheckKey(AssetKey("filtered_events"), "event_id_unique")
        [planned] = instance.event_log_storage.get_asset_check_execution_history(check, limit=1)
        assert planned.run_id == refused.run_id
        assert asyncio.run(planned.resolve_status(LoadingContextForTest(instance))) == AssetCheckExecutionResolvedStatus.SKIPPED
        assert not os.path.exists(f"{warehouse}/filtered_events")
        assert not [r for r in state.run_log() if r["run_id"] == refused.run_id], "a refused run writes nothing"
    finally:
        holder.kill()
        holder.wait()
    summary = run_incremental(settings, now="2024-03-02T00:00:00", instance=instance)
    assert summary.success
    log = state.run_log()
    assert any(r["run_id"] == "other-run" and r["status"] == FAILED for r in log)  # recovered
    mine = [r for r in log if r["run_id"] == summary.run_id]
    pairs = {}
    for row in mine:
        pairs.setdefault(row["asset"], []).append(row["status"])
    assert pairs and all(statuses == [PROCESSING, PROCESSED] for statuses in pairs.values()), pairs
    assert {"new_event_limits", "sessions_lifecycle_manifest", "events_this_run", "filtered_events", "sessions"} <= set(pairs)
    processed = {r["asset"]: r for r in mine if r["status"] == PROCESSED}
    assert processed["filtered_events"]["rows"] > 0
    lifecycle_skips = json.loads(processed["sessions_lifecycle_manifest"]["skipped"] or "{}")
    assert lifecycle_skips.get("late_sent", 0) == summary.value("sessions_lifecycle_manifest", "dropped_late_sent", 0)
    assert json.loads(processed["events_this_run"]["skipped"] or "{}").get("duplicate", 0) == summary.value(
        "events_this_run", "duplicates_dropped"
    )


def test_the_run_log_compacts_its_recent_days_now_and_then(warehouse, monkeypatch):
    """A file per append would make every lease check list thousands of files."""
    from deltalake import DeltaTable

    from incremental_assets.lib.state import store as manifests

    monkeypatch.setattr(manifests, "COMPACT_FILES", 3)  # records and files alike
    state = StateStore()
    for run in ("r1", "r2"):
        state.acquire(run, ["a"], None, alive=lambda record: False)  # a file each
        state.record(run, "a", PROCESSED, {"rows_inserted": 1})
    state.acquire("r3", ["a"], None, alive=lambda record: False)     # four files: compacted, then its own
    table = DeltaTable(state.uri("run_log"))
    assert [c["operation"] for c in table.history(2)] == ["MERGE", "OPTIMIZE"] and len(table.file_uris()) == 2
    assert [(r["run_id"], r["status"]) for r in state.run_log()] == [
        ("r1", PROCESSING), ("r1", PROCESSED), ("r2", PROCESSING), ("r2", PROCESSED), ("r3", PROCESSING)
    ]


def test_two_runs_started_at_the_same_moment_one_writes_the_other_is_refused(spark, warehouse, tmp_path):
    """Two `incremental-assets run` processes at once, on one warehouse and one fresh Dagster instance
    (its storage not yet created, which they do under a file lock): both
    take the lease at their first write (before either starts Spark), Delta lets one commit it, and the
    other is refused naming it. filtered_events holds each event once."""
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    generate_stream(spark, source, SampleParams(users=6, days=2, events_per_day=60, start_date=date(2024, 3, 1), seed=5))
    env = {**os.environ, "INCREMENTAL_ASSETS_START_DATE": "2024-03-01", "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    command = [sys.executable, "-m", "incremental_assets", "run"]
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outcomes = sorted((run.wait(timeout=600), run.stdout.read()) for run in runs)
    assert [code for code, _ in outcomes][0] == 0 and outcomes[1][0] != 0, outcomes
    assert "is still writing this warehouse" in outcomes[1][1], outcomes[1][1]
    events = spark.read.format("delta").load(f"{warehouse}/filtered_events")
    assert events.count() == events.select("event_id").distinct().count() > 0
    refused_run = re.search(r"error: run (\S+) failed in \w+: refused: lease held by ", outcomes[1][1]).group(1)
    assert refused_run not in {r["run_id"] for r in StateStore().run_log()}, "a refused run writes nothing"
    assert "refused: lease held by " in outcomes[1][1]


def test_a_run_succeeded_when_every_asset_it_started_was_processed():
    from incremental_assets.lib.state.run_log import succeeded

    records = [
        rec("ok", "a", PROCESSING, 0), rec("ok", "a", PROCESSED, 1), rec("ok", "b", PROCESSING, 0), rec("ok", "b", PROCESSED, 2),
        rec("open", "a", PROCESSING, 0),
        rec("failed", "a", PROCESSING, 0), rec("failed", "a", FAILED, 1), rec("failed", "a", PROCESSED, 2),
        rec("half", "a", PROCESSING, 0), rec("half", "a", PROCESSED, 1), rec("half", "b", PROCESSING, 0),
    ]
    assert succeeded(records) == {"ok"}
