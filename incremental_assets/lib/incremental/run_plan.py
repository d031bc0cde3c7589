"""A run's plan: what new_event_limits decides once per run and hands down the graph (its limits,
the run that decided them, the incremental assets of the run with their manifest rows at that
moment, and the rows that arrived in the source since the last run looked), stored as the run's
row of `new_event_limits` and loaded back, for the run that wrote it, by its other steps."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from datetime import date, datetime, time
from typing import Any, Callable, Mapping, NoReturn

import pyarrow as pa
from dagster import Failure, TableColumn

from incremental_assets.lib.catalog import BASE_GROUP, INCREMENTAL_JOB, INCREMENTAL_TAG, TABLES
from incremental_assets.lib.delta.io_manager import write_metadata
from incremental_assets.lib.delta.log import Snapshot, read_rows, row_count
from incremental_assets.lib.delta.spec import DeltaWriteError, WriteMode
from incremental_assets.lib.delta.write import Txn, append_rows
from incremental_assets.lib.errors import refuse_run
from incremental_assets.lib.incremental.limits import RunLimits, RunState, nothing_new
from incremental_assets.lib.source.arrivals import (
    NOTHING_ARRIVED,
    Arrival,
    ArrivalBounds,
    Arrivals,
    CountedArrivals,
    Stranded,
    stranded,
)
from incremental_assets.lib.state.records import ManifestEntry
from incremental_assets.lib.state.run_log import ROWS_KEPT, ROWS_READ, succeeded
from incremental_assets.lib.state.store import run_log_record
from incremental_assets.lib.utc import UTC_TIMESTAMP, aware, naive

LIMITS_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("state", pa.string()), ("lower_limit", UTC_TIMESTAMP),
     ("upper_limit", UTC_TIMESTAMP), ("now", UTC_TIMESTAMP),
     # the incremental assets of the run, and their manifest rows when it decided (JSON)
     ("incremental_assets", pa.string()), ("entries", pa.string()),
     # the source version this run assessed, and the rows that arrived in it since the last one
     ("source_table_id", pa.string()), ("source_version", pa.int64()), ("source_committed_at", UTC_TIMESTAMP),
     ("arrivals", pa.string()), ("behind_from", UTC_TIMESTAMP), ("behind_to", UTC_TIMESTAMP),
     # a quiet window: the run whose processing it would only repeat, and where its assets resume
     ("quiet_after_run", pa.string()), ("quiet_next_event", UTC_TIMESTAMP)]
)


NOTHING_NEW = "every incremental asset of the run is at or past its upper limit: nothing new to process"


@dataclass(frozen=True)
class Quiet:
    """A standard window that holds nothing new. The source is the version run `after_run`
    assessed, and that run read its window whole and moved the manifest of every asset of this
    run: every row of this window up to that run's upper limit was read then, and none lies past
    it up to this window's. The run reads nothing; its assets move on to `next_event` (the first
    row after the window, up to now), or to the upper limit (None)."""

    after_run: str
    next_event: datetime | None


@dataclass(frozen=True)
class RunPlan:
    """What new_event_limits decides once per run: the window; the run that decided it (every
    write of the run is keyed by it, so a re-executed step writes once); the incremental assets of
    the run and their manifest rows then (what each skips and advances from); and the rows that
    arrived in the source since the version the last run assessed (`source`: this one's)."""

    limits: RunLimits
    run_id: str = ""
    models: tuple[str, ...] = ()
    entries: Mapping[str, ManifestEntry] = field(default_factory=dict)
    source: Snapshot | None = None
    arrivals: Arrivals = NOTHING_ARRIVED
    quiet: Quiet | None = None

    @property
    def nothing_new(self) -> bool:
        """Every incremental asset of the run is past its window: no step has anything to compute."""
        return nothing_new(self.limits, self.entries, self.models)

    @property
    def reads_nothing(self) -> bool:
        """No step reads the source: nothing is new, or the window is quiet (its assets still move on)."""
        return self.nothing_new or self.quiet is not None

    @property
    def why_nothing_read(self) -> str:
        if self.nothing_new or self.quiet is None:
            return NOTHING_NEW
        return f"quiet: nothing arrived in the source since run {self.quiet.after_run} processed this window"


class PlanHandler:
    """The IO manager's handler of a run's plan: one row per run, appended with deltalake (no Spark
    job for a row), and loaded back for the run that wrote it."""

    stores = loads = (RunPlan,)

    def store(self, context, table, plan: RunPlan, spark) -> dict[str, Any]:
        if table.spec.write_mode is not WriteMode.APPEND:
            raise DeltaWriteError(f"{table.uri} keeps one row per run: declare write mode append")
        rows = plan_table(plan)
        result = append_rows(table.uri, rows, Txn(f"run-{plan.run_id}"))
        columns = [TableColumn(f.name, str(f.type)) for f in rows.schema]
        return {
            **limits_metadata(plan.limits), **arrivals_metadata(plan), **write_metadata(columns, table.uri, result),
            "dagster/row_count": row_count(table.uri),
        }

    def load(self, context, table, spark) -> RunPlan:
        rows = read_rows(table.uri, filters=[("run_id", "=", table.run_id)]) or []
        if not rows:
            not_in_this_run(context, table.name)
        return plan_from_row(rows[0])


def incremental_models(layer) -> list[str]:
    """The incremental assets selected in a run (its job's asset layer): its limits are computed over them."""
    graph = layer.asset_graph
    return sorted(key.path[-1] for key in layer.selected_asset_keys if graph.get(key).tags.get(INCREMENTAL_TAG) == "true")


def outside_the_unit(layer) -> str | None:
    """Why a run's selection is not a whole incremental run, which its steps cannot be without one
    another: the base chain (its window, session layer and batch, decided once and handed down)
    and at least one incremental asset. None: it is one. Said before anything is written, with
    what to click instead (Materialize on one asset selects that asset alone)."""
    selected = {key.path[-1] for key in layer.selected_asset_keys}
    chain = {table.name for table in TABLES if table.group == BASE_GROUP}
    lacks = sorted(chain - selected) or ([] if incremental_models(layer) else ["an incremental asset"])
    if not lacks:
        return None
    return (
        f"refused: {', '.join(sorted(selected))} alone is part of an incremental run, which also needs "
        f"{', '.join(lacks)}; nothing was written. Materialize the job {INCREMENTAL_JOB} instead (Jobs > "
        f"{INCREMENTAL_JOB} > Materialize all; or incremental-assets run): it runs every step of the window together."
    )


def not_in_this_run(context, table: str) -> NoReturn:
    """A step found no plan or batch of its own run (`table`) to load. Its selection is part of
    the unit, the usual reason (a step's inputs load before it runs: this is the first place it
    is seen): refused. Else another run has replaced them: a failure."""
    step = context.step_context
    refused = outside_the_unit(step.job_def.asset_layer)
    if refused:
        refuse_run(step.instance, step.dagster_run, refused)
    raise Failure(f"{step.step.key} consumes the {table} of its own run, and another run has replaced it: run {INCREMENTAL_JOB} again")


def run_arrival_bounds(limits: RunLimits, start_date: date, next_lower: datetime | None) -> ArrivalBounds:
    """How a run classes the rows that arrived in the source: by its first day, its `now`, where
    the next standard window starts, and a keyhole run's own window."""
    keyhole = None if limits.moves_manifest else (limits.lower, limits.upper)
    return ArrivalBounds(datetime.combine(start_date, time.min), limits.now, next_lower, keyhole)


def plan_table(plan: RunPlan) -> pa.Table:
    """The run's row of `new_event_limits`."""
    limits, source, arrivals = plan.limits, plan.source, plan.arrivals
    entries = {model: {f.name: getattr(entry, f.name) for f in fields(entry)} for model, entry in plan.entries.items()}
    row = {
        "run_id": plan.run_id, "state": limits.state.value, "lower_limit": aware(limits.lower),
        "upper_limit": aware(limits.upper), "now": aware(limits.now),
        "incremental_assets": json.dumps(list(plan.models)), "entries": json.dumps(entries, default=str),
        "source_table_id": source and source.table_id, "source_version": source and source.version,
        "source_committed_at": source and aware(source.committed_at),
        "arrivals": json.dumps({arrival.value: n for arrival, n in arrivals.counts.items()}),
        "behind_from": aware(arrivals.behind_from), "behind_to": aware(arrivals.behind_to),
        "quiet_after_run": plan.quiet and plan.quiet.after_run,
        "quiet_next_event": plan.quiet and aware(plan.quiet.next_event),
    }
    return pa.Table.from_pylist([row], LIMITS_SCHEMA)


def plan_from_row(row: Mapping[str, Any]) -> RunPlan:
    limits = RunLimits(RunState(row["state"]), *(naive(row[c]) for c in ("lower_limit", "upper_limit", "now")))
    source = None
    if row.get("source_table_id"):
        source = Snapshot(row["source_table_id"], row["source_version"], naive(row["source_committed_at"]))
    counts = {Arrival(k): v for k, v in json.loads(row.get("arrivals") or "{}").items()}
    entries = {model: ManifestEntry(model, *(_moment(values.get(k)) for k in ("last_success", "last_upper", "first_success")))
               for model, values in json.loads(row.get("entries") or "{}").items()}
    quiet = Quiet(row["quiet_after_run"], naive(row.get("quiet_next_event"))) if row.get("quiet_after_run") else None
    return RunPlan(
        limits, row["run_id"], tuple(json.loads(row.get("incremental_assets") or "[]")), entries, source,
        Arrivals(counts, naive(row.get("behind_from")), naive(row.get("behind_to"))), quiet,
    )


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def waiting_behind_cursor(plans: list[Mapping[str, Any]] | None, run_log: Callable[[], list[dict]]) -> list[Stranded]:
    """Source rows behind the incremental cursor that no keyhole run has processed since they
    arrived, from every run's plan (`plans`: the rows of new_event_limits; `run_log`: read only
    when some rows wait). The warn check reports them, preview names them, the source sensor
    requests their keyhole run."""
    counted = [
        CountedArrivals(row["run_id"], plan.source.version, plan.arrivals,
                        None if plan.limits.moves_manifest else (plan.limits.lower, plan.limits.upper))
        for row in plans or []
        for plan in [plan_from_row(row)] if plan.source is not None
    ]
    if not any(c.arrivals[Arrival.BEHIND] or c.arrivals[Arrival.IN_KEYHOLE] for c in counted):
        return []
    return stranded(counted, succeeded(run_log_record(row) for row in run_log()))


def repeated_run(
    limits: RunLimits, models: tuple[str, ...], source: Snapshot, rows: list[Mapping[str, Any]] | None,
    run_log: Callable[[str], list[dict]],
) -> RunPlan | None:
    """The plan of a successful run whose reading this standard window would only repeat, the one
    that read furthest (None: none). It assessed the source at this very version and moved the
    manifest of every asset of this run; rows arrive only with a new version, so each row of this
    window up to that run's upper limit was read by it or before it (this window starts no earlier
    than that run's). `rows`: new_event_limits; `run_log` of one run."""
    if limits.state is not RunState.STANDARD:
        return None
    candidates = [
        plan for plan in (plan_from_row(row) for row in rows or [])
        if plan.limits.moves_manifest and plan.source is not None and set(models) <= set(plan.models)
        and (plan.source.table_id, plan.source.version) == (source.table_id, source.version)
    ]
    candidates.sort(key=lambda plan: plan.limits.upper, reverse=True)
    return next((plan for plan in candidates if plan.run_id in succeeded(map(run_log_record, run_log(plan.run_id)))), None)


def last_assessed(rows: list[Mapping[str, Any]] | None, table_id: str) -> Snapshot | None:
    """The latest version of the source table `table_id` that a run's plan assessed, among the
    rows of `new_event_limits` (None: no run has)."""
    plans = [plan_from_row(row).source for row in rows or []]
    known = [source for source in plans if source is not None and source.table_id == table_id]
    return max(known, key=lambda source: source.version, default=None)


def limits_metadata(limits: RunLimits) -> dict[str, str]:
    return {
        "run_state": limits.state.value,
        "lower_limit": str(limits.lower),
        "upper_limit": str(limits.upper),
        "now": str(limits.now),
    }


def arrivals_metadata(plan: RunPlan) -> dict[str, Any]:
    """What arrived in the source since the last run looked, for people (the UI, the run log)."""
    arrivals = plan.arrivals
    unread = sum(arrivals.skipped().values())
    metadata = {
        "source_version": plan.source.version if plan.source else None, "rows_arrived": arrivals.rows,
        ROWS_READ: arrivals.rows, ROWS_KEPT: arrivals.rows - unread,  # kept: left for a window to read
    }
    metadata.update({f"arrived_{arrival.value}": arrivals[arrival] for arrival in Arrival if arrivals[arrival]})
    if arrivals.behind_from is not None:
        metadata["behind_cursor_range"] = f"{arrivals.behind_from} .. {arrivals.behind_to}"
    return metadata
