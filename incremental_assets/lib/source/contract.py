"""The source events contract: Snowplow's canonical atomic column names."""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING
from urllib.parse import unquote

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.lib.delta.log import (
    STATISTICS_SLACK,
    AddedFile,
    Commit,
    Snapshot,
    commits_since,
    data_files,
    read_columns,
    read_removed,
    stored_table,
)
from incremental_assets.lib.source.arrivals import (
    NOTHING_ARRIVED,
    Arrival,
    ArrivalBounds,
    Arrivals,
    Origin,
    all_of,
    as_scalar,
    count_arrow,
    origin_by_metrics,
    origin_of_added,
    total,
)
from incremental_assets.lib.utc import naive

if TYPE_CHECKING:
    from incremental_assets.lib.settings import IncrementalSettings

REQUIRED_COLUMNS: dict[str, T.DataType] = {
    "event_id": T.StringType(),
    "app_id": T.StringType(),
    "event_name": T.StringType(),
    "collector_tstamp": T.TimestampType(),
    "dvce_created_tstamp": T.TimestampType(),
    "dvce_sent_tstamp": T.TimestampType(),
    "derived_tstamp": T.TimestampType(),
    "load_tstamp": T.TimestampType(),
    "domain_sessionid": T.StringType(),
    "domain_userid": T.StringType(),
}

OPTIONAL_COLUMNS: dict[str, T.DataType] = {
    "user_id": T.StringType(),
    "platform": T.StringType(),
    "event_vendor": T.StringType(),
    "page_url": T.StringType(),
    "page_title": T.StringType(),
    "page_referrer": T.StringType(),
    "domain_sessionidx": T.IntegerType(),
}

# Derived from load_tstamp and used as the partition column, so that a load-time window is
# read by partition pruning rather than a full scan.
LOAD_DATE = "load_date"

SAMPLE_SCHEMA = T.StructType(
    [T.StructField(name, kind, nullable=True) for name, kind in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items()]
)


def with_optional_columns(source: DataFrame) -> DataFrame:
    """The source with every optional column (null where an export has none), so that what reads a
    batch (sessions' page URLs, attributes on platform) works on any export holding the required ones."""
    missing = [name for name in OPTIONAL_COLUMNS if name not in source.columns]
    return source.withColumns({name: F.lit(None).cast(OPTIONAL_COLUMNS[name]) for name in missing}) if missing else source


# Columns filtered_events holds beyond the source's.
FILTERED_EVENTS_ADDS = ("session_identifier", "user_identifier", "event_date")


class SourceContractError(ValueError):
    """The source table cannot be processed as it is; found before the run writes anything."""


def contract_problems(schema: pa.Schema, settings: IncrementalSettings) -> list[str]:
    """What keeps a source table of `schema` (its Arrow schema, read from the Delta log) from being
    processed with `settings`: required columns missing or of another type, and identifier or
    cursor columns the settings name that the table lacks (attributes read filtered_events, which
    adds its own columns to the source's). Empty: nothing."""
    problems = []
    for name, kind in REQUIRED_COLUMNS.items():
        if name not in schema.names:
            problems.append(f"required column {name} is missing")
        elif not _is(schema.field(name).type, kind):
            problems.append(f"column {name} is {schema.field(name).type}, not {kind.simpleString()}")
    named = [settings.session_timestamp]
    named += [] if settings.session_identifier_sql else settings.session_identifiers
    named += [] if settings.user_identifier_sql else settings.user_identifiers
    named.append(settings.attribute_key)
    for spec in settings.attribute_specs():
        named += [spec.column] if spec.column else []
        named += [condition.column for condition in spec.conditions]
    known = {*schema.names, *REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *FILTERED_EVENTS_ADDS}
    problems += [f"column {name!r} (named in the settings) is missing" for name in dict.fromkeys(named) if name not in known]
    load_day = settings.source_load_date_column
    if load_day in schema.names and not pa.types.is_date(schema.field(load_day).type):
        problems.append(f"column {load_day} (source_load_date_column) is {schema.field(load_day).type}, not a date")
    elif load_day not in schema.names and load_day != LOAD_DATE:
        problems.append(f"column {load_day!r} (source_load_date_column) is missing")
    return problems


