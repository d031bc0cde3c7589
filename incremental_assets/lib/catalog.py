"""Every table of the warehouse, once: its name, asset group, writer and keys, whether a
full refresh empties it, and what its content depends on. Definitions, the demo, refresh,
maintenance, plans and tests read this one list; a test holds it against the asset graph. A
user's own incremental assets are not listed: they are found in the definitions and treated as
`sessions` is (extra_incremental below)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from dagster import AssetCheckKey
from dagster._check import CheckError
from dagster._core.errors import DagsterInvalidPropertyError

ATOMIC_EVENTS = "atomic_events"
SOURCE_SUMMARY = "source_load_summary"
NEW_EVENT_LIMITS = "new_event_limits"
LIFECYCLE = "sessions_lifecycle_manifest"
QUARANTINE = "quarantined_sessions"
EVENTS_THIS_RUN = "events_this_run"
FILTERED_EVENTS = "filtered_events"
SESSIONS = "sessions"
DAILY_MANIFEST = "daily_aggregation_manifest"
DAILY_AGGREGATES = "daily_aggregates"
ATTRIBUTES = "attributes"
ATTRIBUTES_HISTORY = "attributes_history"
# What follows daily_aggregates, unpartitioned, recomputed after every change to it.
FROM_DAILY = (ATTRIBUTES, ATTRIBUTES_HISTORY)
INCREMENTAL_MANIFEST = "incremental_manifest"
RUN_LOG = "run_log"
FINGERPRINTS = "table_fingerprints"
ERASURE_LOG = "erasure_log"
# The columns an erasure request may name people by (lib/upkeep/erasure.py): the attribute key, or
# an identifier as filtered_events holds it.
ERASED_BY = ("attribute_key", "user_identifier", "domain_userid", "user_id")

SOURCE_GROUP = "source"
BASE_GROUP = "incremental_base"
INCREMENTAL_GROUP = "incremental"
DAILY_GROUP = "daily"

INCREMENTAL_JOB = "incremental_job"
DAILY_JOB = "daily_job"
SAMPLE_LOAD_JOB = "sample_load_job"
REFRESH_JOB = "refresh_job"
APPLY_PLAN_JOB = "apply_plan_job"
MAINTENANCE_JOB = "maintenance_job"

# Asset tag of the incremental assets: the ones the incremental manifest tracks.
INCREMENTAL_TAG = "incremental_assets/incremental"
# A keyhole run the source sensor requests for rows behind the cursor: its range.
KEYHOLE_TAG = "incremental_assets/keyhole"
# An incremental run's state and window (lower..upper), tagged once decided: the Runs page filters by them.
RUN_STATE_TAG = "incremental_assets/run_state"
WINDOW_TAG = "incremental_assets/window"
# A run the source sensor requests again for one that was canceled or failed: that run's id.
RETRY_TAG = "incremental_assets/retry_of"
# A run the warm worker executes (lib/worker.py): the worker's host:pid, which outlives the run.
WORKER_TAG = "incremental_assets/worker"
# The host:pid of the process executing a run (command line, run worker or warm worker), tagged when
# the run starts: a killed process never reports its run's end, so its absence is how it is told.
PROCESS_TAG = "incremental_assets/process"
# Every asset that writes the warehouse is in this concurrency pool (lib/assets.py), whichever job
# or surface runs it: the run queue starts one such run at a time (dagster.yaml: pools at run
# granularity, limit 1). Outside the queue (an in-process run), the run log's lease refuses a
# second writer.
WAREHOUSE_POOL = "incremental_assets/warehouse"
# Tables with a freshness check (thresholds in the settings), named `freshness_check` on each.
FRESHNESS_CHECKS = [AssetCheckKey.from_user_string(f"{table}:freshness_check") for table in (FILTERED_EVENTS, DAILY_AGGREGATES)]

IO_MANAGER, STATE_STORE, LOADER = "io_manager", "state_store", "loader"

# What a table's content depends on (its fingerprint: lib/state/fingerprints.py). The rules every
# table built from the source depends on; filtered_events keeps only `event_names`; the daily layer
# aggregates per `attribute_key`.
SOURCE_RULES = (
    "start_date", "session_timestamp", "session_identifiers", "session_identifier_sql", "user_identifiers",
    "user_identifier_sql", "max_session_days", "days_late_allowed", "allow_null_dvce_tstamps", "app_ids",
    "allow_null_app_id",
)
EVENT_RULES = (*SOURCE_RULES, "event_names")
DAILY_RULES = (*EVENT_RULES, "attribute_key")


@dataclass(frozen=True)
class Table:
    name: str
    group: str | None  # its asset group; None: a table of the state store, not an asset
    writer: str  # IO_MANAGER (through the write module), STATE_STORE, or LOADER (the source)
    keys: tuple[str, ...] = ()
    refreshed: bool = True  # built from the source: a full refresh empties it
    rules: tuple[str, ...] | None = None  # the settings its content depends on (its fingerprint)
    attributes: bool = False  # ... and the attribute definitions
    rebuilt_whole: bool = False  # ... whose every change rebuilds it whole (its columns are the attributes)


TABLES = (
    Table(ATOMIC_EVENTS, SOURCE_GROUP, LOADER, ("event_id",), refreshed=False),
    Table(SOURCE_SUMMARY, SOURCE_GROUP, IO_MANAGER, ("load_date",), refreshed=False),
    Table(NEW_EVENT_LIMITS, BASE_GROUP, IO_MANAGER, ("run_id",), refreshed=False),  # every run's record, kept
    Table(LIFECYCLE, BASE_GROUP, IO_MANAGER, ("session_identifier",), rules=SOURCE_RULES),
    Table(QUARANTINE, BASE_GROUP, IO_MANAGER, ("session_identifier",), rules=SOURCE_RULES),
    Table(EVENTS_THIS_RUN, BASE_GROUP, IO_MANAGER, ("event_id",)),  # scratch: replaced every run
    Table(FILTERED_EVENTS, INCREMENTAL_GROUP, IO_MANAGER, ("event_id",), rules=EVENT_RULES),
    Table(SESSIONS, INCREMENTAL_GROUP, IO_MANAGER, ("session_identifier",), rules=SOURCE_RULES),
    Table(DAILY_MANIFEST, DAILY_GROUP, STATE_STORE, ("event_date",), rules=EVENT_RULES),
    Table(DAILY_AGGREGATES, DAILY_GROUP, IO_MANAGER, ("attribute_key", "event_date"), rules=DAILY_RULES, attributes=True),
    # Kept by the keys that changed, these two are rebuilt whole on a change of their columns: from
    # daily_aggregates alone, no source data read or dropped.
    Table(ATTRIBUTES, DAILY_GROUP, IO_MANAGER, ("attribute_key",), rules=DAILY_RULES, attributes=True, rebuilt_whole=True),
    Table(ATTRIBUTES_HISTORY, DAILY_GROUP, IO_MANAGER, ("attribute_key", "valid_from"), rules=DAILY_RULES, attributes=True,
          rebuilt_whole=True),
    Table(INCREMENTAL_MANIFEST, None, STATE_STORE, ("model",)),
    Table(RUN_LOG, None, STATE_STORE, refreshed=False),  # kept: the history of every run
    Table(FINGERPRINTS, None, STATE_STORE, ("table",)),
    Table(ERASURE_LOG, None, STATE_STORE, ("request_id",), refreshed=False),  # kept: the audit of every erasure
)
BY_NAME = {table.name: table for table in TABLES}
BUILT_IN_INCREMENTAL = (FILTERED_EVENTS, SESSIONS)


def extra_incremental(names: Iterable[str]) -> list[Table]:
    """A user's own incremental assets (names found in the definitions), as catalog entries."""
    return [Table(name, INCREMENTAL_GROUP, IO_MANAGER, rules=SOURCE_RULES) for name in sorted(names) if name not in BY_NAME]


