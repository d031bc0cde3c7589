"""What runs by itself: the incremental and daily jobs, the sensors that request them, and the
hourly schedule. Sensors read Delta logs and the small state tables without a JVM (deltalake),
and the Dagster instance; they never start Spark. They look as often as the settings say
(sensor_interval_seconds): each is declared here at the default interval (what a direct call
evaluates) and built again at the settings' interval for the definitions."""

from datetime import timedelta
from typing import Callable

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    MetadataValue,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    sensor,
)

from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.storage.tags import RUN_KEY_TAG

from incremental_assets.lib.catalog import (
    APPLY_PLAN_JOB,
    BASE_GROUP,
    DAILY_AGGREGATES,
    DAILY_JOB,
    DAILY_MANIFEST,
    EVENTS_THIS_RUN,
    FROM_DAILY,
    INCREMENTAL_JOB,
    INCREMENTAL_MANIFEST,
    INCREMENTAL_TAG,
    KEYHOLE_TAG,
    NEW_EVENT_LIMITS,
    RETRY_TAG,
    known_incremental,
)
from incremental_assets.lib.delta.log import read_rows, stored_table, table_version
from incremental_assets.lib.environment import source_table_uri
from incremental_assets.lib.incremental.days import daily_runs, days_window_tags
from incremental_assets.lib.incremental.limits import RunState
from incremental_assets.lib.incremental.run_plan import last_assessed, waiting_behind_cursor
from incremental_assets.lib.source.arrivals import Stranded
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.hooks import behind_daily_aggregates, runs_in_flight
from incremental_assets.lib.state.settings_plan import pending_plan
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.source.contract import first_after
from incremental_assets.lib.utc import naive, utcnow

KEYHOLES_PASSED_OVER = 20  # at most this many keyhole runs since the latest standard one are looked through
ENDED_WITHOUT_SUCCESS = (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)
AHEAD_LOOKED = timedelta(days=1)  # rows stamped further ahead than this are not named in a skip reason
DEFAULT_INTERVAL = IncrementalSettings.model_fields["sensor_interval_seconds"].default
REQUESTING: list[tuple[Callable, dict]] = []  # the sensors that request runs, as declared


def requesting_sensor(**declared) -> Callable:
    """@sensor, on by default, at the default interval; defs() builds it at the settings' interval."""
    def declare(evaluation: Callable) -> SensorDefinition:
        REQUESTING.append((evaluation, declared))
        return every(DEFAULT_INTERVAL, evaluation, declared)

    return declare


def every(seconds: int, evaluation: Callable, declared: dict) -> SensorDefinition:
    return sensor(minimum_interval_seconds=seconds, default_status=DefaultSensorStatus.RUNNING, **declared)(evaluation)


incremental_job = define_asset_job(
    INCREMENTAL_JOB,
    # the base chain, every incremental asset (a user's own, in any group), the daily manifest
    selection=(AssetSelection.groups(BASE_GROUP) | AssetSelection.tag(INCREMENTAL_TAG, "true")
               | AssetSelection.assets(DAILY_MANIFEST)),
    description="One incremental run: limits, session layer, events this run, then the incremental assets.",
)

daily_job = define_asset_job(
    DAILY_JOB,
    selection=AssetSelection.assets(DAILY_AGGREGATES, *FROM_DAILY),
    description="Recompute daily_aggregates for a range of days (one run, one Spark session), then attributes "
    "and attributes_history.",
)

hourly_incremental_schedule = ScheduleDefinition(
    name="hourly_incremental_run",
    job_name=INCREMENTAL_JOB,
    cron_schedule="15 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="One incremental run every hour (turn on instead of the source sensor if preferred).",
)


def plan_waits(context: SensorEvaluationContext, settings: IncrementalSettings) -> SkipReason | None:
    """While the settings differ from those the tables were built under, no run is requested (it
    would be refused): the reason, with the plan."""
    changes, _ = pending_plan(settings, StateStore(), known_incremental(context))
    return None if changes.empty else SkipReason(" ".join(changes.describe()))


@requesting_sensor(
    job_name=INCREMENTAL_JOB,
    description="Requests an incremental run when the source events table has a version no run has "
    "assessed yet (runs of the command line included), a keyhole run for source rows behind the cursor, "
    "and more runs, one at a time, until a run is caught up (a backlog, a first load, a full refresh); "
    "none while a change of settings waits for its plan to be applied.",
)
def source_events_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    source = stored_table(source_table_uri())
    if source is None:
        return SkipReason(f"No source table at {source_table_uri()} yet")
    version = source.version()
    waiting = plan_waits(context, settings)
    if waiting is not None:
        return waiting
    active = runs_in_flight(context.instance, job_name=INCREMENTAL_JOB)
    if active:
        return SkipReason(f"Run {active[0].run_id} is still processing; the next check will pick up version {version}")
    state = StateStore()
    plans = read_rows(state.uri(NEW_EVENT_LIMITS))
    passed_over = []
    for rows in waiting_behind_cursor(plans, state.run_log):
        keyhole = keyhole_request(context.instance, rows)
        if isinstance(keyhole, RunRequest):
            return keyhole
        if keyhole not in passed_over:
            passed_over.append(keyhole)
    if version > seen_version(context, plans, source.metadata().id):
        context.update_cursor(str(version))
        return RunRequest(run_key=f"source-version-{version}")
    retry = retry_of_the_last_run(context.instance)
    if retry is not None:
        return retry
    catch_up = catch_up_key(context.instance, state, sorted(known_incremental(context)))
    if catch_up:
        return RunRequest(run_key=catch_up)
    due = ahead_of_the_clock(plans, settings, source)
    if isinstance(due, RunRequest):
        return due
    return SkipReason(f"Source unchanged since version {version}, and the last run was caught up{due}"
                      + "".join(f"; {note}" for note in passed_over))


