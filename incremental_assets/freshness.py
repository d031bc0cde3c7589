"""Freshness (SPEC §8): filtered_events and daily_aggregates turn red in the UI when they have not
been updated within the settings' thresholds, so a stalled loader or a stopped sensor shows.

Built with the library's last-update freshness check builders, which Dagster 1.13 marks as
superseded by FreshnessPolicy (still beta there); they are what the UI shows as asset checks.
"""

import warnings
from datetime import timedelta

from dagster import AssetChecksDefinition, DefaultSensorStatus, SensorDefinition, SupersessionWarning
from dagster import build_last_update_freshness_checks, build_sensor_for_freshness_checks

from incremental_assets.names import DAILY_AGGREGATES, FILTERED_EVENTS
from incremental_assets.settings import IncrementalSettings


def freshness_checks(settings: IncrementalSettings) -> list[AssetChecksDefinition]:
    thresholds = {
        FILTERED_EVENTS: settings.filtered_events_fresh_hours,
        DAILY_AGGREGATES: settings.daily_aggregates_fresh_hours,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)
        return [
            check
            for asset, hours in thresholds.items()
            for check in build_last_update_freshness_checks(assets=[asset], lower_bound_delta=timedelta(hours=hours))
        ]


def freshness_sensor(checks: list[AssetChecksDefinition]) -> SensorDefinition:
    """Evaluates the freshness checks (reads the Dagster instance only: no Spark), on by default."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)
        return build_sensor_for_freshness_checks(
            freshness_checks=checks, minimum_interval_seconds=300, default_status=DefaultSensorStatus.RUNNING
        )
