"""The session layer as DataFrame → DataFrame functions, free of Dagster and of I/O.

Reading and writing tables is the assets' job; these functions only say which rows.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F

from incremental_assets.lib.source.contract import load_days
from incremental_assets.lib.settings import IncrementalSettings

SESSION = "session_identifier"
USER = "user_identifier"
COPIES = "_copies"
NULL_CURSOR = "null_cursor"  # the drop reason of a row whose session timestamp is null


def days(n: int) -> Column:
    """An interval of `n` days, as a value (a setting never becomes SQL text)."""
    return F.make_dt_interval(days=F.lit(n))


def present(value: Column) -> Column:
    """Whether an id is there: not null, and not blank (an export's empty or whitespace text is no id)."""
    return value.isNotNull() & (F.trim(value.cast("string")) != "")


def _id(value: Column) -> Column:
    """An id as text, null where it is blank."""
    return F.when(present(value), value.cast("string"))


def identifier(columns: list[str], sql: str | None) -> Column:
    """First non-blank of `columns`, or the deployment's SQL expression (blank: null)."""
    if sql:
        return _id(F.expr(sql))
    return F.coalesce(*[_id(F.col(c)) for c in columns]) if len(columns) > 1 else _id(F.col(columns[0]))


def session_id(settings: IncrementalSettings) -> Column:
    return identifier(settings.session_identifiers, settings.session_identifier_sql)


def user_id(settings: IncrementalSettings) -> Column:
    return identifier(settings.user_identifiers, settings.user_identifier_sql)


def sent_in_time(settings: IncrementalSettings) -> Column:
    """The late-sent filter; null (dropped) where a device timestamp is missing, unless allowed."""
    sent, created = F.col("dvce_sent_tstamp"), F.col("dvce_created_tstamp")
    if settings.allow_null_dvce_tstamps:
        sent, created = F.coalesce(sent, F.col("collector_tstamp")), F.coalesce(created, F.col("collector_tstamp"))
    return sent <= created + days(settings.days_late_allowed)


def app_allowed(settings: IncrementalSettings) -> Column:
    if not settings.app_ids:
        return F.lit(True)
    allowed = F.col("app_id").isin(settings.app_ids)
    return allowed | F.col("app_id").isNull() if settings.allow_null_app_id else F.coalesce(allowed, F.lit(False))


def _loaded(load_day: str, first_day: date, last_day: date | None = None) -> Column:
    """The source's `load_day` within [first_day, last_day] (open-ended without last_day), or null.

    A partition (or clustering) column, so Delta reads only those load days; the null load day
    holds the rows of older loaders (null load_tstamp), which are processed normally and must
    never be pruned away.
    """
    loaded = F.col(load_day) >= F.lit(first_day)
    if last_day is not None:
        loaded = loaded & (F.col(load_day) <= F.lit(last_day))
    return loaded | F.col(load_day).isNull()


def load_day_of(source: DataFrame, settings: IncrementalSettings) -> str | None:
    """The column the reads below prune the source by (`source_load_date_column`), or None when the
    source has none: it is read whole."""
    return settings.source_load_date_column if settings.source_load_date_column in source.columns else None


def _load_days_for(source: DataFrame, settings: IncrementalSettings, lower: datetime, upper: datetime) -> DataFrame:
    """The source's rows of the load days that can hold a row with lower <= cursor <= upper
    (`load_days`), or all of them when it has no load-day column."""
    load_day = load_day_of(source, settings)
    if load_day is None:
        return source
    return source.where(_loaded(load_day, *load_days(settings.session_timestamp, lower, upper)))


def in_cursor_range(source: DataFrame, settings: IncrementalSettings, lower: datetime, upper: datetime) -> DataFrame:
    """Rows with lower <= cursor <= upper, pruned by load day where the source has one."""
    cursor = F.col(settings.session_timestamp)
    return _load_days_for(source, settings, lower, upper).where(cursor.between(F.lit(lower), F.lit(upper)))


def next_event_after(source: DataFrame, settings: IncrementalSettings, upper: datetime, now: datetime) -> datetime | None:
    """Where the next run resumes past an empty window: the first event with upper < cursor <= now,
    so a gap in the data costs one run, not one per backfill_limit_days. None: the stream is caught
    up (an event stamped in the future is not a place to resume to)."""
    ts = settings.session_timestamp
    later = _load_days_for(source, settings, upper, now).where((F.col(ts) > F.lit(upper)) & (F.col(ts) <= F.lit(now)))
    return later.agg(F.min(ts)).first()[0]


def window_and_null_cursor_rows(source: DataFrame, settings: IncrementalSettings, lower: datetime, upper: datetime) -> DataFrame:
    """In one scan: the window (lower <= cursor <= upper), and the rows no window can ever hold (null
    cursor) among those loaded in the window's days or without a load day at all."""
    cursor, load_day = F.col(settings.session_timestamp), load_day_of(source, settings)
    rows = _load_days_for(source, settings, lower, upper)
    null_cursor = cursor.isNull()
    if load_day is not None:
        null_cursor = null_cursor & _loaded(load_day, lower.date(), upper.date())
    return rows.where(cursor.between(F.lit(lower), F.lit(upper)) | null_cursor)


ERASED_USER = "erased_user"  # a row of a person `forget` erased (lib/upkeep/erasure.py)
CAP = "cap_tstamp"  # quarantined_sessions: the end its session was capped at (start + max_session_days)


def classify_window(
    window: DataFrame, quarantined: DataFrame | None, settings: IncrementalSettings, erased: Column | None = None
) -> DataFrame:
    """Every event of `window` with its session and user ids and why it is dropped (or null: it is
    eligible); a row without a cursor (if the window holds any) is `NULL_CURSOR`, a blank id is a
    null one, and an event of a quarantined session is dropped beyond its cap (within it, it is one
    of the session's events); `erased`: the rows of erased people (on the user id), dropped. The one
    eligibility rule: the lifecycle counts the window by it, the batch picks its candidates by it."""
    ts = F.col(settings.session_timestamp)
    marked = window.withColumn(SESSION, session_id(settings)).withColumn(USER, user_id(settings))
    quarantined_here = F.lit(False)
    if quarantined is not None:
        cap = F.col(CAP) if CAP in quarantined.columns else F.lit(None).cast("timestamp")  # a table of an earlier release
        quarantine = quarantined.select(F.col(SESSION).alias("_q"), cap.alias("_cap"))
        marked = marked.join(F.broadcast(quarantine), marked[SESSION] == quarantine["_q"], "left")
        quarantined_here = F.col("_q").isNotNull() & (F.col("_cap").isNull() | (ts > F.col("_cap")))
    reason = (
        F.when(ts.isNull(), NULL_CURSOR)
        .when(~present(F.col("event_id")), "null_event_id")
        .when(F.col(SESSION).isNull(), "null_session_id")
        .when(~app_allowed(settings), "app_filtered")
        .when(sent_in_time(settings).isNull(), "null_dvce_tstamps")
        .when(~sent_in_time(settings), "late_sent")
        .when(quarantined_here, "quarantined_session")
        .when(F.lit(False) if erased is None else erased, ERASED_USER)
    )
    return marked.withColumn("drop_reason", reason).drop("_q", "_cap")


def window_groups(classified: DataFrame, ts: str) -> DataFrame:
    """The window's events grouped by (session, user, drop reason): how many, the first and last ts.

    A few rows per session, from one hash aggregation: the drop counts and the candidates are both
    read from it (caching every event for two passes was slower).
    """
    return classified.groupBy(SESSION, USER, "drop_reason").agg(
        F.count(F.lit(1)).alias("events"), F.min(ts).alias("start_tstamp"), F.max(ts).alias("end_tstamp")
    )


def new_session_candidates(groups: DataFrame) -> DataFrame:
    """One row per session with an eligible event in the window (`window_groups`): its first and
    last ts, its user (grouped by user first, as a string max over every event would sort them all)."""
    return groups.where(F.col("drop_reason").isNull()).groupBy(SESSION).agg(
        F.max(USER).alias(USER), F.min("start_tstamp").alias("start_tstamp"), F.max("end_tstamp").alias("end_tstamp")
    )


STORED_AT_CAP = "stored_at_cap"


def merge_lifecycle(candidates: DataFrame, stored: DataFrame, max_session_days: int) -> DataFrame:
    """Lifecycle rows to upsert: first user sticks, least start, greatest end capped at start + MSD.

    `stored` holds the rows considered (start within session_lookback_days). A stored row whose
    end already reached its cap is left alone: it comes out as stored, flagged `STORED_AT_CAP`, not
    to be written. Its start day still bounds the sessions the run quarantines: a run that crashed
    between capping a session and quarantining it left it so, and the next one must finish it.
    """
    cap = days(max_session_days)
    s = stored.select(*[F.col(c).alias(f"s_{c}") for c in (SESSION, USER, "start_tstamp", "end_tstamp")])
    joined = candidates.join(s, candidates[SESSION] == s[f"s_{SESSION}"], "left")
    start = F.least(F.col("start_tstamp"), F.coalesce(F.col("s_start_tstamp"), F.col("start_tstamp")))
    end = F.greatest(F.col("end_tstamp"), F.coalesce(F.col("s_end_tstamp"), F.col("end_tstamp")))
    at_cap = F.coalesce(F.col("s_end_tstamp") >= F.col("s_start_tstamp") + cap, F.lit(False))

    def merged_or_stored(value: Column, name: str) -> Column:
        return F.when(at_cap, F.col(f"s_{name}")).otherwise(value).alias(name)

    merged = joined.select(
        F.col(SESSION),
        merged_or_stored(F.coalesce(F.col(f"s_{USER}"), F.col(USER)), USER),
        merged_or_stored(start, "start_tstamp"),
        merged_or_stored(F.least(end, start + cap), "end_tstamp"),
        F.col("s_start_tstamp"),
        F.col("s_end_tstamp"),
        F.col(f"s_{USER}"),
        at_cap.alias(STORED_AT_CAP),
    )
    changed = (
        F.col("s_start_tstamp").isNull()
        | (F.col("start_tstamp") != F.col("s_start_tstamp"))
        | (F.col("end_tstamp") != F.col("s_end_tstamp"))
        | (F.col(f"s_{USER}").isNull() & F.col(USER).isNotNull())
    )
    return merged.where(changed | F.col(STORED_AT_CAP)).select(
        SESSION, USER, "start_tstamp", "end_tstamp", F.to_date("start_tstamp").alias("start_date"), STORED_AT_CAP
    )


def earliest_start(lower: datetime, max_session_days: int) -> datetime:
    """The earliest start of a session a window from `lower` can hold (L − MSD)."""
    return lower - timedelta(days=max_session_days)


def sessions_this_run(
    lifecycle: DataFrame, lower: datetime, upper: datetime, max_session_days: int, until: datetime | None = None
) -> DataFrame:
    """Sessions active in the window: start in [L − MSD, U], end >= L; end capped at U (`until`
    when given: a keyhole window lies in the past, and its sessions' later events, already
    loaded, are theirs too, so that each is rebuilt whole)."""
    earliest = earliest_start(lower, max_session_days)
    return (
        lifecycle.where(F.col("start_date") >= F.lit(earliest.date()))
        .where(F.col("start_tstamp").between(F.lit(earliest), F.lit(upper)) & (F.col("end_tstamp") >= F.lit(lower)))
        .select(
            SESSION,
            USER,
            "start_tstamp",
            F.col("end_tstamp").alias("lifecycle_end_tstamp"),
            F.least(F.col("end_tstamp"), F.lit(until or upper)).alias("end_tstamp"),
        )
    )


def _reached_cap(max_session_days: int, end: str = "lifecycle_end_tstamp") -> Column:
    """Whether a session's lifecycle end (by default as `sessions_this_run` names it) reached start + MSD."""
    return F.col(end) >= F.col("start_tstamp") + days(max_session_days)


def newly_quarantined(sessions: DataFrame, max_session_days: int, quarantined_at: datetime) -> DataFrame:
    """Sessions whose end reached start + MSD days: they will never be extended again."""
    return sessions.where(_reached_cap(max_session_days)).select(
        SESSION, F.lit(quarantined_at).alias("quarantined_at"), _cap_of(max_session_days)
    )


def _cap_of(max_session_days: int) -> Column:
    return (F.col("start_tstamp") + days(max_session_days)).alias(CAP)


def capped_before_window(lifecycle: DataFrame, first_day: date, lower: datetime, max_session_days: int) -> DataFrame:
    """Sessions started from `first_day` on, too early to be among the sessions of a window from
    `lower` (before lower − MSD), whose lifecycle end reached their cap.

    A late event of such a session caps its lifecycle row in a run it is not a session of, and a
    run over a wider window (one shot over the same rows) quarantines it: so must this run.
    """
    return lifecycle.where(
        (F.col("start_date") >= F.lit(first_day))
        & (F.col("start_tstamp") < F.lit(earliest_start(lower, max_session_days)))
        & _reached_cap(max_session_days, end="end_tstamp")
    ).select(SESSION, _cap_of(max_session_days))


def batch_counts(ts: str, window: tuple[datetime, datetime] | None = None) -> list[Column]:
    """What `session_events` found, as aggregates its write observes (see run_state.RunBatch): the
    events, the greatest cursor value (microseconds since the epoch), the copies the dedupe dropped,
    and (given the run's window) how many of the events lie in it."""
    counts = [
        F.count(F.lit(1)).alias("events"),
        F.unix_micros(F.max(ts)).alias("batch_max_micros"),
        F.sum(F.col(COPIES) - 1).alias("duplicates"),
    ]
    if window is not None:
        counts.append(F.count_if(_within(F.col(ts), window)).alias("window_rows_kept"))
    return counts


def window_counts(ts: str, max_session_days: int, window: tuple[datetime, datetime]) -> list[Column]:
    """What became of the window's eligible events in `session_events`, before its dedupe (observed
    there): those of this run's sessions within their caps, and those beyond their session's cap
    (or of a session too old to be this run's, which is beyond its cap too)."""
    inside = _within(F.col(ts), window)
    within_cap = F.coalesce(_within_cap(ts, max_session_days), F.lit(False))
    return [
        F.count_if(inside & within_cap).alias("window_rows_in_sessions"),
        F.count_if(inside & ~within_cap).alias("beyond_session_cap"),
    ]


def _within(value: Column, window: tuple[datetime, datetime]) -> Column:
    return value.between(F.lit(window[0]), F.lit(window[1]))


def within_window(rows: DataFrame, ts: str, window: tuple[datetime, datetime]) -> DataFrame:
    """The rows whose cursor lies in the window [lower, upper] (inclusive)."""
    return rows.where(_within(F.col(ts), window))


def _within_cap(ts: str, max_session_days: int) -> Column:
    """An event within [start, start + max_session_days] of its session (`_start`); null without one."""
    return (F.col(ts) >= F.col("_start")) & (F.col(ts) <= F.col("_start") + days(max_session_days))


NO_SESSIONS = {"sessions": 0, "at_cap": 0, "lo": None, "hi": None}  # the span of a run without sessions


def sessions_span(sessions: DataFrame, max_session_days: int):
    """In one pass over this run's sessions: how many, how many reached their cap, and the span
    [lo, hi] of cursor values their events can have (None, None without sessions)."""
    return sessions.agg(
        F.count(F.lit(1)).alias("sessions"),
        F.count_if(_reached_cap(max_session_days)).alias("at_cap"),
        F.min("start_tstamp").alias("lo"),
        F.max("end_tstamp").alias("hi"),
    ).first()


def candidate_events(
    source: DataFrame, settings: IncrementalSettings, span, quarantined: DataFrame | None = None,
    window: tuple[datetime, datetime] | None = None, erased: Column | None = None, sessions: DataFrame | None = None,
) -> DataFrame:
    """The source rows that can be events of this run's sessions (see `sessions_span`), and, given
    the run's window, every row of it too: eligible by the lifecycle's rule (`classify_window`),
    their session id set. With `sessions` (this run's, few enough to broadcast), the rows of other
    sessions outside the window are dropped before they are classified: the sessions of an hour's
    window span days of the source, most of whose rows are other sessions'."""
    lo, hi = candidate_range(span, window)
    rows = source.where(F.lit(False)) if lo is None else in_cursor_range(source, settings, lo, hi)
    if sessions is not None and lo is not None:
        rows = _of_sessions_or_window(rows, settings, sessions, window)
    eligible = classify_window(rows, quarantined, settings, erased).where(F.col("drop_reason").isNull())
    return eligible.drop(USER, "drop_reason")


def _of_sessions_or_window(
    rows: DataFrame, settings: IncrementalSettings, sessions: DataFrame, window: tuple[datetime, datetime] | None,
) -> DataFrame:
    """The rows of `sessions` (by the session id `classify_window` gives them), and every row of the
    window (None: none), whatever its session: the batch accounts for each of those."""
    ids = F.broadcast(sessions.select(F.col(SESSION).alias("_of_run")))
    keep = F.col("_of_run").isNotNull()
    if window is not None:
        keep = keep | _within(F.col(settings.session_timestamp), window)
    return rows.join(ids, session_id(settings) == F.col("_of_run"), "left").where(keep).drop("_of_run")


def candidate_range(span, window: tuple[datetime, datetime] | None) -> tuple[datetime | None, datetime | None]:
    """The cursor range [lo, hi] that holds every candidate event: the sessions' span and the
    window (None, None: neither)."""
    lows, highs = [span["lo"], window and window[0]], [span["hi"], window and window[1]]
    return min((t for t in lows if t), default=None), max((t for t in highs if t), default=None)


ID_HASH = "_id_hash"


def id_hash() -> Column:
    return F.xxhash64("event_id").alias(ID_HASH)


def duplicated_ids(candidates: DataFrame) -> DataFrame:
    """The 64-bit hashes of the event_ids more than one candidate row holds: counted on that one
    number (a third of the bytes of an id to shuffle, and a hash table of longs), so that only
    their rows (a few in a hundred) pay the dedupe's shuffle of whole rows. A superset of the ids
    the batch holds twice: a copy outside its session's cap is dropped later, and an id that shares
    its hash with another is ranked by itself all the same (the ranking is by event_id)."""
    return (
        candidates.groupBy(id_hash()).count().where(F.col("count") > 1).select(ID_HASH, F.lit(True).alias("_dup"))
    )


def session_events(
    candidates: DataFrame, sessions: DataFrame, settings: IncrementalSettings, duplicated: DataFrame | None = None,
    observed: tuple[Observation, tuple[datetime, datetime]] | None = None,
) -> DataFrame:
    """All events of this run's sessions (`sessions_this_run`, from `candidate_events`) within their
    caps, one row per event_id. With `duplicated` (`duplicated_ids(candidates)`, broadcast when
    small) only the rows of those ids are ranked; without it every row is (one shuffle of them all).
    With `observed` (an Observation and the run's window), what became of the window's candidates
    is observed before the dedupe (`window_counts`).

    The earliest (ts, dvce_created_tstamp) wins a duplicate; the user comes from the lifecycle.
    COPIES counts how many rows shared the event_id (1: no duplicate).
    """
    ts = settings.session_timestamp
    s = sessions.select(SESSION, F.col(USER), F.col("start_tstamp").alias("_start"))
    if observed is None:
        joined = candidates.join(s, SESSION)
    else:  # every candidate, to count those beyond their session's cap
        observation, window = observed
        joined = candidates.join(s, SESSION, "left").observe(observation, *window_counts(ts, settings.max_session_days, window))
    in_session = joined.where(_within_cap(ts, settings.max_session_days)).drop("_start")
    if duplicated is None:
        return _first_copies(in_session, ts)
    marked = in_session.withColumn(ID_HASH, id_hash()).join(duplicated, ID_HASH, "left").drop(ID_HASH)
    single = marked.where(F.col("_dup").isNull()).drop("_dup").withColumn(COPIES, F.lit(1).cast("long"))
    return single.unionByName(_first_copies(marked.where(F.col("_dup")).drop("_dup"), ts))


def _first_copies(events: DataFrame, ts: str) -> DataFrame:
    """The earliest copy of each event_id, with how many copies there were (COPIES)."""
    by_id = Window.partitionBy("event_id")
    first = by_id.orderBy(F.col(ts).asc(), F.col("dvce_created_tstamp").asc_nulls_last())
    return (
        events.withColumn("_n", F.row_number().over(first))
        .withColumn(COPIES, F.count(F.lit(1)).over(by_id))
        .where(F.col("_n") == 1)
        .drop("_n")
    )


def session_rows(events: DataFrame) -> DataFrame:
    """One row per session of `events` (all of each session's events): user, app, start, end,
    events, page views, first and last page, duration, and the start's day (`start_date`).

    Counted by (session, user, app) first, a hash aggregation, and the first and last page picked
    from the page views alone: one aggregation picking strings by time over every event sorted
    them all. The app is the first event's (the least
    app_id of a tie).
    """
    page_views = F.col("event_name") == "page_view"
    per_app = events.groupBy(SESSION, USER, "app_id").agg(
        F.min("derived_tstamp").alias("start_tstamp"),
        F.max("derived_tstamp").alias("end_tstamp"),
        F.count("event_id").alias("events"),
        F.count_if(page_views).alias("page_views"),
    )
    by_time = F.struct("derived_tstamp", "event_id")
    pages = events.where(page_views).groupBy(SESSION).agg(
        F.min_by("page_url", by_time).alias("first_page_url"), F.max_by("page_url", by_time).alias("last_page_url")
    )
    return (
        per_app.groupBy(SESSION)
        .agg(
            F.max(USER).alias(USER),
            F.min_by("app_id", F.struct("start_tstamp", "app_id")).alias("app_id"),
            F.min("start_tstamp").alias("start_tstamp"),
            F.max("end_tstamp").alias("end_tstamp"),
            F.sum("events").alias("events"),
            F.sum("page_views").alias("page_views"),
        )
        .join(pages, SESSION, "left")
        .withColumns({
            "duration_seconds": F.col("end_tstamp").cast("long") - F.col("start_tstamp").cast("long"),
            "start_date": F.to_date("start_tstamp"),
        })
    )
