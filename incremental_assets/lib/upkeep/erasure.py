"""Erasure (SPEC §11): one person's rows deleted from every table that holds them, under the run
log's lease, with an audit record in `erasure_log` that never holds a key in clear.

A person is named by one identifier (`by`: the attribute key, or user_identifier, domain_userid,
user_id as filtered_events holds them). Everything after the request is recorded works from
salted hashes: the request's, and the user identifiers and attribute keys they resolved to, kept
in its log row. A re-run of the same request after a crash resolves nothing again (the rows it
resolved from may be gone) and finishes what is left; every step is a delete or a recount, and
the one adjustment that is not (the days' pending late events and late events totals) commits
once, under a Delta transaction identifier of the request.

Order: the source when asked (`source`), then the daily manifest's pending and late counts (they
need the person's rows), then the tables downstream to upstream, the lifecycle manifest last
(quarantined_sessions find the person's sessions there), then the days' processed counts
recounted from daily_aggregates, and the days left with no event dropped. A source left as it is
keeps the person's rows there: every run's window drops them (`tombstones`). The files that held
the rows stay readable through time travel until maintenance_job's VACUUM, or `purge` now.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field, replace
from functools import reduce
from pathlib import Path
from typing import Iterable
from uuid import uuid4

from dagster import DagsterInstance
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.lib.catalog import (
    ATTRIBUTES,
    ATTRIBUTES_HISTORY,
    BUILT_IN_INCREMENTAL,
    DAILY_AGGREGATES,
    DAILY_MANIFEST,
    ERASED_BY,
    ERASURE_LOG,
    EVENTS_THIS_RUN,
    FILTERED_EVENTS,
    LIFECYCLE,
    QUARANTINE,
    SESSIONS,
    extra_incremental,
)
from incremental_assets.lib.delta.log import (
    files_left_by, stored_schema, stored_table, table_exists, table_version,
)
from incremental_assets.lib.delta.write import cut_log, delete_rows, vacuum
from incremental_assets.lib.environment import dagster_home, source_table_uri
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.state.hooks import alive_in
from incremental_assets.lib.state.run_log import PROCESSED
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.transforms.daily import day_arrivals
from incremental_assets.lib.transforms.sessions import user_id
from incremental_assets.lib.utc import utcnow

USER = "user_identifier"
# Tables whose rows belong to an attribute key, and those whose rows belong to a user identifier.
BY_KEY = (ATTRIBUTES_HISTORY, ATTRIBUTES, DAILY_AGGREGATES)
BY_USER = (SESSIONS, EVENTS_THIS_RUN, FILTERED_EVENTS, LIFECYCLE)
SOURCE = "source"  # the source table, in a request's rows per table


@dataclass
class Erasure:
    request_id: str
    rows: dict[str, int] = field(default_factory=dict)  # rows deleted per table, by this request
    not_covered: list[str] = field(default_factory=list)  # a user's own tables with no user identifier


def salt(settings: IncrementalSettings, make: bool = True) -> str:
    """The secret every key is hashed with: made once (mode 0600) where the settings say."""
    path = Path(settings.erasure_salt_file or dagster_home() / "erasure_salt")
    if not path.exists() and not make:
        raise FileNotFoundError(
            f"erasure_log holds erased keys, hashed with the secret in {path}, which is missing: without it no run can "
            "keep their events out. Restore the file, or set erasure_salt_file to where it is")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile
            return path.read_text().strip()
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_hex(32))
    return path.read_text().strip()


def tombstones(settings: IncrementalSettings, state: StateStore, columns: Iterable[str]) -> Column | None:
    """Which of a window's rows belong to an erased person: their user_identifier's hash is in the
    erasure log, or their attribute key's when the window (`columns`: the source's) holds that
    column (a new device or user id of a person whose key was erased). Every run drops them, so a
    late load or a keyhole never brings them back. None when nobody was erased."""
    requests = state.erasure_log()
    if not requests:
        return None
    secret = salt(settings, make=False)
    wanted = {USER: {user for request in requests for user in request["user_hashes"] or []}}
    if settings.attribute_key != USER and settings.attribute_key in columns:
        wanted[settings.attribute_key] = {key for request in requests for key in request["attribute_key_hashes"] or []}
    matches = [hashed(column, secret).isin(sorted(hashes)) for column, hashes in wanted.items() if hashes]
    return reduce(lambda one, other: one | other, matches) if matches else None


def key_hash(secret: str, key: str) -> str:
    return hashlib.sha256(f"{secret}{key}".encode()).hexdigest()


def hashed(column: str | Column, secret: str) -> Column:
    """`key_hash` of a column's values, in Spark (the same digest for the same string)."""
    values = F.col(column) if isinstance(column, str) else column
    return F.sha2(F.concat(F.lit(secret), values.cast("string")), 256)


