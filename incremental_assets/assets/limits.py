"""new_event_limits: the window of this run, decided once (SPEC §4) and handed down the graph."""

from datetime import datetime

from dagster import AssetExecutionContext, Config, Failure, MetadataValue, Output
from pydantic import Field

from incremental_assets.assets import spark_delta_asset
from incremental_assets.atomic_events import SourceContractError, require_identifier_sql, require_processable
from incremental_assets.environment import source_table_uri
from incremental_assets.incremental import incremental_models_in_run
from incremental_assets.io_managers.delta import delta_table
from incremental_assets.logic.limits import RunLimits, keyhole_limits, run_limits
from incremental_assets.names import BASE_GROUP, NEW_EVENT_LIMITS
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.resources.spark import SparkResource
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


def decide_limits(config: LimitsConfig, settings: IncrementalSettings, manifest: ManifestResource, models: list[str]) -> RunLimits:
    """An explicit window (keyhole) or the manifest's next one; `now` is evaluated once, here."""
    if (config.lower is None) != (config.upper is None):
        raise ValueError("A keyhole backfill needs both lower and upper")
    now = _parse("now", config.now) if config.now else utcnow()
    if config.lower is not None:
        return keyhole_limits(_parse("lower", config.lower), _parse("upper", config.upper), now)
    return run_limits(
        manifest.entries(), models, settings.start, settings.backfill_limit_days, settings.lookback_window_hours, now
    )


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
) -> Output[RunLimits]:
    try:  # before this run writes anything, its record and lease included
        require_processable(source_table_uri(), settings)
        if settings.session_identifier_sql or settings.user_identifier_sql:  # Spark parses them
            require_identifier_sql(spark.spark_session, source_table_uri(), settings)
    except SourceContractError as error:
        raise Failure(description=str(error)) from None
    models = incremental_models_in_run(context)
    limits = decide_limits(config, settings, manifest, models)
    for line in limits.log_lines:
        context.log.info(line)
    return Output(
        limits,
        metadata={"state_message": limits.log_lines[0], "incremental_assets": MetadataValue.json(models)},
    )
