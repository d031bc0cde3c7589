"""Full refresh: every table built from the source, and both manifests, are emptied so
that the next runs rebuild them from start_date. Only with `allow_refresh`; otherwise a clear error,
and nothing is dropped.

Two ways in: `incremental-assets refresh` (empties, then runs until caught up), and `refresh_job`
(defs/operations.py) from the launchpad with `allow_refresh: true` in the settings' config (empties; the source sensor
then requests incremental runs until the rebuild is caught up).

Rows are deleted (deltalake, no JVM), not directories: tables keep their schema, properties and
history, object stores need no file-system calls, and the daily manifest's record of the
filtered_events version it has counted stays true (the rebuild's inserts come after it). The
run log is kept, and the refresh holds its lease while it deletes.
"""

from typing import Iterable
from uuid import uuid4

from dagster import DagsterInstance

from incremental_assets.lib.catalog import BUILT_IN_INCREMENTAL, BY_NAME, STATE_STORE, refreshed_tables
from incremental_assets.lib.delta.log import table_exists
from incremental_assets.lib.delta.write import truncate
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.hooks import alive_in
from incremental_assets.lib.state.run_log import PROCESSED
from incremental_assets.lib.state.store import StateStore


class RefreshNotAllowed(ValueError):
    pass


def refresh(
    settings: IncrementalSettings, instance: DagsterInstance, incremental: Iterable[str] = BUILT_IN_INCREMENTAL,
    run_id: str | None = None,
) -> dict[str, int]:
    """Empty the tables built from the source (the catalog's, and `incremental`: the definitions'
    incremental assets) under the run log's lease (held as `run_id`); rows deleted per table."""
    if not settings.allow_refresh:
        raise RefreshNotAllowed(
            "A full refresh deletes every row of the manifests and of the tables built from the source. "
            "Set allow_refresh to true to allow it (--set allow_refresh=true). Nothing was dropped."
        )
    state = StateStore()
    tables = [table for table in refreshed_tables(incremental) if table_exists(state.uri(table))]
    run_id = run_id or f"refresh-{uuid4()}"
    state.acquire(run_id, tables, None, alive_in(instance))
    # The asset tables through the write module (each takes the current schema at its next write),
    # the manifests and fingerprints through the state store.
    deleted = {table: truncate(state.uri(table)) for table in tables if BY_NAME.get(table, None) is None
               or BY_NAME[table].writer != STATE_STORE}
    deleted.update({table: rows for table, rows in state.reset().items() if table in tables})
    for table in tables:
        state.record(run_id, table, PROCESSED, {"rows_updated": deleted[table]}, message="full refresh: rows deleted")
    return deleted


