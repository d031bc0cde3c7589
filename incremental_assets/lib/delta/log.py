"""Reading Delta tables without a JVM (deltalake): a table's log, its files and statistics, what
its commits since a version, and the rows of small tables (manifests, run records).

What arrived since a version:

The commit files after that version list, per commit, the data files it added (with their
statistics) and removed, whether it changed data (a compaction does not) and its operation
metrics: lib/source tells rows new to the table from the copies a rewrite commits. Delta keeps
commit files for `delta.logRetentionDuration` (30 days by default); when the ones needed are gone,
the files of the current snapshot modified after the version's commit are taken instead.

Damaged tables:

Every table is opened and read here, so a table that is there but cannot be read (its last commit
cut off or garbled by a crash, a data file gone, storage refusing access) fails every caller, the
command line and Dagster steps alike, with one UnreadableTableError: one line naming the table, the
file and the way back.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Mapping
from urllib.parse import unquote

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyarrow.parquet import filters_to_expression
from pyspark.sql import types as T

from incremental_assets.lib.delta.spec import Window

EPOCH = datetime(1970, 1, 1)
# Delta keeps timestamp statistics to the millisecond: a file's maximum may hide up to this much more.
STATISTICS_SLACK = timedelta(microseconds=999)
# The actions a commit file holds, one a line (Delta protocol); a line of none of them is no commit.
DELTA_ACTIONS = {"add", "remove", "metaData", "protocol", "commitInfo", "txn", "cdc", "domainMetadata"}
# Commit files read at once (threads): on S3 one is a request of tens of milliseconds.
COMMIT_READS = 16


@dataclass(frozen=True)
class Snapshot:
    """A table's identity and version, and when that version was committed (naive UTC)."""

    table_id: str
    version: int
    committed_at: datetime


@dataclass(frozen=True)
class AddedFile:
    """A data file some commit added, with what its statistics say (None where they say nothing)."""

    path: str
    rows: int | None
    minimum: Mapping[str, Any] = field(default_factory=dict)
    maximum: Mapping[str, Any] = field(default_factory=dict)
    nulls: Mapping[str, int] = field(default_factory=dict)


def snapshot(table: deltalake.DeltaTable) -> Snapshot:
    return Snapshot(table.metadata().id, table.version(), _moment(table.history(1)[0]["timestamp"]))


def _files_written_after(table: deltalake.DeltaTable, since: Snapshot | None) -> list[AddedFile]:
    """The snapshot's data files (every one: None), or those modified after `since`'s commit: what
    arrived when the commit files in between are gone."""
    if since is None:
        return _current_files(table)
    cutoff = (since.committed_at - EPOCH) // timedelta(milliseconds=1)
    return [f for f, written in _current_files(table, with_times=True) if written > cutoff]


def _commit_actions(uri: str, versions: range) -> list[list[dict]] | None:
    """The actions of each commit in `versions`, or None when a commit file is gone."""
    commits = _commit_files(uri, versions)
    return None if any(commit is None for commit in commits) else commits


def _commit_files(uri: str, versions: range) -> list[list[dict] | None]:
    """The actions of each commit in `versions` (None: its file is gone), on an object store read
    COMMIT_READS at a time: there each file is a request, and one after another they add up."""
    filesystem, root = pafs.FileSystem.from_uri(_arrow_uri(uri))

    def read(version: int) -> list[dict] | None:
        try:
            with filesystem.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as stream:
                text = stream.read().decode()
        except FileNotFoundError:
            return None
        # JSON lines end at "\n" alone: a string in a file's statistics may hold U+2028 or U+0085
        # unescaped (a page title's), where str.splitlines would cut it
        return [json.loads(line) for line in text.split("\n") if line.strip()]

    if len(versions) < 2 or filesystem.type_name == "local":  # a local file is read in microseconds: no threads
        return [read(version) for version in versions]
    with ThreadPoolExecutor(min(COMMIT_READS, len(versions))) as pool:
        return list(pool.map(read, versions))


def _added(action: Mapping[str, Any]) -> AddedFile:
    add = action["add"]
    stats = json.loads(add.get("stats") or "{}")
    return AddedFile(
        add["path"], stats.get("numRecords"), _parsed(stats.get("minValues")), _parsed(stats.get("maxValues")),
        stats.get("nullCount") or {},
    )


