"""A change of settings, planned and applied (SPEC §3).

Every table built from the source has a fingerprint of the settings and definitions its content
depends on (`logic.fingerprints`), recorded by the state store when it was built. A run whose
settings give another fingerprint for any table is refused before it writes, with the plan; the
plan is applied by `incremental-assets apply` (or the `apply_plan_job`). Applying it empties the
tables it rebuilds (the runs that follow rebuild them from start_date: an incremental asset by
the manifest's "new model" backfill, the daily layer by its days marked to_process), computes the
columns of attributes added or redefined for every day, drops those of attributes removed, and
records the new fingerprints once those writes have committed: a crash before that leaves the
plan pending, and applying it again redoes the same.
"""

from __future__ import annotations

from datetime import date
from typing import Callable, Collection, Mapping

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets import delta_tables, previews
from incremental_assets.delta_tables import WriteMode
from incremental_assets.logic.days import PROCESSED
from incremental_assets.logic.fingerprints import (
    DAILY_RULES,
    EVENT_RULES,
    FORWARD_ONLY,
    SOURCE_RULES,
    Fingerprint,
    Plan,
    TableChange,
    fingerprint_of,
    plan,
)
from incremental_assets.logic.run_log import PROCESSED as RECORD_PROCESSED
from incremental_assets.logic.run_log import Record
from incremental_assets.names import ATTRIBUTES, DAILY_AGGREGATES, FILTERED_EVENTS, LIFECYCLE, QUARANTINE, SESSIONS
from incremental_assets.resources.manifests import DAILY_MANIFEST, ManifestResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.transforms.daily import with_partials

# What each table's content depends on; an incremental asset not named here (a user's own) on the
# source rules, and on its declared code version.
TABLE_RULES = {
    LIFECYCLE: SOURCE_RULES, QUARANTINE: SOURCE_RULES, FILTERED_EVENTS: EVENT_RULES, DAILY_MANIFEST: EVENT_RULES,
    DAILY_AGGREGATES: DAILY_RULES, ATTRIBUTES: DAILY_RULES,
}
WITH_ATTRIBUTES = (DAILY_AGGREGATES, ATTRIBUTES)


def current_fingerprints(settings: IncrementalSettings, incremental: Mapping[str, str | None]) -> dict[str, Fingerprint]:
    """Every table's fingerprint under `settings`, upstream first; `incremental`: the incremental
    assets of the definitions (the built-in ones and a user's own) and their code versions."""
    values = settings.model_dump()
    attributes = {a.name: a.as_definition() for a in settings.attributes}
    tables = [LIFECYCLE, QUARANTINE, *sorted(incremental), DAILY_MANIFEST, DAILY_AGGREGATES, ATTRIBUTES]
    return {
        table: fingerprint_of(values, TABLE_RULES.get(table, SOURCE_RULES),
                              attributes if table in WITH_ATTRIBUTES else None, incremental.get(table))
        for table in tables
    }


def pending_plan(
    settings: IncrementalSettings, manifest: ManifestResource, incremental: Mapping[str, str | None],
    forward_only: bool = False,
) -> tuple[Plan, dict[str, Fingerprint]]:
    """The plan from the tables' recorded fingerprints to the current settings' (no Spark), and
    the current fingerprints."""
    current = current_fingerprints(settings, incremental)
    return plan(manifest.fingerprints(), current, forward_only), current


def refusal(changes: Plan) -> str:
    """Why a run does not start while a plan is pending, with the plan."""
    return "refused: the settings differ from those the tables were built under. " + " ".join(changes.describe())


