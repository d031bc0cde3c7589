"""new_event_limits: the window of this run, decided once and kept (SPEC §4)."""

from datetime import datetime

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue
from pydantic import Field

from incremental_assets.assets import spark_delta_asset
from incremental_assets.incremental import incremental_models_in_run, run_key
from incremental_assets.logic.limits import keyhole_limits, run_limits
from incremental_assets.resources.manifests import ManifestResource, RunRecord
from incremental_assets.resources.spark import SparkResource
from incremental_assets.settings import IncrementalSettings
from incremental_assets.utc import naive, utcnow

BASE_GROUP = "incremental_base"


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


@spark_delta_asset(
    group_name=BASE_GROUP,
    description="The run's state (first run, new model, out of sync, standard, keyhole) and its window "
    "[lower, upper] over the incremental assets of the run; one row per run, kept as history.",
)
def new_event_limits(
    context: AssetExecutionContext,
    config: LimitsConfig,
    settings: IncrementalSettings,
    spark: SparkResource,
    manifest: ManifestResource,
) -> MaterializeResult:
    settings.validate_all()
    if (config.lower is None) != (config.upper is None):
        raise ValueError("A keyhole backfill needs both lower and upper")
    key = run_key(context)
    session = spark.session
    record = manifest.run_record(key)
    if record is not None:
        context.log.info(f"Re-executing run {key}: keeping its limits and its 'now' ({record.limits.now})")
    else:
        now = _parse("now", config.now) if config.now else utcnow()
        models = incremental_models_in_run(context)
        if config.lower is not None:
            limits = keyhole_limits(_parse("lower", config.lower), _parse("upper", config.upper), now)
        else:
            entries = manifest.entries()
            limits = run_limits(
                entries, models, settings.start, settings.backfill_limit_days, settings.lookback_window_hours, now
            )
        record = RunRecord(key, limits, tuple(models))
        manifest.record_run(session, record, context.run.run_id)
    for line in record.limits.log_lines:
        context.log.info(line)
    limits = record.limits
    return MaterializeResult(
        metadata={
            "run_state": limits.state.value,
            "state_message": record.limits.log_lines[0],
            "lower_limit": str(limits.lower),
            "upper_limit": str(limits.upper),
            "now": str(limits.now),
            "incremental_assets": MetadataValue.json(list(record.models)),
            "table_uri": MetadataValue.path(manifest.uri("new_event_limits")),
        }
    )
