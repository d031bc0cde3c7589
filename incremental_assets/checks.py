"""Asset checks that read the small manifest tables without a JVM."""

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from incremental_assets.logic.days import stranded
from incremental_assets.resources.manifests import DAILY_MANIFEST, ManifestResource


@asset_check(
    asset=DAILY_MANIFEST,
    description="Warns about late events beyond reprocess_days: they are counted but will only be applied "
    "by a partition backfill of their days (incremental-assets backfill, or the UI).",
)
def late_events_stranded_beyond_horizon(manifest: ManifestResource) -> AssetCheckResult:
    days = stranded(manifest.days())
    pending = sum(d.pending_late_events for d in days)
    return AssetCheckResult(
        passed=not days,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "days": MetadataValue.json([str(d.event_date) for d in days]),
            "pending_late_events": pending,
        },
        description=f"{pending} late events on {len(days)} day(s) wait for a backfill" if days else None,
    )
