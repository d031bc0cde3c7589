"""Incremental equals one-shot, whatever the batching (issue 10, property-based).

A sample stream (duplicates, late and late-sent rows, bots) is cut into load batches at random
hours (empty batches and gaps of hours or days included); each batch is appended and the pipeline
run until caught up, with 'now' just after the batch's last load. The tables must equal those of
one run over the same rows in one load. What is batch-dependent on purpose is said where it is
compared: `quarantined_at` is when a run saw the cap (only the sessions are compared).

Bounded here (`make test`: the `ci` profile); `make soak` runs the `soak` profile's longer search.
A failure prints the batching (hypothesis' falsifying example) and the seed to reproduce it.
"""

import os
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from incremental_assets.cli.runner import run_until_caught_up
from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.sample.stream import STREAM_SCHEMA
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.utc import utcnow
from tests.warehouse_tables import COMPARED, batch_scan, comparable_tables, run_accounts, scenario_environment

settings.register_profile("ci", max_examples=1, deadline=None, derandomize=True, print_blob=True, suppress_health_check=list(HealthCheck))
settings.register_profile("soak", max_examples=25, deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PARAMS = SampleParams(
    users=8, days=2, events_per_day=100, start_date=(utcnow() - timedelta(days=20)).date(), seed=3,
    late_share=0.1, duplicate_share=0.1, bot_share=0.15,
)
HOURS = (PARAMS.days + 1) * 24  # the loads of the stream's days, and a day of late arrivals after them


def _settings(backfill_limit_days: int) -> IncrementalSettings:
    # Every late day recomputed, however few its late rows: the daily layer then holds no backlog.
    return IncrementalSettings(
        start_date=PARAMS.start_date.isoformat(), backfill_limit_days=backfill_limit_days, max_session_days=1,
        reprocess_days=365, min_rows_to_process=1, attributes_reference_date=(PARAMS.start_date + timedelta(days=PARAMS.days)).isoformat(),
    )


def _process(spark, root: Path, cuts: list[int], backfill_limit_days: int) -> dict[str, list[tuple]]:
    """Append the loads between consecutive cut hours, running until caught up after each."""
    source, instance = str(root / "source"), DagsterInstance.ephemeral()
    with scenario_environment(root / "warehouse", source, {}):
        for first, last in zip(cuts, cuts[1:]):
            load_from, load_until = PARAMS.start + timedelta(hours=first), PARAMS.start + timedelta(hours=last)
            rows = generate_table(PARAMS, load_from, load_until)
            write_events(spark, spark.createDataFrame(rows, STREAM_SCHEMA), source, "append")
            runs = run_until_caught_up(
                _settings(backfill_limit_days), report=lambda line: None, instance=instance, now=load_until.isoformat()
            )
            assert all(run.success for run in runs), [run.error for run in runs if not run.success]
    return comparable_tables(root / "warehouse")


@st.composite
def batchings(draw):
    """Cut hours from 0 to HOURS: random sizes, repeated cuts (empty batches), and long gaps."""
    inner = draw(st.lists(st.integers(1, HOURS - 1), min_size=1, max_size=3))
    return [0, *sorted(inner), HOURS], draw(st.sampled_from([1, 2, 30]))


@pytest.fixture(scope="module")
def one_shot(spark, tmp_path_factory) -> dict[str, list[tuple]]:
    tables = _process(spark, tmp_path_factory.mktemp("one-shot"), [0, HOURS], 30)
    assert tables["filtered_events"] and tables["quarantined_sessions"], "the stream has events and a bot"
    return tables


@pytest.mark.property
@given(batching=batchings())
def test_incremental_runs_over_any_batching_equal_one_run_over_all(spark, tmp_path_factory, one_shot, batching):
    cuts, backfill_limit_days = batching
    batched = _process(spark, tmp_path_factory.mktemp("batched"), cuts, backfill_limit_days)
    for name in COMPARED:
        assert batched[name] == one_shot[name], f"{name} differs after batches {cuts} (backfill_limit_days={backfill_limit_days})"


CUTS = [0, 20, 31, 45, HOURS]  # loads cut mid-day: late rows name sessions that began a day before their window


def test_runs_that_scan_their_sessions_rows_equal_runs_that_scan_every_row(spark, tmp_path_factory, one_shot):
    """The batch's scan narrowed to the run's sessions and window (up to BROADCAST_SESSIONS) and the
    scan of every row in the sessions' span leave the same tables and count the same rows over the
    same loads; the narrowing did leave rows out."""
    by_sessions, every_row = tmp_path_factory.mktemp("narrowed"), tmp_path_factory.mktemp("every-row")
    with batch_scan(narrowed=True) as narrowings:
        narrowed_tables = _process(spark, by_sessions, CUTS, 1)
    assert any(kept < scanned for scanned, kept in narrowings), narrowings
    with batch_scan(narrowed=False):
        every_row_tables = _process(spark, every_row, CUTS, 1)
    for name in COMPARED:
        assert narrowed_tables[name] == every_row_tables[name] == one_shot[name], name
    assert run_accounts(by_sessions / "warehouse") == run_accounts(every_row / "warehouse")
