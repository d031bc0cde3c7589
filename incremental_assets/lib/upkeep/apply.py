"""Carrying out the plan of a settings change (see lib/state/settings_plan.py), under the run log's lease.

Applying it empties the tables it rebuilds (the runs that follow rebuild them from start_date: an
incremental asset by the manifest's "new model" backfill, the daily layer by its days marked
to_process), computes the columns of attributes added or redefined for every day, drops those of
attributes removed, and records the new fingerprints once those writes have committed: a crash
before that leaves the plan pending, and applying it again redoes the same.
"""

from __future__ import annotations

from datetime import date
from typing import Callable, Collection, Mapping

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets.lib.catalog import DAILY_AGGREGATES, DAILY_MANIFEST, FILTERED_EVENTS
from incremental_assets.lib.delta.log import row_count
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.delta.spec import WriteMode
from incremental_assets.lib.delta.write import WriteRequest, truncate, write
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.fingerprints import FORWARD_ONLY, Fingerprint, Plan, TableChange
from incremental_assets.lib.state.records import PROCESSED
from incremental_assets.lib.state.run_log import PROCESSED as RECORD_PROCESSED
from incremental_assets.lib.state.run_log import Record
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.daily import with_partials


def apply_plan(
    settings: IncrementalSettings, changes: Plan, current: Mapping[str, Fingerprint], state: StateStore,
    spark: Callable[[], SparkSession], run_id: str, alive: Callable[[Record], bool], today: date,
    incremental: Collection[str],
) -> dict[str, int]:
    """Carry out the plan under the run log's lease (the tables' rows before it, per table);
    `incremental`: the incremental assets (their manifest rows go with their rows)."""
    tables = [change.table for change in changes.changes]
    state.acquire(run_id, tables, None, alive)
    rebuilt = {change.table for change in changes.changes if change.rebuild}
    before = {}
    for change in changes.changes:
        uri = state.uri(change.table)
        before[change.table] = row_count(uri) or 0
        if change.rebuild:
            _empty(change, rebuilt, state, run_id, incremental)
        elif change.kind != FORWARD_ONLY and change.table == DAILY_AGGREGATES:
            _rewrite_columns(change, settings, state, spark(), run_id)
        state.record_fingerprints({change.table: current[change.table]}, run_id,
                                     today if change.kind == FORWARD_ONLY else None)
        state.record(run_id, change.table, RECORD_PROCESSED, {"dagster/row_count": before[change.table]},
                        message=f"plan applied: {change.describe()}")
    return before


def _empty(
    change: TableChange, rebuilt: set[str], state: StateStore, run_id: str, incremental: Collection[str]
) -> None:
    """Empty a table the plan rebuilds, and make the runs that follow rebuild it."""
    truncate(state.uri(change.table))
    if change.table in incremental:
        state.forget([change.table])  # backfilled from start_date by the next runs
    elif change.table == DAILY_MANIFEST:
        state.reset_days()  # filtered_events is rebuilt: its days come back as arrivals
    elif change.table == DAILY_AGGREGATES and DAILY_MANIFEST not in rebuilt:
        state.mark_to_process(list(state.days()), run_id)


def _rewrite_columns(change: TableChange, settings: IncrementalSettings, state: StateStore,
                     spark: SparkSession, run_id: str) -> None:
    """daily_aggregates with the partial columns of attributes added or redefined computed for
    every processed day, and those of attributes removed dropped, in one commit; every other
    column as it was. The days not processed yet, and the last day (for attributes), are marked to
    be recomputed whole."""
    uri = state.uri(DAILY_AGGREGATES)
    days = state.days()
    processed = sorted(day for day, status in days.items() if status.status == PROCESSED)
    stored = read_table(spark, uri)
    specs = [spec for spec in settings.attribute_specs() if spec.name in (*change.added, *change.redefined)]
    removed = [f"{name}__partial" for name in change.removed]
    events = read_table(spark, state.uri(FILTERED_EVENTS)).where(F.col("event_date").isin(processed))
    rows = with_partials(stored.drop(*removed), events, specs, settings.attribute_key)
    write(spark, rows, WriteRequest(uri, WriteMode.REPLACE, partition_by=["event_date"]))
    waiting = [day for day, status in days.items() if status.status != PROCESSED]
    state.mark_to_process(waiting + processed[-1:], run_id)
