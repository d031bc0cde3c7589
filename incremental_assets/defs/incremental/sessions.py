"""sessions: one row per session, recomputed whole whenever a run touches it; built with
the same extension point a user's own incremental asset uses."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.lib.delta.spec import Rows
from incremental_assets.lib.incremental.asset import incremental_asset
from incremental_assets.lib.incremental.limits import RunLimits
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.transforms import sessions as T


@incremental_asset(
    write_mode="upsert", keys=["session_identifier"], partition_by=["start_date"], one_row_per_key=True  # grouped by session
)
def sessions(events: DataFrame, limits: RunLimits, settings: IncrementalSettings) -> Rows:
    """One row per session, recomputed whole from all its events whenever a run touches it.
    Partitioned by start day: the upsert reads the sessions that started from the batch's first
    day minus upsert_lookback_days on (a session's start only moves earlier), not all history."""
    rows = T.session_rows(events)
    first = events.agg(F.min("derived_tstamp")).first()[0]
    # no event has a time: no floor, the upsert reads every session
    return Rows(rows, merge_floor=settings.upsert_floor(first.date()) if first is not None else None)
