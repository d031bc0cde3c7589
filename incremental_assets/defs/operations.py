"""What an operator launches: a full refresh, the plan of a settings change, table maintenance, an erasure."""

from datetime import datetime, timezone

from dagster import (
    Config,
    DefaultScheduleStatus,
    Definitions,
    Failure,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from incremental_assets.lib.catalog import ERASED_BY, ERASURE_LOG, WAREHOUSE_POOL, known_incremental, maintained_tables
from incremental_assets.lib.delta.log import table_exists
from incremental_assets.lib.environment import warehouse_root
from incremental_assets.lib.metadata import markdown_table
from incremental_assets.lib.upkeep.apply import apply_plan
from incremental_assets.lib.upkeep.erasure import erase, purge, record_gone
from incremental_assets.lib.upkeep.maintenance import maintain
from incremental_assets.lib.upkeep.refresh import RefreshNotAllowed, refresh
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.hooks import RUN_LOG_HOOKS, alive_in
from incremental_assets.lib.state.settings_plan import pending_plan
from incremental_assets.lib.state.run_log import PROCESSED
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import utcnow


class RefreshConfig(Config):
    """No default: the launchpad shows the field missing until the warehouse's path is typed."""

    confirm_warehouse: str = Field(description="Type the warehouse's path to confirm that every table built from the "
                                   "source in it is emptied (the run's metadata and the run log name it)")


@op(out=Out(Nothing), pool=WAREHOUSE_POOL,
    description="Empty the manifests and every table built from the source (needs allow_refresh, and the "
    "warehouse's path typed in confirm_warehouse).")
def full_refresh(context: OpExecutionContext, config: RefreshConfig, settings: IncrementalSettings) -> Output:
    if config.confirm_warehouse.rstrip("/") != warehouse_root().rstrip("/"):
        raise Failure(f"Nothing was dropped: confirm_warehouse is {config.confirm_warehouse!r}, and this run's warehouse "
                      f"is {warehouse_root()!r}. Type that path to refresh it.", allow_retries=False)
    try:
        deleted = refresh(settings, context.instance, known_incremental(context), run_id=context.run_id)
    except RefreshNotAllowed as refused:
        raise Failure(str(refused), allow_retries=False) from None
    return Output(None, metadata={
        "warehouse": MetadataValue.path(warehouse_root()),
        "rows_deleted": markdown_table(["table", "rows deleted"], sorted(deleted.items())),
        "next": f"incremental runs rebuild from start_date {settings.start_date} (the source sensor requests them)",
    })


@job(
    hooks=RUN_LOG_HOOKS,
    description="Full refresh: empties the manifests and derived tables; incremental runs then rebuild from "
    "start_date. In the launchpad, set allow_refresh to true under resources > settings > config, and type the "
    "warehouse's path in confirm_warehouse under ops > full_refresh > config.",
)
def refresh_job():
    full_refresh()


class ApplyConfig(Config):
    forward_only: bool = False


@op(out=Out(Nothing), pool=WAREHOUSE_POOL,
    description="Carry out the plan between the tables' fingerprints and the current settings.")
def apply_settings_plan(
    context: OpExecutionContext, config: ApplyConfig, settings: IncrementalSettings, state: StateStore,
    spark: SparkResource,
) -> Output:
    incremental = known_incremental(context)
    changes, current = pending_plan(settings, state, incremental, config.forward_only)
    if changes.empty:
        return Output(None, metadata={"plan": "nothing to apply: every table was built under the current settings"})
    before = apply_plan(settings, changes, current, state, lambda: spark.spark_session, context.run_id,
                        alive_in(context.instance), utcnow().date(), incremental)
    return Output(None, metadata={
        "plan": MetadataValue.md("\n".join(f"- {change.describe()}" for change in changes.changes)),
        "rows_before": markdown_table(["table", "rows before"], sorted(before.items())),
        "next": "the source sensor requests the runs that rebuild what the plan emptied; the daily sensor the days it marked",
    })


@job(
    hooks=RUN_LOG_HOOKS,
    description="Apply the plan of a settings change (incremental-assets plan shows it): launch with "
    "ops.apply_settings_plan.config.forward_only true to rebuild nothing and apply it from now on.",
)
def apply_plan_job():
    apply_settings_plan()


@op(out=Out(Nothing), pool=WAREHOUSE_POOL,
    description="Compact and vacuum every warehouse table (see incremental_assets/maintenance.py).")
def maintain_tables(context: OpExecutionContext, state: StateStore, settings: IncrementalSettings) -> Output:
    retention = settings.maintenance_retention_hours
    known = maintained_tables(known_incremental(context))
    unknown = sorted(set(settings.maintenance_zorder_by) - set(known))
    if unknown:
        raise Failure(f"maintenance_zorder_by names {unknown}, which are not warehouse tables; known: {known}")
    tables = [name for name in known if table_exists(state.uri(name))]
    run_id = context.run_id
    state.acquire(run_id, tables, None, alive_in(context.instance))
    passes = []
    for name in tables:  # a failure closes what is still open: the job's failure hook
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        result = maintain(state, name, retention, now, settings.maintenance_zorder_by.get(name, []))
        passes.append(result)
        state.record(run_id, name, PROCESSED, {}, message=f"files {result.files_before} -> {result.files_after} {result.note}".strip())
    # Erasures whose rows no file holds any more, now that VACUUM has run: their audit records it.
    gone = record_gone(state)
    columns = ["table", "files before", "files after", "compacted from", "vacuumed", "note"]
    rows = [[p.table, p.files_before, p.files_after, p.compacted_from, p.vacuumed, p.note] for p in passes]
    return Output(None, metadata={
        "tables": markdown_table(columns, rows),
        "files_before": sum(p.files_before for p in passes),
        "files_after": sum(p.files_after for p in passes),
        "retention_hours": retention,
        "erasures_physically_gone": MetadataValue.json(gone),
    })


@job(hooks=RUN_LOG_HOOKS, description="Compact small files and vacuum old ones in every warehouse table.")
def maintenance_job():
    maintain_tables()


class ForgetConfig(Config):
    """No default: the launchpad shows the keys missing until they are typed."""

    keys: list[str] = Field(description="The identifiers of the people to erase (values of `by`)")
    by: str = Field(default="attribute_key", description=f"The column the keys are values of: one of {', '.join(ERASED_BY)}")
    source: bool = Field(default=False, description="Delete their rows from the source table too (else every run drops them)")
    purge: bool = Field(default=False, description="Then vacuum at once the tables that still hold files with erased rows, "
                        "instead of waiting for maintenance_job's retention, and cut their logs once a request is gone: their time "
                        "travel ends there")


@op(out=Out(Nothing), pool=WAREHOUSE_POOL,
    description="Erase people's rows from every table that holds them, and record the request in erasure_log "
    "(salted hashes only); later runs drop their events (docs/operations.md, Erasure).")
def forget_keys(context: OpExecutionContext, config: ForgetConfig, settings: IncrementalSettings, spark: SparkResource) -> Output:
    try:
        erasure = erase(settings, config.keys, config.by, spark.spark_session, context.instance, known_incremental(context),
                        run_id=context.run_id, source=config.source)
    except ValueError as refused:
        raise Failure(str(refused), allow_retries=False) from None
    purged = purge(StateStore(), context.instance, context.run_id) if config.purge else None
    return Output(None, metadata={
        "request_id": erasure.request_id,
        "rows_erased": markdown_table(["table", "rows erased"], sorted(erasure.rows.items())),
        "not_covered": MetadataValue.json(erasure.not_covered),
        "audit": MetadataValue.path(StateStore().uri(ERASURE_LOG)),
        **({} if purged is None else {
            "tables_purged": MetadataValue.json(purged.vacuumed), "purge_waiting": MetadataValue.json(purged.waiting),
            "erasures_physically_gone": MetadataValue.json(purged.gone), "logs_cut": MetadataValue.json(purged.log_cut)}),
    })


@job(hooks=RUN_LOG_HOOKS, description="Forget people: in the launchpad, list their keys under ops > forget_keys > config.")
def forget_job():
    forget_keys()


daily_table_maintenance = ScheduleDefinition(
    name="daily_table_maintenance",
    job=maintenance_job,
    cron_schedule="30 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Table maintenance once a day; off until you start it.",
)


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(jobs=[refresh_job, apply_plan_job, maintenance_job, forget_job], schedules=[daily_table_maintenance])
