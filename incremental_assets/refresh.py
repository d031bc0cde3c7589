"""Full refresh (SPEC §8): every table built from the source, and both manifests, are emptied so
that the next runs rebuild them from start_date. Only with `allow_refresh`; otherwise a clear error,
and nothing is dropped.

Rows are deleted (deltalake, no JVM), not directories: tables keep their schema, properties and
history, object stores need no file-system calls, and the daily manifest's record of the
filtered_events version it has counted stays true (the rebuild's inserts come after it). The
run log is kept, and the refresh holds its lease while it deletes.
"""

from __future__ import annotations

from uuid import uuid4

from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets.delta_tables import deltalake_reads
from incremental_assets.logic.run_log import PROCESSED
from incremental_assets.names import BASE_GROUP, DAILY_GROUP, INCREMENTAL_GROUP, NEW_EVENT_LIMITS
from incremental_assets.resources.manifests import DAILY_MANIFEST, INCREMENTAL_MANIFEST, ManifestResource
from incremental_assets.run_log import alive_in
from incremental_assets.settings import IncrementalSettings


class RefreshNotAllowed(ValueError):
    pass


def derived_tables(settings: IncrementalSettings) -> list[str]:
    """The tables a refresh empties: the assets of the base, incremental and daily groups (not the
    run records of new_event_limits), and the manifests."""
    from incremental_assets.definitions import build_definitions

    graph = build_definitions(settings).resolve_asset_graph()
    groups = {BASE_GROUP, INCREMENTAL_GROUP, DAILY_GROUP}
    assets = {key.path[-1] for key in graph.materializable_asset_keys if graph.get(key).group_name in groups}
    return sorted((assets - {NEW_EVENT_LIMITS}) | {INCREMENTAL_MANIFEST, DAILY_MANIFEST})


def refresh(settings: IncrementalSettings, instance: DagsterInstance) -> dict[str, int]:
    """Empty the derived tables under the run log's lease; rows deleted per table."""
    if not settings.allow_refresh:
        raise RefreshNotAllowed(
            "A full refresh deletes every row of the manifests and of the tables built from the source. "
            "Set allow_refresh to true to allow it (--set allow_refresh=true). Nothing was dropped."
        )
    manifest = ManifestResource()
    tables = [table for table in derived_tables(settings) if deltalake_reads(manifest.uri(table))]
    run_id = f"refresh-{uuid4()}"
    manifest.acquire(run_id, tables, None, alive_in(instance))
    deleted = {}
    for table in tables:
        metrics = DeltaTable(manifest.uri(table)).delete()
        deleted[table] = int(metrics.get("num_deleted_rows", 0))
        manifest.record(run_id, table, PROCESSED, {"rows_updated": deleted[table]}, message="full refresh: rows deleted")
    return deleted