def ahead_of_the_clock(plans: list[dict] | None, settings: IncrementalSettings, source) -> RunRequest | str:
    """Source rows stamped past the latest standard run's upper limit (a loader whose clock runs
    ahead): a run reads up to its `now`, so they wait. Those whose time has come are due: a run is
    requested for them, once per run they follow. Those still ahead (within a day) are named, for
    the skip reason. Reads the source's log statistics and at most a few files, no JVM."""
    standard = [row for row in plans or [] if row["state"] != RunState.KEYHOLE.value]
    if not standard or settings.session_timestamp not in source.schema().to_arrow().names:
        return ""
    latest = max(standard, key=lambda row: row["upper_limit"])
    now = utcnow()
    first = first_after(source_table_uri(), settings, naive(latest["upper_limit"]), now + AHEAD_LOOKED)  # one read
    if first is None:
        return ""
    if first <= now:
        return RunRequest(run_key=f"due-after-{latest['run_id']}")
    return f"; source rows stamped ahead of the clock come due from {first}, and a run is requested then"


def seen_version(context: SensorEvaluationContext, plans: list[dict] | None, table_id: str) -> int:
    """The newest version of the source table `table_id` that a run has assessed (whoever started
    it: the command line's runs too) or this sensor has requested a run for; -1: none."""
    assessed = last_assessed(plans, table_id)
    return max(int(context.cursor) if context.cursor else -1, assessed.version if assessed else -1)


def keyhole_request(instance: DagsterInstance, rows: Stranded) -> RunRequest | str:
    """A keyhole run over the range of source rows behind the cursor (the manifest does not move),
    requested once per range, and retried once as a standard run's window is. When its retry ends
    without success too, the range is an operator's: the note says so, and the sensor goes on to
    new loads rather than requesting the range again on every tick."""
    config = {"lower": rows.start.isoformat(), "upper": rows.end.isoformat()}
    request = {"run_config": {"ops": {NEW_EVENT_LIMITS: {"config": config}}},
               "tags": {KEYHOLE_TAG: f"{config['lower']}..{config['upper']}"}}
    latest = next(iter(instance.get_runs(RunsFilter(job_name=INCREMENTAL_JOB, tags=request["tags"]), limit=1)), None)
    if latest is None or latest.status not in ENDED_WITHOUT_SUCCESS:
        return RunRequest(run_key=f"keyhole-{rows.run_id}-{config['lower']}-{config['upper']}", **request)
    return retried_once(latest, **request) or (
        f"keyhole runs {latest.tags[RETRY_TAG]} and its retry {latest.run_id} ended without success over the "
        f"source rows behind the cursor from {rows.start} to {rows.end}: look at them in the UI, then `{rows.command}`")


def retry_of_the_last_run(instance: DagsterInstance) -> RunRequest | SkipReason | None:
    """When the latest incremental run (a keyhole's passed over) was canceled (a Terminate, a lease
    refused) or failed, its window is due again: one run requested for it, once. A retry that ends
    so too is not retried again: its failure is what to look at, and the skip reason says so.
    None: the latest run succeeded, or there is none."""
    runs = instance.get_runs(filters=RunsFilter(job_name=INCREMENTAL_JOB), limit=KEYHOLES_PASSED_OVER)
    latest = next((run for run in runs if KEYHOLE_TAG not in run.tags), None)
    if latest is None or latest.status not in ENDED_WITHOUT_SUCCESS:
        return None
    how = "canceled" if latest.status == DagsterRunStatus.CANCELED else "failed"
    return retried_once(latest) or SkipReason(
        f"Run {latest.run_id} {how}, and it was already the retry of run {latest.tags[RETRY_TAG]}: "
        "look at it in the UI, then materialize incremental_job (or wait for the next load)")


def retried_once(run: DagsterRun, run_config: dict | None = None, tags: dict | None = None) -> RunRequest | None:
    """The request that runs `run` (canceled or failed) again, once: None when it was itself a retry."""
    if RETRY_TAG in run.tags:
        return None
    return RunRequest(run_key=f"retry-of-{run.run_id}", run_config=run_config, tags={**(tags or {}), RETRY_TAG: run.run_id})