def start_writing(context, settings: IncrementalSettings, manifest: ManifestResource, limits=None) -> None:
    """A run's first writer, before it writes: refused while a plan is pending (Failure, with the
    plan), else it takes the run log's lease for every asset the run writes, recording the
    fingerprints of tables new to the warehouse under the current settings."""
    from dagster import Failure
    from dagster._core.errors import DagsterInvalidPropertyError

    from incremental_assets.incremental import incremental_versions
    from incremental_assets.run_log import alive_in

    try:
        run_id, layer = context.run.run_id, context.job_def.asset_layer
    except DagsterInvalidPropertyError:  # called directly (a test): it returns its output, stores nothing
        run_id, layer = None, None
    incremental = {FILTERED_EVENTS: None, SESSIONS: None, **(incremental_versions(layer.asset_graph) if layer else {})}
    changes, current = pending_plan(settings, manifest, incremental)
    if not changes.empty:
        raise Failure(description=refusal(changes), allow_retries=False)
    if run_id is not None:
        assets = sorted(key.path[-1] for key in layer.selected_asset_keys)
        adopted = {table: current[table] for table in changes.adopted}
        manifest.acquire(run_id, assets, limits, alive_in(context.instance), adopt=adopted)


def apply_plan(
    settings: IncrementalSettings, changes: Plan, current: Mapping[str, Fingerprint], manifest: ManifestResource,
    spark: Callable[[], SparkSession], run_id: str, alive: Callable[[Record], bool], today: date,
    incremental: Collection[str],
) -> dict[str, int]:
    """Carry out the plan under the run log's lease (the tables' rows before it, per table);
    `incremental`: the incremental assets (their manifest rows go with their rows)."""
    tables = [change.table for change in changes.changes]
    manifest.acquire(run_id, tables, None, alive)
    rebuilt = {change.table for change in changes.changes if change.rebuild}
    before = {}
    for change in changes.changes:
        uri = manifest.uri(change.table)
        before[change.table] = previews.row_count(uri) or 0
        if change.rebuild:
            _empty(change, rebuilt, manifest, run_id, incremental)
        elif change.kind != FORWARD_ONLY and change.table == DAILY_AGGREGATES:
            _rewrite_columns(change, settings, manifest, spark(), run_id)
        manifest.record_fingerprints({change.table: current[change.table]}, run_id,
                                     today if change.kind == FORWARD_ONLY else None)
        manifest.record(run_id, change.table, RECORD_PROCESSED, {"dagster/row_count": before[change.table]},
                        message=f"plan applied: {change.describe()}")
    return before


def _empty(
    change: TableChange, rebuilt: set[str], manifest: ManifestResource, run_id: str, incremental: Collection[str]
) -> None:
    """Empty a table the plan rebuilds, and make the runs that follow rebuild it."""
    delta_tables.truncate(manifest.uri(change.table))
    if change.table in incremental:
        manifest.forget([change.table])  # backfilled from start_date by the next runs
    elif change.table == DAILY_MANIFEST:
        manifest.reset_days()  # filtered_events is rebuilt: its days come back as arrivals
    elif change.table == DAILY_AGGREGATES and DAILY_MANIFEST not in rebuilt:
        manifest.mark_to_process(list(manifest.days()), run_id)


def _rewrite_columns(change: TableChange, settings: IncrementalSettings, manifest: ManifestResource,
                     spark: SparkSession, run_id: str) -> None:
    """daily_aggregates with the partial columns of attributes added or redefined computed for
    every processed day, and those of attributes removed dropped, in one commit; every other
    column as it was. The days not processed yet, and the last day (for attributes), are marked to
    be recomputed whole."""
    uri = manifest.uri(DAILY_AGGREGATES)
    days = manifest.days()
    processed = sorted(day for day, status in days.items() if status.status == PROCESSED)
    stored = delta_tables.read_table(spark, uri)
    specs = [spec for spec in settings.attribute_specs() if spec.name in (*change.added, *change.redefined)]
    removed = [f"{name}__partial" for name in change.removed]
    events = delta_tables.read_table(spark, manifest.uri(FILTERED_EVENTS)).where(F.col("event_date").isin(processed))
    rows = with_partials(stored.drop(*removed), events, specs, settings.attribute_key)
    delta_tables.write(spark, rows, uri, WriteMode.REPLACE, partition_by=["event_date"])
    waiting = [day for day, status in days.items() if status.status != PROCESSED]
    manifest.mark_to_process(waiting + processed[-1:], run_id)