def refreshed_tables(incremental: Iterable[str] = ()) -> list[str]:
    """The tables a full refresh empties: every table built from the source, and the state built with them."""
    return sorted(t.name for t in (*TABLES, *extra_incremental(incremental)) if t.refreshed)


def maintained_tables(incremental: Iterable[str] = ()) -> list[str]:
    """The tables table maintenance compacts and vacuums: all but the source."""
    return sorted(t.name for t in (*TABLES, *extra_incremental(incremental)) if t.writer != LOADER and t.name != SOURCE_SUMMARY)


def incremental_versions(graph) -> dict[str, str | None]:
    """Every incremental asset of an asset graph (the definitions'), with its declared code version."""
    return {node.key.path[-1]: node.code_version for node in graph.asset_nodes if node.tags.get(INCREMENTAL_TAG) == "true"}


def known_incremental(context) -> dict[str, str | None]:
    """The incremental assets a run, sensor or op can know of, with their code versions: its code
    location's (a daemon's or the UI's runs), else its job's (an in-process run), and the built-in
    ones in any case (a test's context knows of no definitions)."""
    graph = _asset_graph(context)
    return {**dict.fromkeys(BUILT_IN_INCREMENTAL), **(incremental_versions(graph) if graph is not None else {})}


def _asset_graph(context):
    for read in (lambda: context.repository_def.asset_graph, lambda: context.job_def.asset_layer.asset_graph):
        try:
            return read()
        except (AttributeError, CheckError, DagsterInvalidPropertyError):  # no repository, or no job
            continue
    return None