def load_day_problems(table: deltalake.DeltaTable, load_day: str) -> list[str]:
    """Files whose load day is not the UTC date of their load_tstamp, from the log's statistics (no
    Spark job): a window read by such a column would skip events it holds, silently. Files without
    statistics on either column are not judged."""
    files = data_files(table)
    names = files.column_names
    if {"min.load_tstamp", "max.load_tstamp"} - set(names):
        return []
    if f"partition.{load_day}" in names:
        first = last = files[f"partition.{load_day}"]
    elif {f"min.{load_day}", f"max.{load_day}"} <= set(names):
        first, last = files[f"min.{load_day}"], files[f"max.{load_day}"]
    else:
        return []
    loaded_first, loaded_last = pc.cast(files["min.load_tstamp"], pa.date32()), pc.cast(files["max.load_tstamp"], pa.date32())
    wrong = files.filter(pc.or_(pc.not_equal(first, loaded_first), pc.not_equal(last, loaded_last)))
    if not wrong.num_rows:
        return []
    example = wrong.slice(0, 1).to_pylist()[0]
    held = example.get(f"partition.{load_day}", example.get(f"min.{load_day}"))
    return [
        f"column {load_day} (source_load_date_column) does not hold the UTC date of load_tstamp in {wrong.num_rows} "
        f"file(s), e.g. {example['path']}: {load_day} {held}, load_tstamp {example['min.load_tstamp']} to "
        f"{example['max.load_tstamp']}; runs reading load days by it would skip events"
    ]


def require_processable(uri: str, settings: IncrementalSettings) -> None:
    """Raise SourceContractError naming every problem of the source table at `uri`: read from its
    Delta log (no Spark job), before a run decides its window."""
    table = stored_table(uri)  # a damaged one: UnreadableTableError, naming the file and the way back
    if table is None:
        raise SourceContractError(
            f"No source events table at {uri}: load an export (incremental-assets load FILE), generate the "
            "sample (incremental-assets generate), or point INCREMENTAL_ASSETS_SOURCE at your Delta table"
        )
    schema = pa.schema(table.schema().to_arrow())
    problems = contract_problems(schema, settings) or load_day_problems(table, settings.source_load_date_column)
    if problems:
        raise SourceContractError(f"The source events table at {uri} cannot be processed: " + "; ".join(problems))


def _is(arrow: pa.DataType, kind: T.DataType) -> bool:
    if isinstance(kind, T.StringType):
        return pa.types.is_string(arrow) or pa.types.is_large_string(arrow) or pa.types.is_string_view(arrow)
    return pa.types.is_timestamp(arrow)


def arrived_since(uri: str, since: Snapshot | None, bounds: ArrivalBounds, cursor: str) -> tuple[Snapshot, Arrivals]:
    """The source's snapshot now, and the rows added to it after `since` (all of them: None), by
    arrival class: only rows new to the table, not the copies its owner's rewrites commit
    (`_arrived_files`). A file of new rows whose statistics put every row in one class is not read
    (Delta keeps timestamp statistics to the millisecond, so a maximum may hide up to a millisecond
    more); the cursor of the others, and of every file with rows behind it, is read with Arrow, no JVM."""
    now, commits = commits_since(uri, since)
    files, copied = _arrived_files(uri, commits)
    judged, unread, mixed = [], [], []
    for added, origin in files:
        if origin is Origin.MIXED:
            mixed.append(added)
            continue
        low, high, nulls = added.minimum.get(cursor), added.maximum.get(cursor), added.nulls.get(cursor)
        arrival = None
        if added.rows is not None and nulls == added.rows:
            arrival = Arrival.NULL_CURSOR
        elif added.rows is not None and nulls == 0 and low is not None and high is not None:
            arrival = bounds.reason_of_range(low, high + STATISTICS_SLACK)
        if arrival is None or arrival is Arrival.BEHIND:  # behind: its exact range is wanted
            unread.append(added)
        else:
            judged.append(all_of(added.rows, arrival))
    read = NOTHING_ARRIVED
    if unread:
        read = count_arrow(read_columns(uri, [f.path for f in unread], [cursor]).column(cursor).combine_chunks(), bounds)
    return now, total(judged) + read + _new_rows(uri, mixed, copied, bounds, cursor)


def load_days(cursor: str, lower: datetime, upper: datetime) -> tuple[date, date | None]:
    """The source's load days [first, last] that can hold a row with lower <= cursor <= upper; last
    None: open-ended. No row is loaded before the day of its cursor (collector_tstamp <= load_tstamp),
    and with the load_tstamp cursor the upper limit's day bounds them too."""
    return lower.date(), upper.date() if cursor == "load_tstamp" else None


def loaded_between(load_day: str, first_day: date, last_day: date | None) -> pc.Expression:
    """transforms.sessions._loaded as an Arrow filter: on a partition column it prunes files."""
    day = pc.field(load_day)
    loaded = day >= pa.scalar(first_day, pa.date32())
    if last_day is not None:
        loaded = loaded & (day <= pa.scalar(last_day, pa.date32()))
    return loaded | day.is_null()


