"""new_event_limits: the window of this run, decided once and handed down the graph, and
what arrived in the source since the last run looked (no row lost without a count)."""

from dataclasses import replace
from datetime import datetime
from typing import Mapping

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Config,
    Definitions,
    Failure,
    MetadataValue,
    Output,
)
from pydantic import Field
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import SparkSession

from incremental_assets.lib.catalog import ATOMIC_EVENTS, BASE_GROUP, NEW_EVENT_LIMITS, RUN_STATE_TAG, WINDOW_TAG
from incremental_assets.lib.delta.log import Snapshot, read_rows, snapshot, stored_table
from incremental_assets.lib.delta.spec import delta_table
from incremental_assets.lib.environment import source_table_uri, table_uri
from incremental_assets.lib.errors import refuse_run
from incremental_assets.lib.assets import spark_delta_asset, warehouse_check
from incremental_assets.lib.incremental.limits import RunLimits, keyhole_limits, next_standard_lower, run_limits
from incremental_assets.lib.incremental.run_plan import (
    Quiet,
    incremental_models,
    outside_the_unit,
    RunPlan,
    last_assessed,
    repeated_run,
    run_arrival_bounds,
    waiting_behind_cursor,
)
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import (
    SourceContractError, arrived_since, first_after, require_processable, rows_within,
)
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.hooks import record_source_version
from incremental_assets.lib.state.settings_plan import start_writing
from incremental_assets.lib.state.records import ManifestEntry
from incremental_assets.lib.state.store import StateStore, run_of
from incremental_assets.lib.transforms.sessions import session_id, user_id
from incremental_assets.lib.utc import naive, utcnow


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
    run_id: str, limits: RunLimits, settings: IncrementalSettings, entries: Mapping[str, ManifestEntry],
    models: list[str], source: str, plans: list[dict] | None, state: StateStore,
) -> tuple[RunPlan, str | None]:
    """The run's plan: its limits, its incremental assets with their manifest rows, the rows added
    to the source since the version the last run assessed (`plans`: the rows of new_event_limits),
    and whether its window is quiet. A warehouse whose runs recorded none (it predates this
    record, or its source table is another one now) starts counting from here: the note says so."""
    decided = RunPlan(limits, run_id, tuple(models), {model: entries[model] for model in models if model in entries})
    now = snapshot(stored_table(source))  # there: require_processable found it
    since = last_assessed(plans, now.table_id)
    if since is None and any(entry.position for entry in entries.values()):
        return replace(decided, source=now), f"Rows arriving in the source are counted from its version {now.version} on"
    bounds = run_arrival_bounds(limits, settings.start, next_standard_lower(entries, models, settings.lookback_window_hours))
    assessed, arrivals = arrived_since(source, since, bounds, settings.session_timestamp)
    quiet = None if decided.nothing_new else quiet_window(decided, assessed, plans, source, settings, state)
    return replace(decided, source=assessed, arrivals=arrivals, quiet=quiet), None


def quiet_window(
    plan: RunPlan, source: Snapshot, plans: list[dict] | None, uri: str, settings: IncrementalSettings, state: StateStore,
) -> Quiet | None:
    """Whether a standard window holds nothing new (see Quiet): a successful run read this very
    source version up to its upper limit, and no row lies past that up to this window's (not even
    the next event an asset moved on to past a gap). The files' statistics say so; a few files are
    read at most, without a JVM."""
    repeated = repeated_run(plan.limits, plan.models, source, plans, lambda run: state.run_log(run_id=run))
    if repeated is None:
        return None
    next_event = first_after(uri, settings, repeated.limits.upper, plan.limits.now)
    return Quiet(repeated.run_id, next_event) if next_event is None or next_event > plan.limits.upper else None


def require_identifier_sql(spark: SparkSession, uri: str, settings: IncrementalSettings) -> None:
    """Raise SourceContractError when a configured identifier expression does not parse, or names
    what the source lacks: Spark analyses it against the source's schema, and runs no job."""
    for name, expression in (("session_identifier_sql", session_id), ("user_identifier_sql", user_id)):
        if getattr(settings, name):
            try:
                spark.read.format("delta").load(uri).select(expression(settings)).schema
            except (AnalysisException, ParseException) as error:
                first_line = str(error).strip().splitlines()[0]
                raise SourceContractError(f"{name} {getattr(settings, name)!r} cannot be used on {uri}: {first_line}") from None


@spark_delta_asset(
    name=NEW_EVENT_LIMITS,
    deps=[ATOMIC_EVENTS],  # the source every run reads: its lineage edge
    group_name=BASE_GROUP,
    metadata=delta_table("append"),
    description="The run's state (first run, new model, out of sync, standard, keyhole) and its window "
    "[lower, upper] over the incremental assets of the run; one row per run, kept as history.",
)
def new_event_limits(
    context: AssetExecutionContext, config: LimitsConfig, settings: IncrementalSettings, state: StateStore,
    spark: SparkResource,
) -> Output[RunPlan]:
    refused = outside_the_unit(context.job_def.asset_layer)
    if refused:
        refuse_run(context.instance, context.run, refused)
    source, models, entries = source_table_uri(), incremental_models(context.job_def.asset_layer), state.entries()
    limits = decide_limits(config, settings, entries, models)
    try:  # before this run writes anything, its record and lease included
        require_processable(source, settings)
        if settings.session_identifier_sql or settings.user_identifier_sql:  # Spark parses them, in the run's session
            require_identifier_sql(spark.session_for(rows_within(source, settings, limits.lower, limits.upper)), source, settings)
    except SourceContractError as error:
        raise Failure(description=str(error)) from None
    record_source_version(context.instance, "The source as a run first read it (your loader's version)")
    for line in limits.log_lines:
        context.log.info(line)
    run_id = run_of(context)
    if run_id is not None:
        context.instance.add_run_tags(run_id, {
            RUN_STATE_TAG: limits.state.value, WINDOW_TAG: f"{limits.lower.isoformat()}..{limits.upper.isoformat()}",
        })
    start_writing(context, settings, state, (limits.lower, limits.upper))  # refused while a plan is pending; the lease
    plans = read_rows(table_uri(NEW_EVENT_LIMITS))
    plan, note = plan_run(run_id or "", limits, settings, entries, models, source, plans, state)
    if note:
        context.log.info(note)
    if plan.quiet is not None:
        context.log.info(f"Nothing new in the window: the source is as run {plan.quiet.after_run} processed it. No step reads it")
    if plan.arrivals.skipped():
        context.log.warning(f"Rows read by no window of the incremental cursor: {plan.arrivals.skipped()}")
    return Output(
        plan,
        metadata={"state_message": limits.log_lines[0], "incremental_assets": MetadataValue.json(models)},
    )


@warehouse_check(
    asset=NEW_EVENT_LIMITS,
    description="Warns about source rows behind the incremental cursor (an archive, a restored backup, another "
    "loader's old rows) that no keyhole run has processed since they arrived: each run counts the rows that "
    "arrived in the source since the last one looked, and a keyhole run over their range processes them.",
)
def source_rows_behind_the_cursor(state: StateStore) -> AssetCheckResult:
    """Reads new_event_limits and, only when some rows wait, the run log: no Spark job."""
    found = waiting_behind_cursor(read_rows(table_uri(NEW_EVENT_LIMITS)), state.run_log)
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


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(assets=[new_event_limits], asset_checks=[source_rows_behind_the_cursor])