def _current_files(table: deltalake.DeltaTable, with_times: bool = False) -> list:
    """The snapshot's data files as AddedFile (with their modification times in epoch ms, if asked)."""
    result = []
    for row in data_files(table).to_pylist():
        stats = {kind: {k.split(".", 1)[1]: _naive(v) for k, v in row.items() if k.startswith(f"{kind}.") and v is not None}
                 for kind in ("min", "max", "null_count")}
        added = AddedFile(row["path"], row.get("num_records"), stats["min"], stats["max"], stats["null_count"])
        result.append((added, row["modification_time"]) if with_times else added)
    return result


def _parsed(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Statistics as values: timestamps (ISO text in the log) as naive UTC datetimes."""
    parsed = {}
    for name, value in (values or {}).items():
        if isinstance(value, str):
            try:
                value = _naive(datetime.fromisoformat(value))
            except ValueError:
                pass
        parsed[name] = value
    return parsed


def _naive(value: Any) -> Any:
    return value.astimezone(timezone.utc).replace(tzinfo=None) if isinstance(value, datetime) and value.tzinfo else value


def _arrow_uri(uri: str) -> str:
    """Arrow names the S3 scheme s3, where Hadoop names it s3a."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def filesystem_of(uri: str) -> tuple[pafs.FileSystem, str]:
    """Arrow's file system of a table's URI, and the table's root in it."""
    return pafs.FileSystem.from_uri(_arrow_uri(uri))


def _moment(millis: int) -> datetime:
    return EPOCH + timedelta(milliseconds=millis)


# A run reads its small state tables many times (the manifests, the run log, the plans), mostly
# unchanged between two reads: their rows are kept per table version.
_ROWS_KEPT = 64
_rows: dict[tuple, list[dict[str, Any]]] = {}


def read_rows(
    uri: str, columns: list[str] | None = None, filters: list | None = None, table: deltalake.DeltaTable | None = None
) -> list[dict[str, Any]] | None:
    """The rows of a small Delta table (optionally filtered), or None when there is no table at `uri`;
    those of `table`'s version when given (a snapshot the caller commits against).

    Filters on partition columns prune the files read; the others apply to the rows read (files
    that deltalake's MERGE wrote hold string_view columns, which Arrow's scan filters cannot compare).
    A version read before is not read again: its rows are copied from the last read (a table made
    afresh at the same place has another id)."""
    if table is None:
        table = stored_table(uri)
    if table is None:
        return None
    metadata = table.metadata()
    key = (uri, metadata.id, table.version(), repr(columns), repr(filters))
    if key not in _rows:
        pruning, rest = split_filters(filters or [], set(metadata.partition_columns))
        with reading(uri):
            rows = scan(table, columns, pruning)
        if len(_rows) >= _ROWS_KEPT:
            del _rows[next(iter(_rows))]  # the oldest
        _rows[key] = (rows.filter(filters_to_expression(rest)) if rest else rows).to_pylist()
    return [dict(row) for row in _rows[key]]


def split_filters(filters: list[tuple], partitioned: set) -> tuple[list[tuple], list[tuple]]:
    """`filters` as a read in Arrow takes them: those on partition columns, which `scan` prunes
    files by, and the others, which keep rows of what it read."""
    return [f for f in filters if f[0] in partitioned], [f for f in filters if f[0] not in partitioned]


def scan(table: deltalake.DeltaTable, columns: list[str] | None, on_partitions: list | None) -> pa.Table:
    """`columns` of the rows that filters on the table's partition columns keep. The filters first
    prune the log's list of files: deltalake's to_pyarrow_table(filters=) only tests them on a
    fragment of every file, a cost that grew with the table's files (benchmarks/comparisons.md). They
    then keep rows as they did; one naming a null is left to that (deltalake's pruning spells a null '')."""
    return dataset_of(table, on_partitions).to_table(
        columns=columns, filter=filters_to_expression(on_partitions) if on_partitions else None
    )


def dataset_of(table: deltalake.DeltaTable, on_partitions: list | None) -> ds.Dataset:
    """The table's files as a pyarrow dataset, without those the partition filters rule out (`scan`)."""
    pruning = [(column, op, value) for column, op, value in on_partitions or [] if not _names_null(op, value)]
    return table.to_pyarrow_dataset(file_pruning_predicate=pruning or None)


def _names_null(op: str, value: Any) -> bool:
    return any(v is None for v in value) if op in ("in", "not in") else value is None


def table_version(uri: str) -> int | None:
    table = stored_table(uri)
    return None if table is None else table.version()


def latest_marker(uri: str, key: str, within: int | None = None) -> Any:
    """`key` from the newest commit (of the last `within`, if given) whose userMetadata (JSON)
    carries it, or None."""
    table = stored_table(uri)
    if table is None:
        return None
    with reading(uri):
        history = table.history(within)
    for commit in history:  # newest first
        try:
            marker = json.loads(commit.get("userMetadata") or "{}")
        except ValueError:
            continue
        if isinstance(marker, dict) and marker.get(key) is not None:
            return marker[key]
    return None


def row_count(uri: str) -> int | None:
    table = stored_table(uri)
    if table is None:
        return None
    with reading(uri):
        return table.count()


class UnreadableTableError(RuntimeError):
    """A table that is there but cannot be read: a damaged commit or data file, or storage refusing
    access. Its message is one line naming the table, the file and the way back."""


def stored_table(uri: str) -> deltalake.DeltaTable | None:
    """The table at `uri` opened from its log (no Spark job), or None when there is none. A table
    that is there but cannot be read raises UnreadableTableError: a write must never take it for
    missing and create it afresh."""
    try:
        return _open(uri)
    except TableNotFoundError:
        return None


def _open(uri: str, version: int | None = None) -> deltalake.DeltaTable:
    """The table at `uri` (its latest version unless given); TableNotFoundError when there is none.
    The latest commit is checked too: delta-rs reads an empty commit file (a crash can leave one),
    or one without Delta actions, as a commit that changed nothing."""
    with reading(uri):
        table = deltalake.DeltaTable(uri, version=version)
        if version is None and (damaged := _damaged_commit(uri, table.version())):
            raise damaged
    return table


@contextmanager
def reading(uri: str) -> Iterator[None]:
    """deltalake's and Arrow's errors reading the table at `uri` (its log, its data files) as an
    UnreadableTableError. deltalake's error stays its context, not its cause: tracebacks show it,
    while a run's summary reports the deepest cause, which must be this line, not a Rust backtrace."""
    try:
        yield
    except TableNotFoundError:
        raise
    except (DeltaError, OSError, pa.ArrowInvalid) as error:
        raise _unreadable(uri, error)  # noqa: B904 - the context, on purpose (above)


# What an S3-compatible store's refusal (its error's <Code>, deep in deltalake's message) asks of a person.
STORE_REFUSALS = {
    "NoSuchBucket": "create the bucket, or correct the warehouse's URI (INCREMENTAL_ASSETS_WAREHOUSE)",
    "AccessDenied": "grant this process's credentials access to it (the bucket's policy), or use credentials that have it",
    "InvalidAccessKeyId": "the store does not know AWS_ACCESS_KEY_ID: correct the credentials",
    "SignatureDoesNotMatch": "AWS_SECRET_ACCESS_KEY does not belong to AWS_ACCESS_KEY_ID: correct the credentials",
    "ExpiredToken": "the session token has expired: renew AWS_SESSION_TOKEN",
}


def store_refusal(text: str) -> str | None:
    """The object store's own refusal in a deltalake error (an S3 error document: NoSuchBucket,
    AccessDenied, ...) and what to do, in one line; None when the text holds none."""
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if code is None:
        return None
    message = re.search(r"<Message>([^<]+)</Message>", text)
    said = f" ({message.group(1)})" if message else ""
    advice = STORE_REFUSALS.get(code.group(1), "check the warehouse's URI and the credentials this process uses")
    return f"the object store refused with {code.group(1)}{said}: {advice}"


def _unreadable(uri: str, error: Exception) -> UnreadableTableError:
    """What `error` says is wrong with the table: the object store refusing (no such bucket,
    credentials refused), its last commit, else a data file the error names, else deltalake's
    reason (an earlier commit or a checkpoint)."""
    text = str(error).strip()
    refused = store_refusal(text)
    if refused is not None:  # nothing about the table itself: no backup to restore
        return UnreadableTableError(f"The Delta table at {uri} cannot be read: {refused}")
    reason = text.splitlines()[0] if text else type(error).__name__
    try:
        damaged = _damaged_commit(uri, _last_version(uri)) or _damaged_file(uri, text, reason)
    except (DeltaError, OSError, pa.ArrowInvalid):  # the log cannot be listed or opened: reason enough
        damaged = None
    return damaged or UnreadableTableError(
        f"The Delta table at {uri} cannot be read: {reason}. Check that this process may read it; if its log is "
        "damaged before the last commit, restore the table from a backup"
    )


def _last_version(uri: str) -> int | None:
    filesystem, root = pafs.FileSystem.from_uri(_arrow_uri(uri))
    names = [info.base_name for info in filesystem.get_file_info(pafs.FileSelector(f"{root}/_delta_log"))]
    return max((int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()), default=None)


def _damaged_commit(uri: str, version: int | None) -> UnreadableTableError | None:
    """The error naming commit `version`, the last, when its file is no commit: cut off or garbled
    (not JSON lines), empty, or without a Delta action; None when it is one."""
    if version is None:
        return None
    try:
        commits = _commit_actions(uri, range(version, version + 1))
        if commits is None or any(isinstance(action, dict) and action.keys() & DELTA_ACTIONS for action in commits[0]):
            return None  # a commit (or moved aside meanwhile)
        problem = "no Delta action in it"
    except ValueError as error:  # cut off or garbled: not JSON lines, or not text
        problem = f"not JSON: {error}"
    name = f"{version:020d}.json"
    if version:
        way_back = f"Move it out of _delta_log (e.g. to {uri}/{name}.damaged) to return the table to version {version - 1}"
    else:
        way_back = f"It is the table's first commit: move the table aside (e.g. to {uri}.damaged) to return to before its first write"
    return UnreadableTableError(
        f"The Delta table at {uri} cannot be read: its last commit {uri}/_delta_log/{name} is damaged ({problem}). "
        f"{way_back}; the run that wrote the commit is then redone by the next run, as every run is idempotent "
        "(what a load wrote: by loading it again)"
    )


def _damaged_file(uri: str, error: str, reason: str) -> UnreadableTableError | None:
    """The error naming the table's data file that `error` names (missing, or not Parquet)."""
    paths = [unquote(path) for path in data_files(deltalake.DeltaTable(uri)).column("path").to_pylist()]
    named = next((path for path in paths if path in error), None)
    if named is None:
        return None
    return UnreadableTableError(
        f"The Delta table at {uri} cannot be read: its data file {uri}/{named} is missing or damaged ({reason}). "
        "Put back a good copy (from a backup); or, losing its rows, move it aside and drop it from the table: "
        f"python -c \"import deltalake; deltalake.DeltaTable('{uri}').repair()\""
    )


def stored_schema(table: deltalake.DeltaTable) -> T.StructType:
    """A stored table's schema as Spark's types, from its log (Delta's schema is Spark's JSON)."""
    return T.StructType.fromJson(json.loads(table.schema().to_json()))


def table_exists(uri: str) -> bool:
    return stored_table(uri) is not None


def files_left_by(uri: str, user_metadata: str, since: datetime) -> list[str] | None:
    """The files that the commits named `user_metadata` (made at or after `since`) removed, or
    wrote as change data, and that are still on storage: what time travel can read until VACUUM
    deletes them. None when a commit file after `since` is gone (Delta's log cleanup)."""
    commits = _commits_named(uri, user_metadata, since)
    if commits is None:
        return None
    paths = [action[kind]["path"] for actions in commits for action in actions for kind in ("remove", "cdc") if kind in action]
    filesystem, root = filesystem_of(uri)
    found = filesystem.get_file_info([f"{root}/{unquote(path)}" for path in paths])
    return [path for path, info in zip(paths, found) if info.type != pafs.FileType.NotFound]


def rows_deleted_by(uri: str, user_metadata: str, since: datetime) -> int | None:
    """The rows that the commits named `user_metadata` (made at or after `since`) deleted, from
    their own metrics: true whoever committed them, a run killed after its commit too."""
    commits = _commits_named(uri, user_metadata, since)
    if commits is None:
        return None
    infos = [action["commitInfo"] for actions in commits for action in actions if "commitInfo" in action]
    return sum(int(info.get("operationMetrics", {}).get("numTargetRowsDeleted", 0)) for info in infos)


def _commits_named(uri: str, user_metadata: str, since: datetime) -> list[list[dict]] | None:
    """The actions of the commits whose userMetadata is `user_metadata`, read back from the newest
    to the first made before `since` (COMMIT_READS at a time); None when a commit file on the way is gone."""
    table = stored_table(uri)
    if table is None:
        return []
    named, top = [], table.version()
    while top >= 0:
        versions = range(max(0, top - COMMIT_READS + 1), top + 1)
        for commit in reversed(_commit_files(uri, versions)):
            if commit is None:
                return None
            info = next((action["commitInfo"] for action in commit if "commitInfo" in action), {})
            if _moment(info.get("timestamp", 0)) < since.replace(tzinfo=None):  # both UTC
                return named
            if info.get("userMetadata") == user_metadata:
                named.append(commit)
        top = versions.start - 1
    return named


def data_files(table: deltalake.DeltaTable) -> pa.Table:
    """The table's data files, one row each with its partition values (`partition.<column>`), size,
    modification time and statistics (`min.<column>`, `max.<column>`): read from the log, no Spark job."""
    return pa.table(table.get_add_actions(flatten=True))


def partitions_added(uri: str, version: int, column: str) -> list:
    """The values of partition `column` that commit `version` added files to: the files of that
    version that the one before did not have, from the log (no Spark job; one table, moved on)."""
    table = _open(uri, version=max(version - 1, 0))
    before = set(data_files(table).column("path").to_pylist()) if version else set()
    with reading(uri):
        table.load_as_version(version)
    added = data_files(table)
    values = zip(added.column("path").to_pylist(), added.column(f"partition.{column}").to_pylist())
    return sorted({value for path, value in values if path not in before})


def first_data_change(uri: str, first: int, last: int) -> int | None:
    """The first of commits `first`..`last` that changed data (a compaction or a property change
    does not), None when none did; `first` itself when a commit file in between is gone."""
    commits = _commit_actions(uri, range(first, last + 1))
    if commits is None:
        return first
    return next((version for version, actions in zip(range(first, last + 1), commits) if _commit(actions).data_change), None)


def commit_gone(uri: str, version: int) -> bool:
    """Whether commit `version`'s file has left the log (Delta's log cleanup removes the oldest
    commits once delta.logRetentionDuration has passed and a checkpoint stands after them)."""
    return _commit_files(uri, range(version, version + 1))[0] is None


def rows_added(uri: str, first: int, last: int) -> int | None:
    """The rows of the data files that commits `first`..`last` added as data changes: a bound on
    the rows they inserted. None when a commit file is gone or a file's statistics do not count it."""
    commits = _commit_actions(uri, range(first, last + 1))
    if commits is None:
        return None
    counts = [added.rows for commit in map(_commit, commits) if commit.data_change for added in commit.added]
    return None if None in counts else sum(counts)


def partitions_changed(uri: str, since: int, column: str) -> set | None:
    """The values of partition `column` (as the log writes them: text) of the files that commits
    after version `since` added or removed, data changes only (a compaction moves rows: none);
    None when a commit file in between is gone or a file's action does not say."""
    table = _open(uri)
    commits = _commit_actions(uri, range(since + 1, table.version() + 1))
    if commits is None:
        return None
    values = set()
    for action in (a[kind] for actions in commits for a in actions for kind in ("add", "remove") if kind in a):
        if column not in (action.get("partitionValues") or {}):
            return None
        if action.get("dataChange", True):
            values.add(action["partitionValues"][column])
    return values


def rows_with(uri: str, column: str, value: Any) -> list[dict[str, Any]]:
    """The rows whose `column` equals `value`, reading only the data files whose statistics may hold
    it (a lookup by key in a table clustered by it); compared after the read, as a MERGE by
    deltalake leaves string_view columns that Arrow's filters cannot compare or take."""
    table = _open(uri)
    files = data_files(table)
    low, high = (files.column(f"{bound}.{column}").to_pylist() if f"{bound}.{column}" in files.column_names
                 else [None] * files.num_rows for bound in ("min", "max"))
    paths = [path for path, lo, hi in zip(files.column("path").to_pylist(), low, high)
             if (lo is None or lo <= value) and (hi is None or value <= hi)]
    if not paths:
        return []
    return [row for row in read_columns(uri, paths, table.schema().to_arrow().names).to_pylist() if row[column] == value]


def rows_as_of(uri: str, version: int, columns: list[str], filters: list) -> pa.Table | None:
    """Columns of the table as it was at `version` (filtered on partition columns), or None when
    that version cannot be read any more: its log cleaned up or its files vacuumed."""
    try:
        return scan(deltalake.DeltaTable(uri, version=version), columns, filters)
    except (DeltaError, OSError, pa.ArrowInvalid):
        return None


def stored_max(uri: str, column: str) -> Any:
    """The greatest value of `column` in the table (None: no table, or no non-null value). From the
    files' statistics where every file has them; otherwise the column alone is read (no JVM)."""
    table = stored_table(uri)
    if table is None:
        return None
    files = data_files(table)
    statistic = f"max.{column}"
    if statistic in files.column_names and files.num_rows and files.column(statistic).null_count == 0:
        return pc.max(files.column(statistic)).as_py()
    with reading(uri):
        return pc.max(table.to_pyarrow_table(columns=[column]).column(column)).as_py()


def counted_rows(files: pa.Table) -> int | None:
    """The rows of `files` (data_files' rows) by their record counts; None when the log cannot say
    (a file without statistics, or with rows deleted by a deletion vector)."""
    records = files.column("num_records")
    deletions = [name for name in files.column_names if name.startswith("deletionVector")]
    if records.null_count or any(files.column(name).null_count < files.num_rows for name in deletions):
        return None
    return pc.sum(records).as_py() or 0


def _partition_counts(table: deltalake.DeltaTable | None, column: str, window: Window) -> dict | None:
    """Rows per partition value of `column` inside `window`, summed over the files' record counts;
    None when the log cannot say (not partitioned by it, a file without statistics or with deleted rows)."""
    if table is None or column not in table.metadata().partition_columns:
        return None
    files = data_files(table)
    if counted_rows(files) is None:
        return None
    counts: dict = {}
    for value, rows in zip(files.column(f"partition.{column}").to_pylist(), files.column("num_records").to_pylist()):
        if value is not None and window.contains(value):
            counts[value] = counts.get(value, 0) + rows
    return counts


NOTE_PROPERTY = "incremental_assets.note"  # a step's note for its run's next steps (write.note)


def noted(uri: str, run_id: str, table: deltalake.DeltaTable | None = None) -> Mapping[str, Any] | None:
    """The note the step of run `run_id` stored with the table (write.note), from `table` when the
    caller has just opened it; None when it stored none, or when a later run's note has replaced it."""
    if table is None:
        table = stored_table(uri)
    raw = table.metadata().configuration.get(NOTE_PROPERTY) if table is not None else None
    if raw is None:
        return None
    stored = json.loads(raw)
    return stored["value"] if stored.get("run_id") == run_id else None


@dataclass(frozen=True)
class Commit:
    """What one commit did to a table's data files: those it added, the paths of those it removed,
    whether it changed data (false: a compaction, rearranging rows), and its operation metrics
    (named as its writer names them)."""

    added: tuple[AddedFile, ...]
    removed: tuple[str, ...] = ()
    data_change: bool = True
    metrics: Mapping[str, Any] = field(default_factory=dict)


def commits_since(uri: str, since: Snapshot | None) -> tuple[Snapshot, list[Commit]]:
    """The table's snapshot now, and its commits after `since`, oldest first. Without `since`, or
    when the commit files needed are gone, one commit adding the files written after it instead:
    what the commits in between rewrote can no longer be told from what they added."""
    table = _open(uri)
    now = snapshot(table)
    if since is not None:
        commits = _commit_actions(uri, range(since.version + 1, now.version + 1))
        if commits is not None:
            return now, [_commit(actions) for actions in commits]
    return now, [Commit(tuple(_files_written_after(table, since)))]


def _commit(actions: list[dict]) -> Commit:
    files = [action[kind] for action in actions for kind in ("add", "remove") if kind in action]
    info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
    return Commit(
        tuple(_added(action) for action in actions if "add" in action),
        tuple(action["remove"]["path"] for action in actions if "remove" in action),
        any(f.get("dataChange", True) for f in files), info.get("operationMetrics") or {},
    )


def read_columns(uri: str, paths: list[str], columns: list[str]) -> pa.Table:
    """Columns of the table's data files at `paths` (as the log names them), with Arrow: no JVM."""
    with reading(uri):
        return _data_files_at(uri, paths).to_table(columns=columns)


def read_removed(uri: str, paths: list[str], columns: list[str]) -> pa.Table | None:
    """Columns of data files that commits removed, or None when one is gone: they stay on storage
    until VACUUM deletes them."""
    try:
        removed = _data_files_at(uri, paths)
    except FileNotFoundError:
        return None
    with reading(uri):
        return removed.to_table(columns=columns)


def _data_files_at(uri: str, paths: list[str]) -> ds.Dataset:
    filesystem, root = pafs.FileSystem.from_uri(_arrow_uri(uri))
    return ds.dataset([f"{root}/{unquote(path)}" for path in paths], filesystem=filesystem, format="parquet")