def first_after(uri: str, settings: IncrementalSettings, after: datetime, until: datetime) -> datetime | None:
    """The least cursor value in (after, until] among the source's rows (None: none), without a
    JVM. Only the files that can hold one are read, the cursor column alone: those of the load days
    that can hold it whose statistics allow it (none, when no row arrived past `after`)."""
    maybe = [f["path"] for f in _files_within(uri, settings, after, until)]
    if not maybe:
        return None
    values = read_columns(uri, maybe, [settings.session_timestamp]).column(settings.session_timestamp)
    inside = pc.and_(pc.greater(values, as_scalar(after, values.type)), pc.less_equal(values, as_scalar(until, values.type)))
    return naive(pc.min(pc.filter(values, inside)).as_py())


def rows_within(uri: str, settings: IncrementalSettings, after: datetime, until: datetime) -> int | None:
    """How many rows the source's files that may hold a cursor in (after, until] hold: the most a
    window's read meets, from the log alone (None: a file without its row count)."""
    counts = [f.get("num_records") for f in _files_within(uri, settings, after, until)]
    return None if None in counts else sum(counts)


def _files_within(uri: str, settings: IncrementalSettings, after: datetime, until: datetime) -> list[dict]:
    """The source's data files (rows of data_files) that may hold a cursor in (after, until]."""
    cursor, days = settings.session_timestamp, load_days(settings.session_timestamp, after, until)
    files = data_files(stored_table(uri)).to_pylist()
    return [f for f in files if _may_hold(f, cursor, settings.source_load_date_column, (after, until), days)]


def _may_hold(file: dict, cursor: str, load_day: str, window: tuple[datetime, datetime], days: tuple[date, date | None]) -> bool:
    """Whether a data file (a row of data_files) may hold a cursor in (after, until]: its
    statistics, and its load days (partition value or statistics), do not rule it out."""
    if file.get("num_records") is not None and file.get(f"null_count.{cursor}") == file["num_records"]:
        return False
    (after, until), (first_day, last_day) = window, days
    low, high = naive(file.get(f"min.{cursor}")), naive(file.get(f"max.{cursor}"))
    if (high is not None and high + STATISTICS_SLACK <= after) or (low is not None and low > until):
        return False
    day = file.get(f"partition.{load_day}")
    earliest, latest = (day, day) if day is not None else (file.get(f"min.{load_day}"), file.get(f"max.{load_day}"))
    return not ((latest is not None and latest < first_day) or (last_day is not None and earliest is not None and earliest > last_day))


def _arrived_files(uri: str, commits: list[Commit]) -> tuple[list[tuple[AddedFile, Origin]], list[pa.Array]]:
    """The files `commits` added that the table still holds, with the origin of their rows (those
    of held rows only left out), and the event ids of the held rows that rewrites copied: what
    tells a mixed file's copies from its new rows. The ids are read from the held files a rewrite
    removed, still on disk until VACUUM; where one is gone, the commit's operation metrics decide
    (`origin_by_metrics`). A commit that removes nothing (an append) costs no read."""
    files: dict[str, tuple[AddedFile, Origin]] = {}
    copied = []
    for commit in commits:
        removed = {path: files.pop(unquote(path), (None, Origin.HELD))[1] for path in commit.removed}
        origin = origin_of_added(removed.values(), commit.data_change)
        held = [path for path, was in removed.items() if was is Origin.HELD]
        if origin is Origin.MIXED and held:
            ids = read_removed(uri, held, ["event_id"])
            if ids is None:
                origin = origin_by_metrics(removed.values(), commit.metrics)
            else:
                copied.append(_event_ids(ids))
        files.update({unquote(added.path): (added, origin) for added in commit.added})
    return [(added, origin) for added, origin in files.values() if origin is not Origin.HELD], copied


def _new_rows(uri: str, mixed: list[AddedFile], copied: list[pa.Array], bounds: ArrivalBounds, cursor: str) -> Arrivals:
    """The rows of rewritten files that copy no held row: a MERGE's inserts, or rows appended since
    and rewritten after (a row without an event_id is a copy when a rewrite copied such rows)."""
    if not mixed:
        return NOTHING_ARRIVED
    rows = read_columns(uri, [added.path for added in mixed], ["event_id", cursor])
    new = pc.invert(pc.is_in(_event_ids(rows), value_set=pa.concat_arrays(copied)))
    return count_arrow(rows.column(cursor).combine_chunks().filter(new), bounds)


def _event_ids(rows: pa.Table) -> pa.Array:
    """As one string type, whichever writer wrote the files (string, large or view)."""
    return rows.column("event_id").combine_chunks().cast(pa.string())
