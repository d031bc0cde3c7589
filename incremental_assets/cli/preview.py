"""`incremental-assets preview`: the next run's state, limits, new events and days, and the source
rows behind the cursor that wait for a keyhole run; read without Spark and without writing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

import pyarrow as pa
import pyarrow.compute as pc

from incremental_assets.cli.runner import incremental_of
from incremental_assets.defs.base.limits import plan_run
from incremental_assets.lib import environment
from incremental_assets.lib.catalog import FILTERED_EVENTS, NEW_EVENT_LIMITS
from incremental_assets.lib.delta.log import read_rows, reading, scan, stored_table
from incremental_assets.lib.incremental.days import arrivals_from_rows, days_to_process
from incremental_assets.lib.incremental.limits import RunLimits, run_limits
from incremental_assets.lib.incremental.run_plan import plan_table, waiting_behind_cursor
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.arrivals import Stranded
from incremental_assets.lib.source.contract import load_days, loaded_between, require_processable
from incremental_assets.lib.state.fingerprints import Plan
from incremental_assets.lib.state.settings_plan import pending_plan
from incremental_assets.lib.state.records import TO_PROCESS
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.utc import UTC_TIMESTAMP, aware, utcnow


@dataclass
class Preview:
    limits: RunLimits
    models: list[str]
    window_events: int
    new_events: int
    days_to_recompute: list[str]
    plan: Plan = field(default_factory=Plan)
    behind: list[Stranded] = field(default_factory=list)  # source rows behind the cursor, by range

    def describe(self) -> str:
        return "\n".join(
            [
                *([] if self.plan.empty else [*self.plan.describe(), ""]),
                *self.limits.log_lines,
                f"Incremental assets: {', '.join(self.models)}",
                f"Source events in the window: {self.window_events} ({self.new_events} not yet in filtered_events)",
                f"Days that would be recomputed: {', '.join(self.days_to_recompute) or 'none'}",
                *self._waiting(),
            ]
        )

    def _waiting(self) -> list[str]:
        if not self.behind:
            return []
        rows = sum(s.rows for s in self.behind)
        first, last = min(s.start for s in self.behind), max(s.end for s in self.behind)
        return [
            f"Source rows behind the cursor: {rows} (cursor {first} .. {last}) wait for a keyhole run over that range; "
            "the source sensor requests it once a run has counted them, or run:",
            *(f"  {s.command}" for s in self.behind),
        ]


def preview(settings: IncrementalSettings, now: datetime | None = None) -> Preview:
    """The next run's state, limits, new events and days to recompute: read without Spark, no writes.

    New events are the window's events whose event_id filtered_events does not hold yet; the days
    follow from them by the day-selection rule (before session completion and filters, so an
    estimate that errs on the side of showing a day). Rows behind the cursor are those the warn
    check `source_rows_behind_the_cursor` will name once the next run has counted what arrived."""
    incremental = incremental_of(settings)
    models = sorted(incremental)
    now = now or utcnow()
    require_processable(environment.source_table_uri(), settings)
    state = StateStore()
    entries = state.entries()
    limits = run_limits(entries, models, settings.start, settings.backfill_limit_days, settings.lookback_window_hours, now)
    source = stored_table(environment.source_table_uri()).to_pyarrow_dataset()
    ts = pc.field(settings.session_timestamp)
    in_window = (ts >= _utc(limits.lower)) & (ts <= _utc(limits.upper)) & pc.field("event_id").is_valid()
    load_day = settings.source_load_date_column
    if load_day in source.schema.names:  # the load days a run reads, as it reads them
        in_window = in_window & loaded_between(load_day, *load_days(settings.session_timestamp, limits.lower, limits.upper))
    with reading(environment.source_table_uri()):
        window = source.to_table(columns=["event_id", "derived_tstamp", "load_tstamp"], filter=in_window).to_pylist()
    stored = _stored_event_ids(state.uri(FILTERED_EVENTS), {r["derived_tstamp"].date() for r in window if r["derived_tstamp"]})
    new = [
        {**r, "event_date": r["derived_tstamp"].date()}
        for r in window
        if r["event_id"] not in stored and r["derived_tstamp"] is not None
    ]
    changed = days_to_process(
        arrivals_from_rows(new), state.days(), limits.upper, settings.start, settings.reprocess_days,
        settings.min_rows_to_process, "preview",
    )
    days = sorted(str(d) for d, status in changed.items() if status.status == TO_PROCESS)
    changes, _ = pending_plan(settings, state, incremental)
    plans = read_rows(state.uri(NEW_EVENT_LIMITS)) or []
    next_run, _ = plan_run("preview", limits, settings, entries, models, environment.source_table_uri(), plans, state)
    behind = waiting_behind_cursor([*plans, *plan_table(next_run).to_pylist()], state.run_log)
    return Preview(limits, models, len(window), len(new), days, changes, behind)


def _stored_event_ids(uri: str, days: set[date]) -> set[str]:
    if not days:
        return set()
    table = stored_table(uri)
    if table is None:
        return set()
    with reading(uri):
        ids = scan(table, ["event_id"], [("event_date", "in", sorted(days))])
    return set(ids.column("event_id").to_pylist())


def _utc(moment: datetime) -> pa.Scalar:
    return pa.scalar(aware(moment), type=UTC_TIMESTAMP)