def erase(
    settings: IncrementalSettings, keys: Iterable[str], by: str, spark: SparkSession, instance: DagsterInstance,
    incremental: Iterable[str] = BUILT_IN_INCREMENTAL, run_id: str | None = None, source: bool = False,
) -> Erasure:
    if by not in ERASED_BY:
        raise ValueError(f"--by {by!r}: expected one of {', '.join(ERASED_BY)}")
    keys = sorted({key.strip() for key in keys if key.strip()})
    if not keys:
        raise ValueError("no key to forget: give --key, or a --file with one key per line")
    state, secret = StateStore(), salt(settings)
    column = settings.attribute_key if by == "attribute_key" else by
    hashes = sorted({key_hash(secret, key) for key in keys})
    request_id = "erasure-" + hashlib.sha256(f"{column}|{'|'.join(hashes)}".encode()).hexdigest()[:20]
    extras = extra_incremental(incremental)
    covered = [t.name for t in extras if table_exists(state.uri(t.name)) and USER in stored_schema(stored_table(state.uri(t.name))).fieldNames()]
    erasure = Erasure(request_id, not_covered=sorted(t.name for t in extras if t.name not in covered))
    tables = [t for t in (*BY_KEY, QUARANTINE, *covered, *BY_USER) if table_exists(state.uri(t))]
    run_id = run_id or f"{request_id}-{uuid4().hex[:8]}"
    state.acquire(run_id, [*tables, DAILY_MANIFEST, ERASURE_LOG], None, alive_in(instance))

    request = state.erasure_request(request_id)
    if request is None:
        users, attribute_keys = _resolve(spark, state, secret, column, hashes, settings.attribute_key)
        request = state.open_erasure(request_id, column, hashes, users, attribute_keys, _requester(instance, run_id))
    users, attribute_keys = request["user_hashes"], request["attribute_key_hashes"]
    person = {USER: hashed(USER, secret).isin(users), "attribute_key": hashed("attribute_key", secret).isin(attribute_keys)}

    uris = {table: _uri(state, table) for table in ([SOURCE] if source else []) + tables}
    if source:  # its rows by the user identifier the runs compute from them: the commit names no value
        identified = _read(spark, uris[SOURCE]).where(hashed(user_id(settings), secret).isin(users))
        erasure.rows[SOURCE] = delete_rows(spark, uris[SOURCE], identified.select(user_id(settings).alias(USER)), [USER],
                                           user_metadata=request_id, derived={USER: user_id(settings)})
    # the person's events, read once: for the days' counts and as what filtered_events deletes
    events = _read(spark, state.uri(FILTERED_EVENTS))
    theirs = None if events is None else events.where(person[USER]).cache()
    counted_before = state.consumed_version() == table_version(state.uri(FILTERED_EVENTS))
    try:
        if not state.applied_once(request_id):
            state.save_days(_days_without(spark, state, events, theirs, person), once_as=request_id)
        for table in tables:
            uri = uris[table]
            if table == QUARANTINE:
                matching, on = _read(spark, state.uri(LIFECYCLE)).where(person[USER]), ["session_identifier"]
            elif table == FILTERED_EVENTS:
                matching, on = theirs, [USER]
            else:
                on = ["attribute_key"] if table in BY_KEY else [USER]
                matching = _read(spark, uri).where(person[on[0]])
            erasure.rows[table] = delete_rows(spark, uri, matching, on, user_metadata=request_id)
            state.record(run_id, table, PROCESSED, {"rows_updated": erasure.rows[table]}, message=f"{request_id}: rows erased")
    finally:  # a warm worker's next request reads them again
        if theirs is not None:
            theirs.unpersist()
    state.save_days(_processed_recounted(spark, state))
    state.drop_days(_days_emptied(spark, state))
    if counted_before and FILTERED_EVENTS in tables:  # its delete inserted nothing: `purge` may delete its change data
        state.counted_through(table_version(state.uri(FILTERED_EVENTS)))
    state.record(run_id, DAILY_MANIFEST, PROCESSED, {}, message=f"{request_id}: the days' counts without the erased rows")
    state.close_erasure(request_id, uris)
    state.record(run_id, ERASURE_LOG, PROCESSED, {"rows_inserted": 1}, message=f"{request_id}: recorded")
    return erasure


