"""The stranded-late-events check warns, and only when days wait beyond the horizon."""

from datetime import date

from dagster import AssetCheckSeverity

from incremental_assets.checks import late_events_stranded_beyond_horizon
from incremental_assets.logic.days import BEYOND_HORIZON, PROCESSED, DayStatus
from incremental_assets.resources.manifests import ManifestResource


def test_stranded_late_events_warn(spark, warehouse):
    manifest = ManifestResource()
    manifest.save_days([DayStatus(date(2024, 3, 1), processed_events=10, status=PROCESSED)], consumed_version=1)
    assert late_events_stranded_beyond_horizon(manifest=manifest).passed

    manifest.save_days([DayStatus(date(2024, 2, 1), pending_late_events=7, status=BEYOND_HORIZON)])
    result = late_events_stranded_beyond_horizon(manifest=manifest)
    assert not result.passed and result.severity == AssetCheckSeverity.WARN
    assert result.metadata["pending_late_events"].value == 7
    assert manifest.consumed_version() == 1
