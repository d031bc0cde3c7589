"""The session layer: lifecycle manifest, quarantine, this run's batch, and `sessions`.

Each asset returns its rows; the Delta IO manager writes them in the mode the asset declares.
"""

from datetime import date, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetIn,
    AssetOut,
    Definitions,
    Output,
)
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructField, StructType, TimestampType

from incremental_assets.lib.catalog import BASE_GROUP, EVENTS_THIS_RUN, LIFECYCLE, NEW_EVENT_LIMITS, QUARANTINE
from incremental_assets.lib.checks import from_offending_rows, latest_write, nothing_written
from incremental_assets.lib.delta.arrow import no_rows
from incremental_assets.lib.delta.log import stored_table, table_exists
from incremental_assets.lib.delta.read import naming, read_just_written, read_table, read_to_check
from incremental_assets.lib.delta.spec import MERGE_FLOOR, Rows, Stored, delta_table
from incremental_assets.lib.environment import source_table_uri, table_uri
from incremental_assets.lib.assets import OWNERS, SPARK_DELTA, spark_delta_asset, spark_delta_multi_asset, warehouse_check
from incremental_assets.lib.incremental.batch import NOTHING_FOUND, Found, RunBatch, WindowRows
from incremental_assets.lib.incremental.run_plan import RunPlan
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import rows_within, with_optional_columns
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.run_log import ROWS_KEPT, ROWS_READ
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.upkeep.erasure import tombstones
from incremental_assets.lib.transforms import violations as V
from incremental_assets.lib.transforms import sessions as T

LIFECYCLE_SCHEMA = StructType([
    StructField("session_identifier", StringType()), StructField("user_identifier", StringType()),
    StructField("start_tstamp", TimestampType()), StructField("end_tstamp", TimestampType()), StructField("start_date", DateType()),
])
LIFECYCLE_COLUMNS = LIFECYCLE_SCHEMA.fieldNames()
QUARANTINE_SCHEMA = StructType([
    StructField("session_identifier", StringType()), StructField("quarantined_at", TimestampType()),
    StructField("cap_tstamp", TimestampType()),
])
# The batch's dedupe. Up to this many sessions (about a million events here) every row is ranked
# in one shuffle; finding the duplicated ids first costs a job more than it saves (benchmarks/).
SESSIONS_RANKED_WHOLE = 30_000
# Duplicated ids are broadcast as 64-bit hashes up to a million (tens of MB); more (a whole stream
# loaded twice) are joined by a shuffle.
BROADCAST_DUPLICATED_IDS = 1_000_000
# The run's sessions (about 100 bytes each) are broadcast to the events, and their ids to the
# source's scan (T.candidate_events), up to this many: left to Spark's 10 MB threshold, a first
# backfill's sessions planned a sort-merge join that shuffled every wide event row before adaptive
# execution made it a broadcast.
BROADCAST_SESSIONS = 500_000


def read_or_empty(spark, uri: str, schema: StructType) -> DataFrame:
    """A table's stored rows as they are now (state from earlier runs, pinned to this version, so
    that a write later in the step does not change them), or none before its first write."""
    table = stored_table(uri)
    if table is not None:
        return spark.read.format("delta").option("versionAsOf", table.version()).load(uri)
    return no_rows(spark, schema)


def stored_sessions(spark, floor: date, named: list[tuple]) -> DataFrame:
    """The lifecycle's sessions that started from `floor` on, as they are now; only those `named`
    (read.naming) when some are: read by name, a run's few hundred sessions are no scan in Spark
    of every session of the lookback, a cost that grew with the history."""
    uri = table_uri(LIFECYCLE)
    if named and stored_table(uri) is not None:
        return read_just_written(spark, uri, LIFECYCLE_COLUMNS, [("start_date", ">=", floor), *named])
    return read_or_empty(spark, uri, LIFECYCLE_SCHEMA).where(F.col("start_date") >= F.lit(floor))


def must_write(rows: int, table: str) -> bool:
    """An empty write is skipped, except the first: it creates the table later steps read."""
    return rows > 0 or not table_exists(table_uri(table))


def source_read(source: DataFrame, settings: IncrementalSettings) -> str:
    """How the window's read of the source is bounded: an operator's first question when runs slow down."""
    load_day = T.load_day_of(source, settings)
    if load_day is not None:
        return f"the load days a window can hold ({load_day})"
    wanted = settings.source_load_date_column
    return f"whole: the source has no {wanted} column (set source_load_date_column to its load-day column)"


