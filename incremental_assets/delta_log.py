"""What arrived in a Delta table since a version, read from its log without a JVM.

The commit files after that version list the data files each commit added (`add` actions with
`dataChange` true: a compaction's rewrites are not new rows), with their statistics. Delta keeps
commit files for `delta.logRetentionDuration` (30 days by default); when the ones needed are gone,
the files of the current snapshot modified after the version's commit are taken instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

import deltalake
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from incremental_assets.delta_tables import data_files

EPOCH = datetime(1970, 1, 1)


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


def added_since(uri: str, since: Snapshot | None) -> tuple[Snapshot, list[AddedFile]]:
    """The table's snapshot now, and the data files added after `since` (every file: None)."""
    table = deltalake.DeltaTable(uri)
    now = snapshot(table)
    if since is None:
        return now, _current_files(table)
    if since.version >= now.version:
        return now, []
    commits = _commit_actions(uri, range(since.version + 1, now.version + 1))
    if commits is None:  # cleaned up: what the snapshot holds that was written after `since`
        cutoff = (since.committed_at - EPOCH) // timedelta(milliseconds=1)
        return now, [f for f, written in _current_files(table, with_times=True) if written > cutoff]
    live = set(data_files(table).column("path").to_pylist())
    added = [_added(action) for actions in commits for action in actions if "add" in action and action["add"].get("dataChange")]
    return now, [f for f in added if unquote(f.path) in live]  # not removed again since


def read_column(uri: str, files: list[AddedFile], column: str) -> pa.Array:
    """One column of the given data files (Arrow, no JVM)."""
    filesystem, root = pafs.FileSystem.from_uri(_arrow_uri(uri))
    paths = [f"{root}/{unquote(f.path)}" for f in files]
    return ds.dataset(paths, filesystem=filesystem, format="parquet").to_table(columns=[column]).column(column).combine_chunks()


def _commit_actions(uri: str, versions: range) -> list[list[dict]] | None:
    """The actions of each commit in `versions`, or None when a commit file is gone."""
    filesystem, root = pafs.FileSystem.from_uri(_arrow_uri(uri))
    commits = []
    for version in versions:
        try:
            with filesystem.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as stream:
                text = stream.read().decode()
        except FileNotFoundError:
            return None
        commits.append([json.loads(line) for line in text.splitlines() if line.strip()])
    return commits


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


def _moment(millis: int) -> datetime:
    return EPOCH + timedelta(milliseconds=millis)
