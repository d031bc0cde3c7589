"""new_event_limits: the window of this run, decided once (SPEC §4) and handed down the graph, and
what arrived in the source since the last run looked (SPEC §2: no row lost without a count)."""

from datetime import datetime
from typing import Mapping

import deltalake
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Config,
    Failure,
    MetadataValue,
    Output,
    asset_check,
)
from pydantic import Field

from incremental_assets import previews
from incremental_assets.assets import spark_delta_asset
from incremental_assets.atomic_events import SourceContractError, arrived_since, require_identifier_sql, require_processable
from incremental_assets.delta_log import snapshot
from incremental_assets.environment import source_table_uri, table_uri
from incremental_assets.incremental import incremental_models_in_run
from incremental_assets.plans import start_writing
from incremental_assets.io_managers.delta import delta_table
from incremental_assets.logic.arrivals import NOTHING_ARRIVED, Arrival, ArrivalBounds, CountedArrivals, stranded
from incremental_assets.logic.limits import ManifestEntry, RunLimits, keyhole_limits, next_standard_lower, run_limits
from incremental_assets.names import BASE_GROUP, NEW_EVENT_LIMITS
from incremental_assets.resources.manifests import ManifestResource, run_log_record
from incremental_assets.resources.spark import SparkResource
from incremental_assets.logic.run_log import succeeded
from incremental_assets.run_state import RunPlan, last_assessed, plan_from_row
from incremental_assets.settings import IncrementalSettings
from incremental_assets.utc import naive, utcnow


class LimitsConfig(Config):
    """Leave empty for a normal run. lower + upper: a keyhole backfill that does not move the manifest."""

    lower: str | None = Field(default=None, description="Keyhole backfill: lower limit (ISO timestamp, UTC)")
    upper: str | None = Field(default=None, description="Keyhole backfill: upper limit (ISO timestamp, UTC)")
    now: str | None = Field(default=None, description="Pin 'now' (ISO timestamp, UTC) to replay a past run")


def _parse(name: str, value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name} must be an ISO timestamp such as 2024-01-31T06:00:00 (got {value!r})") from None
    return naive(moment)


def decide_limits(
    config: LimitsConfig, settings: IncrementalSettings, entries: Mapping[str, ManifestEntry], models: list[str]
) -> RunLimits:
    """An explicit window (keyhole) or the manifest's next one; `now` is evaluated once, here."""
    if (config.lower is None) != (config.upper is None):
        raise ValueError("A keyhole backfill needs both lower and upper")
    now = _parse("now", config.now) if config.now else utcnow()
    if config.lower is not None:
        return keyhole_limits(_parse("lower", config.lower), _parse("upper", config.upper), now)
    return run_limits(entries, models, settings.start, settings.backfill_limit_days, settings.lookback_window_hours, now)


def plan_run(
    limits: RunLimits, settings: IncrementalSettings, entries: Mapping[str, ManifestEntry], models: list[str],
    source: str, plans: list[dict] | None,
) -> tuple[RunPlan, str | None]:
    """The run's plan: its limits and the rows added to the source since the version the last run
    assessed (`plans`: the rows of new_event_limits). A warehouse whose runs recorded none (it
    predates this record, or its source table is another one now) starts counting from here: the
    note says so."""
    now = snapshot(deltalake.DeltaTable(source))
    since = last_assessed(plans, now.table_id)
    if since is None and any(entry.position for entry in entries.values()):
        return RunPlan(limits, now, NOTHING_ARRIVED), f"Rows arriving in the source are counted from its version {now.version} on"
    bounds = ArrivalBounds.of_run(limits, settings.start, next_standard_lower(entries, models, settings.lookback_window_hours))
    assessed, arrivals = arrived_since(source, since, bounds, settings.session_timestamp)
    return RunPlan(limits, assessed, arrivals), None


@spark_delta_asset(
    name=NEW_EVENT_LIMITS,
    group_name=BASE_GROUP,
    metadata=delta_table("append"),
    description="The run's state (first run, new model, out of sync, standard, keyhole) and its window "
    "[lower, upper] over the incremental assets of the run; one row per run, kept as history.",
)
def new_event_limits(
    context: AssetExecutionContext, config: LimitsConfig, settings: IncrementalSettings, manifest: ManifestResource,
    spark: SparkResource,
) -> Output[RunPlan]:
    try:  # before this run writes anything, its record and lease included
        require_processable(source_table_uri(), settings)
        if settings.session_identifier_sql or settings.user_identifier_sql:  # Spark parses them
            require_identifier_sql(spark.spark_session, source_table_uri(), settings)
    except SourceContractError as error:
        raise Failure(description=str(error)) from None
    models = incremental_models_in_run(context)
    entries = manifest.entries()
    limits = decide_limits(config, settings, entries, models)
    for line in limits.log_lines:
        context.log.info(line)
    start_writing(context, settings, manifest, limits)  # refused while a plan is pending; the lease
    plan, note = plan_run(limits, settings, entries, models, source_table_uri(), previews.read_rows(table_uri(NEW_EVENT_LIMITS)))
    if note:
        context.log.info(note)
    if plan.arrivals.skipped():
        context.log.warning(f"Rows read by no window of the incremental cursor: {plan.arrivals.skipped()}")
    return Output(
        plan,
        metadata={"state_message": limits.log_lines[0], "incremental_assets": MetadataValue.json(models)},
    )


@asset_check(
    asset=NEW_EVENT_LIMITS,
    description="Warns about source rows behind the incremental cursor (an archive, a restored backup, another "
    "loader's old rows) that no keyhole run has processed since they arrived: each run counts the rows that "
    "arrived in the source since the last one looked, and a keyhole run over their range processes them.",
)
def source_rows_behind_the_cursor(manifest: ManifestResource) -> AssetCheckResult:
    """Reads new_event_limits and, only when some rows wait, the run log: no Spark job."""
    counted = [
        CountedArrivals(row["run_id"], plan.source.version, plan.arrivals, None if plan.limits.moves_manifest else
                        (plan.limits.lower, plan.limits.upper))
        for row in previews.read_rows(table_uri(NEW_EVENT_LIMITS)) or []
        for plan in [plan_from_row(row)] if plan.source is not None
    ]
    waiting = any(c.arrivals[Arrival.BEHIND] or c.arrivals[Arrival.IN_KEYHOLE] for c in counted)
    runs = succeeded(run_log_record(row) for row in manifest.run_log()) if waiting else set()
    found = stranded(counted, runs)
    rows = sum(s.rows for s in found)
    return AssetCheckResult(
        passed=not found,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "rows_behind_the_cursor": rows,
            "ranges": MetadataValue.json([{"rows": s.rows, "from": str(s.start), "to": str(s.end), "counted_by": s.run_id,
                                           "process_with": s.command} for s in found]),
        },
        description=f"{rows} source rows behind the cursor wait for a keyhole run, e.g. {found[0].command}" if found else None,
    )
