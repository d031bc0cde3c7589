"""The run log's rules, free of storage.

Each asset of each run gets `Processing` when the run starts, then `Processed` or `Failed`. A
`Processing` without its pair is the lease: while its run is alive, no other run may write. A
lease whose run is gone is recovered (closed as `Failed`). Unlike the seed, a `Failed` record does
not lock the warehouse: every write is idempotent, so the next run simply redoes the work;
`Resolved` records that an operator has looked at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

PROCESSING, PROCESSED, FAILED, RESOLVED = "Processing", "Processed", "Failed", "Resolved"

# Output metadata of a step that accounts for every row it read: rows_read = rows_kept + skipped.
ROWS_READ = "rows_read"
ROWS_KEPT = "rows_kept"  # carried forward (passed on to the next step, or stored)
# Output metadata that counts data a step did not carry forward, and why.
SKIP_REASONS = {
    "duplicates_dropped": "duplicate",
    "beyond_session_cap": "beyond_session_cap",
    "dropped_late_sent": "late_sent",
    "dropped_quarantined_session": "quarantined",
    "before_start_date_dropped": "before_start_date",
    "dropped_null_event_id": "null_event_id",
    "dropped_null_session_id": "null_session_id",
    "dropped_null_dvce_tstamps": "null_dvce_tstamps",
    "dropped_null_derived_tstamp": "null_derived_tstamp",
    "dropped_app_filtered": "app_filtered",
    "dropped_erased_user": "erased_user",  # a person `forget` erased
    "null_cursor_rows": "null_cursor",
    "filtered_out_by_event_name": "event_name_filtered",
    "late_events_deferred": "late_deferred",
    "late_events_beyond_horizon": "late_beyond_horizon",
    # rows that arrived in the source where no standard window will read them (logic.arrivals)
    "arrived_cursor_before_start_date": "cursor_before_start_date",
    "arrived_cursor_in_future": "cursor_in_future",
    "arrived_behind_cursor": "behind_cursor",
}


@dataclass(frozen=True)
class Record:
    run_id: str
    asset: str
    status: str
    recorded_at: datetime
    pid: int | None = None
    host: str | None = None


def open_leases(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Processing records without a later Processed or Failed of the same run and asset, by run."""
    latest: dict[tuple[str, str], Record] = {}
    for record in sorted(records, key=lambda r: r.recorded_at):
        if record.status in (PROCESSING, PROCESSED, FAILED):
            latest[(record.run_id, record.asset)] = record
    leases: dict[str, list[Record]] = {}
    for record in latest.values():
        if record.status == PROCESSING:
            leases.setdefault(record.run_id, []).append(record)
    return leases


def lease_holder(leases: Mapping[str, list[Record]]) -> str | None:
    """The run that holds the lease: the one whose Processing came first (ties: the smaller run id).
    Every writer reads the same records, so all agree on it."""
    if not leases:
        return None
    return min(leases, key=lambda run: (min(r.recorded_at for r in leases[run]), run))


def skip_reasons(metadata: Mapping[str, Any]) -> dict[str, int]:
    """The non-zero skip counts among a step's output metadata, under the run log's reason names."""
    return {reason: int(metadata[key]) for key, reason in SKIP_REASONS.items() if metadata.get(key)}


def succeeded(records: Iterable[Record]) -> set[str]:
    """The runs among `records` that finished every asset they started: each Processing has its
    Processed, and nothing of theirs Failed."""
    outcomes: dict[str, dict[str, str]] = {}
    for record in sorted(records, key=lambda r: r.recorded_at):
        if record.status in (PROCESSING, PROCESSED, FAILED):
            runs = outcomes.setdefault(record.run_id, {})
            if runs.get(record.asset) != FAILED:
                runs[record.asset] = record.status
    return {run for run, assets in outcomes.items() if assets and all(s == PROCESSED for s in assets.values())}
