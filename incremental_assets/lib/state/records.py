"""The rows of the two manifests, as plain values: what the state store reads and writes, and what
the incremental rules (lib/incremental) compute from and into."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime


@dataclass(frozen=True)
class ManifestEntry:
    model: str
    last_success: datetime | None = None
    last_upper: datetime | None = None
    first_success: datetime | None = None

    @property
    def position(self) -> datetime | None:
        """How far the asset has got: its last processed event, or the end of a later empty window."""
        known = [t for t in (self.last_success, self.last_upper) if t is not None]
        return max(known) if known else None


# The daily manifest's statuses of a day.
PROCESSED = "processed"


TO_PROCESS = "to_process"


DEFERRED = "deferred"


BEYOND_HORIZON = "beyond_horizon"


@dataclass(frozen=True)
class DayStatus:
    """One row of the daily aggregation manifest."""

    event_date: date
    processed_events: int = 0
    pending_late_events: int = 0
    late_events_total: int = 0
    max_load_tstamp: datetime | None = None
    max_delay_hours: float = 0.0
    status: str = TO_PROCESS
    last_processed_at: datetime | None = None
    last_run_id: str | None = None
