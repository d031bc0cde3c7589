"""Rows handed to deltalake have whole offsets buffers (lib/delta/arrow.py): arrays as Spark's Arrow
sends them, with a 0-byte offsets buffer where a variable-width array holds no value, at every
depth the project's columns nest; and the fault that makes this necessary, still upstream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from incremental_assets.lib.delta.arrow import short_offsets, whole_offsets

UPSTREAM = Path(__file__).resolve().parents[2] / "docs" / "upstream" / "deltalake-empty-offsets.py"


def as_spark_sends(kind: pa.DataType) -> pa.Array:
    """An empty variable-width array with a 0-byte offsets buffer, as Arrow Java writes it."""
    return pa.Array.from_buffers(kind, 0, [None, pa.py_buffer(b""), pa.py_buffer(b"")])


def through_ipc(table: pa.Table) -> pa.Table:
    """As Spark hands batches to Python: read from an Arrow stream (empty buffers become pyarrow's
    shared zero-size area)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return pa.ipc.open_stream(sink.getvalue()).read_all()


def empty_lists(kind: pa.DataType, rows: int = 2) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array([0] * (rows + 1), pa.int32()), as_spark_sends(kind))


CASES = {
    "list of strings": empty_lists(pa.string()),
    "list of binaries": empty_lists(pa.binary()),
    "list of large strings": pa.LargeListArray.from_arrays(pa.array([0, 0, 0], pa.int64()), as_spark_sends(pa.large_string())),
    "struct holding a list": pa.StructArray.from_arrays([empty_lists(pa.string()), pa.array([1, 2])], ["apps", "n"]),
    "list of lists": pa.ListArray.from_arrays(pa.array([0, 1, 1], pa.int32()), empty_lists(pa.string(), rows=1)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_short_offsets_buffer_is_found_at_any_depth_and_made_whole(case, tmp_path):
    rows = through_ipc(pa.table({"day": ["2021-02-01", "2021-02-02"], "value": CASES[case]}))
    rows.validate(full=True)  # pyarrow accepts it: why it reached deltalake unnoticed
    assert short_offsets(rows.column("value").chunks[0])
    whole = whole_offsets(rows)
    assert not any(short_offsets(chunk) for column in whole.columns for chunk in column.chunks)
    assert whole.equals(rows) and whole.schema == rows.schema
    deltalake.write_deltalake(str(tmp_path / "t"), whole, mode="append", partition_by=["day"])  # no panic


def test_whole_columns_are_handed_on_as_they_are():
    """Only a column with a short buffer is copied: the others keep their buffers (no cost)."""
    rows = through_ipc(pa.table({"tags": empty_lists(pa.string(), rows=3), "k": ["a", "", None],
                                 "lists": pa.array([["x"], [], None], pa.list_(pa.string()))}))
    whole = whole_offsets(rows)
    assert whole.column("k").chunks[0].buffers()[1].address == rows.column("k").chunks[0].buffers()[1].address
    assert whole.column("lists").chunks[0].buffers()[1].address == rows.column("lists").chunks[0].buffers()[1].address
    assert whole.column("tags").chunks[0].values.buffers()[1].size == 4  # one offset, 0


def test_sliced_and_chunked_arrays_keep_their_rows():
    """A filter's slice and several batches: whole already, and kept as they are."""
    chunked = pa.chunked_array([pa.array([["a"], []]), pa.array([[], ["b", "c"], None]).slice(1)])
    rows = pa.table({"tags": chunked})
    assert not any(short_offsets(chunk) for chunk in chunked.chunks)
    assert whole_offsets(rows).column("tags").to_pylist() == [["a"], [], ["b", "c"], None]


def test_the_upstream_fault_is_still_there():
    """docs/upstream/deltalake-empty-offsets.py, the reproduction an upstream report carries: while
    the pinned deltalake panics on such rows, the repair stays (exit 0 here: it can go)."""
    result = subprocess.run([sys.executable, str(UPSTREAM)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "out of range for slice of length 0" in result.stdout