@spark_delta_asset(
    name=LIFECYCLE,
    ins={"plan": AssetIn(NEW_EVENT_LIMITS)},
    group_name=BASE_GROUP,
    metadata=delta_table("upsert", keys=[T.SESSION], partition_by=["start_date"], one_row_per_key=True),
    description="Start and end of every session (first user sticks, end capped at start + max_session_days), "
    "so a new event for an old session re-processes the whole session without scanning all history.",
)
def sessions_lifecycle_manifest(plan: RunPlan, settings: IncrementalSettings, spark: SparkResource):
    """Hands on, with its rows, the first start day of the rows the window touched (changed, or
    found at their cap): the batch quarantines the sessions at their cap from there."""
    limits = plan.limits
    if plan.reads_nothing:  # nothing new, or a quiet window: no read
        yield Output(Rows(None), metadata={"skipped": plan.why_nothing_read})
        return
    session = spark.session_for(rows_within(source_table_uri(), settings, limits.lower, limits.upper))  # this run's Spark steps
    ts = settings.session_timestamp
    source = read_table(session, source_table_uri())
    quarantined = read_or_empty(session, table_uri(QUARANTINE), QUARANTINE_SCHEMA)
    window = T.window_and_null_cursor_rows(source, settings, limits.lower, limits.upper)
    erased = tombstones(settings, StateStore(), window.columns)
    groups = T.window_groups(T.classify_window(window, quarantined, settings, erased), ts).cache()
    drops = {r["drop_reason"]: r["events"] for r in groups.groupBy("drop_reason").agg(F.sum("events").alias("events")).collect()}
    null_cursor_rows = drops.pop(T.NULL_CURSOR, 0)
    # Only stored sessions that started within session_lookback_days are matched (and scanned).
    floor = (limits.lower - timedelta(days=settings.session_lookback_days)).date()
    candidates, eligible = T.new_session_candidates(groups), drops.get(None, 0)  # a session has an eligible event
    stored = stored_sessions(session, floor, naming(candidates, T.SESSION, eligible) if eligible else [])
    changes = T.merge_lifecycle(candidates, stored, settings.max_session_days)
    at_cap = F.col(T.STORED_AT_CAP)
    if drops.get(None):
        changes = changes.cache()
        changed = changes.agg(
            F.count_if(~at_cap).alias("n"), F.count_if(at_cap).alias("at_cap"), F.min("start_date").alias("first_day")
        ).first()
    else:  # no eligible event, no change: a quiet hour skips the join with the stored sessions
        changed = {"n": 0, "at_cap": 0, "first_day": None}
    groups.unpersist()
    metadata = {
        "events_in_window": sum(drops.values()),
        "eligible_events": drops.get(None, 0),
        "null_cursor_rows": null_cursor_rows,
        # the window's account: every row read is passed on (eligible) or counted under a reason
        ROWS_READ: sum(drops.values()) + null_cursor_rows, ROWS_KEPT: drops.get(None, 0),
        **{f"dropped_{reason}": n for reason, n in drops.items() if reason},
        "sessions_new_or_changed": changed["n"],
        "sessions_already_at_cap": changed["at_cap"],
        "source_read": source_read(source, settings),
    }
    # A change starts no later than the stored row it updates: the MERGE reads from its first day on.
    first_day = changed["first_day"]
    written = changes.where(~at_cap).drop(T.STORED_AT_CAP) if must_write(changed["n"], LIFECYCLE) else None
    note = {"touched_from": first_day.isoformat()} if first_day is not None else None
    yield Output(
        Rows(written, merge_floor=first_day, rows_at_most=changed["n"], decided_by=plan.run_id, note=note),
        metadata=metadata,
    )
    changes.unpersist()


@warehouse_check(
    asset=LIFECYCLE,
    blocking=True,
    description="Each session stored once, with start <= end <= start + max_session_days; reads the rows "
    "from the latest write's first changed day on. Blocks the batch, which would follow wrong bounds.",
)
def sessions_unique_and_within_cap(
    context: AssetCheckExecutionContext, spark: SparkResource, settings: IncrementalSettings
) -> AssetCheckResult:
    write = latest_write(context, LIFECYCLE)
    if write is None:
        return nothing_written()
    floor = write.get(MERGE_FLOOR)
    since = [("start_date", ">=", date.fromisoformat(floor))] if floor else None
    lifecycle = read_to_check(spark.spark_session, write["dagster/uri"], [T.SESSION, "start_tstamp", "end_tstamp"], since)
    violations = V.lifecycle_violations(lifecycle, settings.max_session_days)
    return from_offending_rows(violations, "lifecycle rows breaking a rule", f"start_date >= {floor or 'any'}")


