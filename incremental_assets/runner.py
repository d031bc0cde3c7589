"""Running the incremental job in-process (CLI, demo) and previewing the next run without writing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets import environment
from incremental_assets.incremental import INCREMENTAL_JOB
from incremental_assets.logic.limits import RunLimits, run_limits
from incremental_assets.resources.manifests import ManifestResource
from incremental_assets.settings import IncrementalSettings

MAX_CATCH_UP_RUNS = 1000


@dataclass
class RunSummary:
    run_id: str
    success: bool
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)

    def value(self, asset: str, key: str, default: Any = None) -> Any:
        return self.metadata.get(asset, {}).get(key, default)

    @property
    def caught_up(self) -> bool:
        return self.value("new_event_limits", "upper_limit") == self.value("new_event_limits", "now")

    def describe(self) -> str:
        limits = self.metadata.get("new_event_limits", {})
        parts = [
            f"{limits.get('run_state', '?'):<12}",
            f"[{limits.get('lower_limit')} .. {limits.get('upper_limit')}]",
            f"events this run {self.value('events_this_run', 'events_found', 0):>6}",
            f"duplicates dropped {self.value('events_this_run', 'duplicates_dropped', 0):>4}",
            f"new events {self.value('filtered_events', 'new_events', 0):>6}",
            f"already stored {self.value('filtered_events', 'already_stored', 0):>5}",
            f"sessions quarantined {self.value('quarantined_sessions', 'sessions_newly_quarantined', 0)}",
        ]
        return "  ".join(parts)


def settings_run_config(settings: IncrementalSettings) -> dict[str, Any]:
    values = {name: getattr(settings, name) for name in IncrementalSettings.model_fields}
    return {"resources": {"settings": {"config": values}}}


def run_incremental(
    settings: IncrementalSettings,
    lower: str | None = None,
    upper: str | None = None,
    now: str | None = None,
    instance: DagsterInstance | None = None,
) -> RunSummary:
    """One run of the incremental job in this process, recorded in the Dagster instance."""
    from incremental_assets.definitions import defs

    limits_config = {k: v for k, v in {"lower": lower, "upper": upper, "now": now}.items() if v is not None}
    run_config = settings_run_config(settings)
    run_config["ops"] = {"new_event_limits": {"config": limits_config}}
    if instance is None:
        environment.dagster_home()
        instance = DagsterInstance.get()
    result = defs.resolve_job_def(INCREMENTAL_JOB).execute_in_process(
        run_config=run_config, instance=instance, raise_on_error=False
    )
    metadata = {
        event.asset_key.path[-1]: {k: v.value for k, v in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }
    return RunSummary(result.run_id, result.success, metadata)


def run_until_caught_up(settings: IncrementalSettings, report=print, **kwargs) -> list[RunSummary]:
    """Runs until one's window reaches its 'now': every source event loaded so far was inside one."""
    summaries = []
    for _ in range(MAX_CATCH_UP_RUNS):
        summary = run_incremental(settings, **kwargs)
        summaries.append(summary)
        report(summary.describe())
        if not summary.success or summary.caught_up:
            return summaries
    raise RuntimeError(f"Not caught up after {MAX_CATCH_UP_RUNS} runs: raise backfill_limit_days")


@dataclass
class Preview:
    limits: RunLimits
    models: list[str]
    new_events: int
    event_days: list[str]

    def describe(self) -> str:
        lines = [*self.limits.log_lines, f"Incremental assets: {', '.join(self.models)}"]
        lines.append(f"Source events in the window: {self.new_events}")
        lines.append(f"Event days they fall on: {', '.join(self.event_days) or 'none'}")
        return "\n".join(lines)


def preview(settings: IncrementalSettings, now: datetime | None = None) -> Preview:
    """The next run's state, limits, new events and days, read without Spark and writing nothing."""
    from incremental_assets.definitions import incremental

    models = sorted(asset.key.path[-1] for asset in incremental)
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    entries = ManifestResource().entries()
    limits = run_limits(
        entries, models, settings.start, settings.backfill_limit_days, settings.lookback_window_hours, now
    )
    source = DeltaTable(environment.source_table_uri()).to_pyarrow_dataset()
    ts = pc.field(settings.session_timestamp)
    in_window = (ts >= _utc(limits.lower)) & (ts <= _utc(limits.upper))
    table = source.to_table(columns=["derived_tstamp"], filter=in_window)
    days = sorted({str(d.date()) for d in table.column("derived_tstamp").to_pylist() if d is not None})
    return Preview(limits, models, table.num_rows, days)


def _utc(moment: datetime) -> pa.Scalar:
    return pa.scalar(moment.replace(tzinfo=timezone.utc), type=pa.timestamp("us", tz="UTC"))