def catch_up_key(instance: DagsterInstance, state: StateStore, models: list[str]) -> str | None:
    """The run key of the next catch-up run, or None when none is due: the latest run succeeded and
    its batch had source events past its window, or a full refresh or a plan emptied the manifest
    row of one of the incremental `models` (they are rebuilt). Each key is requested once; a
    run that failed is retried by retry_of_the_last_run, not from here. Keyhole runs are passed
    over: their window is not the cursor's."""
    recent = instance.fetch_materializations(AssetKey(EVENTS_THIS_RUN), limit=KEYHOLES_PASSED_OVER).records
    keyhole = MetadataValue.text(RunState.KEYHOLE.value)
    standard = [r.event_log_entry for r in recent if r.asset_materialization.metadata.get("run_state") != keyhole]
    latest = standard[0] if standard else None
    caught_up = latest.asset_materialization.metadata.get("caught_up") if latest is not None else None
    if caught_up is not None and not caught_up.value:
        run = instance.get_run_by_id(latest.run_id)
        if run is None or run.status == DagsterRunStatus.SUCCESS:
            return f"catch-up-after-{latest.run_id}"
    emptied = table_version(state.uri(INCREMENTAL_MANIFEST))
    if latest is not None and emptied is not None and set(models) - set(state.entries()):
        return f"rebuild-after-manifest-v{emptied}"
    return None


@requesting_sensor(
    job_name=DAILY_JOB,
    description="Requests daily_aggregates runs for the days the daily aggregation manifest marks "
    "to_process: one run per range of consecutive days, each request made once; the last range's run "
    "also writes attributes and attributes_history.",
)
def daily_partitions_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    waiting = plan_waits(context, settings)
    if waiting is not None:
        return waiting
    state = StateStore()
    version = table_version(state.uri(DAILY_MANIFEST))
    runs = daily_runs(state.days(), utcnow().date())
    if not runs:
        return SkipReason("No day is marked to_process")
    return [
        RunRequest(run_key=f"daily-{first}-{last}-manifest-v{version}", tags=days_window_tags(first, last),
                   asset_selection=None if attributes else [AssetKey(DAILY_AGGREGATES)])
        for first, last, attributes in runs
    ]


@requesting_sensor(
    job_name=APPLY_PLAN_JOB,
    description="With apply_additive_changes, requests apply_plan_job when the settings add or remove "
    "attributes and nothing else; every other change waits for an operator's apply.",
)
def additive_changes_sensor(context: SensorEvaluationContext, settings: IncrementalSettings):
    changes, current = pending_plan(settings, StateStore(), known_incremental(context))
    if changes.empty:
        return SkipReason("Every table was built under the current settings")
    if not (changes.additive_only and settings.apply_additive_changes):
        return SkipReason("A plan waits for an operator (incremental-assets apply, or apply_plan_job): "
                          + " ".join(changes.describe()))
    return RunRequest(run_key="apply-" + "-".join(current[change.table].digest for change in changes.changes))


@requesting_sensor(
    name="attributes_after_daily_aggregates",
    asset_selection=AssetSelection.assets(*FROM_DAILY),
    description="Requests attributes and attributes_history once a change to daily_aggregates is done, whichever "
    "surface made it (a partition backfill from the UI, dagster asset materialize); daily_job writes all three in one run.",
)
def attributes_after_daily_aggregates(context: SensorEvaluationContext):
    """The tables behind daily_aggregates in the event log (hooks.behind_daily_aggregates), once
    nothing that writes them is in flight."""
    instance = context.instance
    behind = behind_daily_aggregates(instance)
    if not behind:
        return SkipReason("No change to daily_aggregates since attributes and attributes_history were written")
    writing = {AssetKey(DAILY_AGGREGATES), *(AssetKey(key) for key in FROM_DAILY)}
    if any(run.job_name == DAILY_JOB or writing & set(run.asset_selection or ()) for run in runs_in_flight(instance)):
        return SkipReason("A run that writes daily_aggregates, attributes or attributes_history is in flight")
    if instance.get_backfills(status=BulkActionStatus.REQUESTED):
        return SkipReason("A backfill is in progress: attributes and attributes_history follow once it is done")
    daily = instance.fetch_materializations(AssetKey(DAILY_AGGREGATES), limit=1).records[0]
    key = unused_key(instance, f"attributes-after-{daily.storage_id}")
    return key if isinstance(key, SkipReason) else RunRequest(run_key=key, asset_selection=behind)


def unused_key(instance: DagsterInstance, key: str) -> str | SkipReason:
    """A run key no run has used for this change yet: Dagster drops a request under a used one
    without a word. A used key whose run succeeded while the tables are still behind (their
    materializations wiped) is followed by the next one; a failed or canceled one is for a person
    to look at, and the skip says so."""
    while runs := instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: key}), limit=1):
        if runs[0].status != DagsterRunStatus.SUCCESS:
            return SkipReason(f"Run {runs[0].run_id} for this change to daily_aggregates ended {runs[0].status.value}: "
                              "look at it, then materialize attributes and attributes_history")
        key = f"{key}-after-{runs[0].run_id}"
    return key


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(
        jobs=[incremental_job, daily_job],
        schedules=[hourly_incremental_schedule],
        sensors=[every(settings.sensor_interval_seconds, evaluation, declared) for evaluation, declared in REQUESTING],
    )