def files_left(state: StateStore) -> dict[str, dict[str, list[str] | None]]:
    """Per request not yet recorded as physically gone, per table it erased rows from: the files
    that still hold those rows (readable through time travel until VACUUM), None when unknown."""
    left = {}
    for request in state.erasure_log():
        if request["status"] != PROCESSED or request["physically_gone_at"] is not None:
            continue
        erased = json.loads(request["rows"] or "{}")
        left[request["request_id"]] = {
            table: files_left_by(_uri(state, table), request["request_id"], request["requested_at"])
            for table, rows in erased.items() if rows}
    return left


@dataclass
class Purge:
    vacuumed: list[str] = field(default_factory=list)  # tables vacuumed of every file their current version does not read
    waiting: dict[str, str] = field(default_factory=dict)  # tables left as they are, and why
    gone: list[str] = field(default_factory=list)  # requests now recorded physically gone
    log_cut: list[str] = field(default_factory=list)  # tables whose log before their current version was deleted


def purge(state: StateStore, instance: DagsterInstance, run_id: str | None = None) -> Purge:
    """Vacuum now, under the lease, each warehouse table that still holds files with erased rows,
    of every file its current version does not read (the retention 0): what maintenance_job does
    once its retention has passed. Earlier runs' rewrites left files with the person's rows too,
    so no file short of that will do; time travel in those tables ends there. Never the source.
    filtered_events waits until the daily manifest has read its change feed up to now: that read
    takes the change data files of the commits it has not read yet. Once a request is gone, the
    log of each table it erased from is cut at its current version (`cut_log`: older commits hold
    the statistics of the files they added), unless a request still pending needs its commits."""
    result = Purge()
    pending = files_left(state)
    held = sorted({table for tables in pending.values() for table, files in tables.items()
                   if table != SOURCE and files != []})
    if FILTERED_EVENTS in held and not _change_feed_read(state):
        held.remove(FILTERED_EVENTS)
        result.waiting[FILTERED_EVENTS] = (f"the daily manifest has read its change feed up to version {state.consumed_version()}, "
                                           f"not {table_version(state.uri(FILTERED_EVENTS))}: run once (incremental-assets run), "
                                           "then purge again")
    erased_from = sorted({table for tables in pending.values() for table in tables if table != SOURCE})
    run_id = run_id or f"purge-{uuid4().hex[:8]}"
    if erased_from:
        state.acquire(run_id, erased_from, None, alive_in(instance))
    for table in held:
        vacuum(state.uri(table), 0, utcnow())
        result.vacuumed.append(table)
    result.gone = record_gone(state)
    needed = {table for request, tables in pending.items() if request not in result.gone for table in tables}
    for table in sorted({table for request in result.gone for table in pending[request]} - needed - {SOURCE}):
        if table == FILTERED_EVENTS and not _change_feed_read(state):  # its next read starts at a commit the cut would take
            result.waiting[table] = "its log is not cut: the daily manifest has not read its change feed up to now"
            continue
        cut_log(state.uri(table))
        result.log_cut.append(table)
    for table in erased_from:
        done = [what for what, tables in (("vacuumed of every file its current version does not read", result.vacuumed),
                                          ("its log cut at its current version", result.log_cut)) if table in tables]
        state.record(run_id, table, PROCESSED, {}, message=f"{', '.join(done) or 'nothing left to purge'} (forget --purge)")
    return result


def _change_feed_read(state: StateStore) -> bool:
    """Whether the daily manifest has read filtered_events' change feed up to its current version
    (the commits after the one it read that changed no data, a vacuum's, a compaction's, recorded
    as read first)."""
    consumed = state.read_past_unchanged()
    return consumed is not None and consumed >= table_version(state.uri(FILTERED_EVENTS))