@spark_delta_multi_asset(
    name="session_batch",
    ins={"plan": AssetIn(NEW_EVENT_LIMITS), "lifecycle": AssetIn(LIFECYCLE)},
    description="The sessions active in the window, computed once: the ones to quarantine, and all their events.",
    outs={
        QUARANTINE: AssetOut(
            group_name=BASE_GROUP,
            kinds=SPARK_DELTA,
            owners=OWNERS,
            metadata=delta_table("merge_insert", keys=[T.SESSION], one_row_per_key=True),
            description="Sessions that reached max_session_days (bots): their events stop being processed, so "
            "they stop costing scans. Insert-only.",
        ),
        EVENTS_THIS_RUN: AssetOut(
            group_name=BASE_GROUP,
            kinds=SPARK_DELTA,
            owners=OWNERS,
            metadata=delta_table("replace", stats_columns=[]),  # read whole: statistics would not skip a file
            description="Scratch table, replaced every run: every event of the sessions active in the window, "
            "within each session's cap, deduplicated on event_id (earliest wins). Its metadata says what the "
            "batch found; the incremental assets of the same run consume it.",
        ),
    },
)
def session_batch(plan: RunPlan, lifecycle: Stored, settings: IncrementalSettings, spark: SparkResource):
    """`lifecycle`: the table as this run's lifecycle step left it, with the day it touched from."""
    limits = plan.limits
    ts = settings.session_timestamp
    idle = plan.reads_nothing
    # idle: nothing new (no asset moves), or a quiet window (each moves on to the next event the plan found)
    next_event = plan.quiet and plan.quiet.next_event
    if idle and not must_write(0, QUARANTINE) and table_exists(table_uri(EVENTS_THIS_RUN)):
        # no session, no event, and the tables there: a quiet schedule tick starts no JVM
        yield Output(Rows(None), QUARANTINE, metadata={"sessions_at_their_cap": 0})
        yield Output(RunBatch(None, limits, next_event, NOTHING_FOUND, ts, plan.run_id), EVENTS_THIS_RUN,
                     metadata={"sessions_this_run": 0, "skipped": plan.why_nothing_read})
        return
    # as the lifecycle step judged the window's events: before this step quarantines more sessions
    quarantined = read_or_empty(spark.spark_session, table_uri(QUARANTINE), QUARANTINE_SCHEMA)
    until = None if limits.moves_manifest else limits.now  # a keyhole: its sessions whole
    active = T.sessions_this_run(lifecycle.frame, limits.lower, limits.upper, settings.max_session_days, until)
    if idle:  # an empty batch
        active, span = active.where(F.lit(False)), T.NO_SESSIONS
    else:
        active = active.cache()
        span = T.sessions_span(active, settings.max_session_days)  # on the cached sessions: cheaper than an empty MERGE
    at_cap = span["at_cap"]
    # This run's window touched lifecycle rows from this day on (changed them, or found them at
    # their cap): sessions at their cap that started before the window's sessions are quarantined
    # too (the days before are left as they were).
    touched = (lifecycle.note or {}).get("touched_from")
    touched_from = date.fromisoformat(touched) if touched and not idle else None
    capped_earlier = None
    if touched_from is not None and touched_from <= T.earliest_start(limits.lower, settings.max_session_days).date():
        capped_earlier = T.capped_before_window(lifecycle.frame, touched_from, limits.lower, settings.max_session_days).cache()
        at_cap += capped_earlier.count()
    quarantine = None
    if must_write(at_cap, QUARANTINE):
        quarantine = T.newly_quarantined(active, settings.max_session_days, limits.now)
        if capped_earlier is not None:
            quarantine = quarantine.unionByName(capped_earlier.withColumn("quarantined_at", F.lit(limits.now)))
    yield Output(Rows(quarantine, rows_at_most=at_cap, decided_by=plan.run_id), QUARANTINE,
                 metadata={"sessions_at_their_cap": at_cap})

    source = with_optional_columns(read_table(spark.spark_session, source_table_uri()))
    window = None if idle else (limits.lower, limits.upper)  # its every eligible event is accounted for
    erased = tombstones(settings, StateStore(), source.columns)
    few = span["sessions"] <= BROADCAST_SESSIONS
    candidates = T.candidate_events(source, settings, span, quarantined, window, erased, active if few else None)
    sessions_joined = F.broadcast(active) if few else active
    duplicated = T.duplicated_ids(candidates).cache() if span["sessions"] > SESSIONS_RANKED_WHOLE else None
    if duplicated is not None:  # broadcast, the rows of unique ids are written where they are read, without a shuffle
        duplicated = F.broadcast(duplicated) if duplicated.count() <= BROADCAST_DUPLICATED_IDS else duplicated
    found = NOTHING_FOUND
    if span["sessions"]:  # counted while the IO manager writes them: one dedupe, not one more to count
        found = (Observation(), Observation())
        events = T.session_events(candidates, sessions_joined, settings, duplicated, observed=(found[0], window))
        events = events.observe(found[1], *T.batch_counts(ts, window))
    else:
        events = T.session_events(candidates, sessions_joined, settings, duplicated)
        if window is not None:  # no session of the run: an eligible event of its window is beyond its cap
            beyond = T.within_window(candidates, ts, window).count()
            found = Found(0, None, 0, WindowRows(0, beyond, 0))
    if not idle:
        next_event = T.next_event_after(source, settings, limits.upper, limits.now)
    lo, hi = T.candidate_range(span, window)  # the batch is among the source's rows there
    yield Output(
        RunBatch(events.drop(T.COPIES), limits, next_event, found, ts, plan.run_id,
                 rows_at_most=0 if lo is None else rows_within(source_table_uri(), settings, lo, hi)),
        EVENTS_THIS_RUN,
        metadata={"sessions_this_run": span["sessions"], **({"skipped": plan.why_nothing_read} if idle else {})},
    )
    active.unpersist()
    for cached in (duplicated, capped_earlier):
        if cached is not None:
            cached.unpersist()


def defs(settings: IncrementalSettings) -> Definitions:
    return Definitions(assets=[sessions_lifecycle_manifest, session_batch], asset_checks=[sessions_unique_and_within_cap])
