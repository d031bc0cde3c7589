"""A change of settings, planned: every table built from the source has a fingerprint of the
settings and definitions its content depends on (lib/state/fingerprints.py), recorded by the
state store when it was built. A run whose settings give another fingerprint for any table is
refused before it writes, with the plan; `incremental-assets apply` or `apply_plan_job` carries it
out (lib/upkeep/apply.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Mapping

from dagster import Failure

from incremental_assets.lib.catalog import (
    ATTRIBUTES,
    ATTRIBUTES_HISTORY,
    BY_NAME,
    DAILY_AGGREGATES,
    DAILY_MANIFEST,
    LIFECYCLE,
    QUARANTINE,
    SOURCE_RULES,
    TABLES,
    known_incremental,
)
from incremental_assets.lib.delta.log import row_count
from incremental_assets.lib.errors import refuse_run
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.fingerprints import Fingerprint, Plan, fingerprint_of, plan
from incremental_assets.lib.state.hooks import alive_in
from incremental_assets.lib.state.store import LeaseHeld, StateStore, run_of

# Tables rebuilt whole on any change of the attributes, whatever its kind (see catalog.Table).
REBUILT_WHOLE = tuple(table.name for table in TABLES if table.rebuilt_whole)


def current_fingerprints(settings: IncrementalSettings, incremental: Mapping[str, str | None]) -> dict[str, Fingerprint]:
    """Every table's fingerprint under `settings`, upstream first; `incremental`: the incremental
    assets of the definitions (the built-in ones and a user's own) and their code versions."""
    values = settings.model_dump()
    attributes = {a.name: a.as_definition() for a in settings.attributes}
    tables = [LIFECYCLE, QUARANTINE, *sorted(incremental), DAILY_MANIFEST, DAILY_AGGREGATES, ATTRIBUTES, ATTRIBUTES_HISTORY]
    return {table: fingerprint_of(values, *_depends_on(table, attributes), incremental.get(table)) for table in tables}


def _depends_on(table: str, attributes: dict) -> tuple[tuple[str, ...], dict | None]:
    """The settings and attribute definitions a table's content depends on, as the catalog says;
    an incremental asset it does not name (a user's own): the source rules, no attributes."""
    entry = BY_NAME.get(table)
    if entry is None or entry.rules is None:
        return SOURCE_RULES, None
    return entry.rules, attributes if entry.attributes else None


def pending_plan(
    settings: IncrementalSettings, state: StateStore, incremental: Mapping[str, str | None],
    forward_only: bool = False,
) -> tuple[Plan, dict[str, Fingerprint]]:
    """The plan from the tables' recorded fingerprints to the current settings' (no Spark), and
    the current fingerprints. Tables without a fingerprint are looked at (row counts from their
    Delta logs): holding rows, they were built by an earlier release."""
    current = current_fingerprints(settings, incremental)
    stored = state.fingerprints()
    built = [table for table in current if table not in stored and row_count(state.uri(table))]
    return plan(stored, current, forward_only, built, REBUILT_WHOLE), current


def refusal(changes: Plan) -> str:
    """Why a run does not start while a plan is pending, with the plan."""
    return "refused: the settings differ from those the tables were built under. " + " ".join(changes.describe())


def start_writing(
    context, settings: IncrementalSettings, state: StateStore, window: tuple[datetime, datetime] | None = None
) -> None:
    """Each asset that can be a run's first writer calls this before it writes (whichever job or
    surface runs it); the first call of a run is refused while a plan is pending (Failure, with the
    plan), else takes the run log's lease for every asset the run writes (over `window`, the run's
    limits), recording the fingerprints of tables new to the warehouse under the current settings.
    A run refused the lease (another writer holds it) ends as canceled, with the holder named.
    Later calls of the same run find the lease theirs and do nothing."""
    run_id = run_of(context)
    if run_id is not None and state.holds_lease(run_id):
        return
    changes, current = pending_plan(settings, state, known_incremental(context))
    if not changes.empty:
        raise Failure(description=refusal(changes), allow_retries=False)
    if run_id is not None:
        assets = sorted(key.path[-1] for key in context.job_def.asset_layer.selected_asset_keys)
        adopted = {table: current[table] for table in changes.adopted}
        try:
            state.acquire(run_id, assets, window, alive_in(context.instance), adopt=adopted)
        except LeaseHeld as refused:  # another writer is at work: nothing wrong with this run's data
            refuse_run(context.instance, context.run, str(refused), cause=refused)