def record_gone(state: StateStore) -> list[str]:
    """Record as physically gone the requests whose rows no file holds any more (source included)."""
    gone = [request for request, tables in files_left(state).items() if all(files == [] for files in tables.values())]
    state.erasures_gone(gone)
    return gone


def _resolve(spark, state, secret, column, hashes, attribute_key) -> tuple[list[str], list[str]]:
    """The hashes of the user identifiers and attribute keys the request's identifiers name, as
    filtered_events holds them (an identifier with no event left names itself)."""
    events = _read(spark, state.uri(FILTERED_EVENTS))
    found = {USER: set(), attribute_key: set()}
    if events is not None:
        rows = events.where(hashed(column, secret).isin(hashes)).select(
            hashed(USER, secret).alias(USER), hashed(attribute_key, secret).alias("key")).distinct().collect()
        found = {USER: {r[USER] for r in rows}, attribute_key: {r["key"] for r in rows}}
    users = found[USER] | (set(hashes) if column == USER else set())
    keys = found[attribute_key] | (set(hashes) if column == attribute_key else set())
    return sorted(users), sorted(keys)


def _days_without(spark, state: StateStore, events: DataFrame | None, theirs: DataFrame | None, person: dict[str, Column]):
    """The days that counted the person's events (`theirs`: their rows of filtered_events, `events`),
    without them: their pending late events (held in filtered_events but not yet aggregated: beyond
    what daily_aggregates counted), their late events total (the arrival rule's late rows, as the
    runs that inserted them counted), and the latest load and longest delay of everyone else's rows."""
    if theirs is None:
        return []
    daily = _read(spark, state.uri(DAILY_AGGREGATES))
    counted = {} if daily is None else {
        r.event_date: r.events for r in daily.where(person["attribute_key"]).groupBy("event_date").agg(F.sum("events").alias("events")).collect()}
    known = state.days()
    arrivals = {arrived.day: arrived for arrived in day_arrivals(theirs) if arrived.day in known}
    others = {arrived.day: arrived for arrived in day_arrivals(
        events.where(F.col("event_date").isin(list(arrivals)) & ~F.coalesce(person[USER], F.lit(False))))} if arrivals else {}
    days = []
    for on, arrived in arrivals.items():
        day, pending, rest = known[on], max(0, arrived.rows - counted.get(on, 0)), others.get(on)
        days.append(replace(day, pending_late_events=max(0, day.pending_late_events - pending),
                            late_events_total=max(0, day.late_events_total - arrived.late_rows),
                            max_load_tstamp=rest.max_load_tstamp if rest else None,
                            max_delay_hours=rest.max_delay_hours if rest else 0.0))
    return days


def _processed_recounted(spark, state: StateStore):
    """Every day's processed count as daily_aggregates now holds it (the erased rows no longer counted)."""
    daily = _read(spark, state.uri(DAILY_AGGREGATES))
    if daily is None:
        return []
    held = {r.event_date: r.events for r in daily.groupBy("event_date").agg(F.sum("events").alias("events")).collect()}
    return [replace(day, processed_events=held.get(d, 0)) for d, day in state.days().items()
            if day.processed_events and day.processed_events != held.get(d, 0)]


def _days_emptied(spark, state: StateStore) -> list:
    """The manifest's days that filtered_events holds no row of any more (the person's were their
    only events): a warehouse built without the person has no such day. Only days with nothing
    processed or pending are looked up."""
    idle = [on for on, day in state.days().items() if not day.processed_events and not day.pending_late_events]
    events = _read(spark, state.uri(FILTERED_EVENTS))
    if not idle or events is None:
        return []
    held = {r.event_date for r in events.where(F.col("event_date").isin(idle)).select("event_date").distinct().collect()}
    return [on for on in idle if on not in held]


def _uri(state: StateStore, table: str) -> str:
    """Where a table a request erases from is: the source's own URI, or the warehouse's."""
    return source_table_uri() if table == SOURCE else state.uri(table)


def _read(spark: SparkSession, uri: str) -> DataFrame | None:
    return spark.read.format("delta").load(uri) if table_exists(uri) else None


def _requester(instance: DagsterInstance, run_id: str) -> str:
    """Who asked: the Dagster run's user when a run asked (the UI's launchpad), else the OS user."""
    run = instance.get_run_by_id(run_id)
    user = run.tags.get("user") if run is not None else None
    return user or getpass.getuser()
