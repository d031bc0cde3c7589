"""Everything Dagster loads: the definitions of every module under `defs/`, merged, with the
project's policy applied once.

A module under `defs/` either ends in `defs(settings) -> Definitions`, or declares its assets and
checks at module level (a user's own incremental asset is one such file, and nothing else). The
policy: the in-process executor (a run starts one Spark JVM, not one per step), the command
line's logger, and the freshness checks of the tables with a threshold in the settings, evaluated
in every run that writes their table and, between runs, by their own sensor.
"""

import importlib
import pkgutil
import warnings
from datetime import timedelta
from types import ModuleType

from dagster import (
    BetaWarning,
    DefaultSensorStatus,
    Definitions,
    SupersessionWarning,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
    in_process_executor,
    load_asset_checks_from_modules,
    load_assets_from_modules,
)

from incremental_assets import defs as defs_package
from incremental_assets.lib.catalog import DAILY_AGGREGATES, FILTERED_EVENTS
from incremental_assets.lib.logs import cli_logger
from incremental_assets.lib.settings import IncrementalSettings, load_settings

# Dagster's own copy of a sensor when it binds resources passes a beta parameter: nothing of ours.
warnings.filterwarnings("ignore", message="Parameter `owners` of initializer `SensorDefinition.__init__`", category=BetaWarning)


def defs_modules() -> list[ModuleType]:
    """Every module under defs/, imported (in name order)."""
    names = sorted(m.name for m in pkgutil.walk_packages(defs_package.__path__, f"{defs_package.__name__}.") if not m.ispkg)
    return [importlib.import_module(name) for name in names]


def module_defs(module: ModuleType, settings: IncrementalSettings) -> Definitions:
    if callable(getattr(module, "defs", None)):
        return module.defs(settings)
    return Definitions(assets=load_assets_from_modules([module]), asset_checks=load_asset_checks_from_modules([module]))


def build_definitions(settings: IncrementalSettings | None = None, *more: Definitions) -> Definitions:
    """The project's definitions under `settings` (default: load_settings()), with `more` merged in
    (an embedding, a test's own asset). Loading them reads no table: everything they depend on
    comes from the settings."""
    settings = settings or load_settings()
    merged = Definitions.merge(*(module_defs(module, settings) for module in defs_modules()), *more)
    fresh = freshness_checks(settings)
    return Definitions.merge(
        merged,
        Definitions(
            asset_checks=fresh,
            sensors=[freshness_sensor(fresh)],
            executor=in_process_executor,
            loggers={"cli": cli_logger},
        ),
    )


def freshness_checks(settings: IncrementalSettings):
    """filtered_events and daily_aggregates turn red in the UI when not updated within their
    thresholds, so a stalled loader or a stopped sensor shows. Dagster 1.13 marks these builders
    as superseded by FreshnessPolicy (still beta there); they are what the UI shows as checks."""
    thresholds = {FILTERED_EVENTS: settings.filtered_events_fresh_hours, DAILY_AGGREGATES: settings.daily_aggregates_fresh_hours}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)
        return [
            check
            for asset, hours in thresholds.items()
            for check in build_last_update_freshness_checks(assets=[asset], lower_bound_delta=timedelta(hours=hours))
        ]


def freshness_sensor(checks):
    """Evaluates the freshness checks (reads the Dagster instance only: no Spark), on by default."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)
        return build_sensor_for_freshness_checks(
            freshness_checks=checks, minimum_interval_seconds=300, default_status=DefaultSensorStatus.RUNNING,
            name="freshness_checks_sensor",
        )


defs = build_definitions()
