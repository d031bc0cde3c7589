"""The read layer's small-table reads (lib/delta/log.read_rows): a version read before is not read
again, and what a caller gets is the table's rows as they are now."""

import shutil

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from incremental_assets.lib.delta.log import read_rows


def test_rows_read_again_follow_a_new_version_a_table_made_afresh_and_ignore_a_callers_change(tmp_path, monkeypatch):
    scans, scan = [], DeltaTable.to_pyarrow_table
    monkeypatch.setattr(DeltaTable, "to_pyarrow_table", lambda self, **kw: scans.append(self.version()) or scan(self, **kw))
    uri = str(tmp_path / "state")
    write_deltalake(uri, pa.table({"k": ["a"], "n": [1]}))
    first = read_rows(uri)
    assert first == [{"k": "a", "n": 1}]
    first[0]["n"] = 99  # the caller's own copy
    assert read_rows(uri) == [{"k": "a", "n": 1}]
    assert scans == [0], "version 0 is scanned once"

    write_deltalake(uri, pa.table({"k": ["b"], "n": [2]}), mode="append")
    assert sorted(row["k"] for row in read_rows(uri)) == ["a", "b"]
    assert read_rows(uri, filters=[("k", "=", "b")]) == [{"k": "b", "n": 2}]
    assert read_rows(uri, columns=["k"], filters=[("k", "=", "a")]) == [{"k": "a"}]

    shutil.rmtree(uri)  # made afresh at the same place: version 0 again, another table
    write_deltalake(uri, pa.table({"k": ["c"], "n": [3]}))
    assert read_rows(uri) == [{"k": "c", "n": 3}]
    shutil.rmtree(uri)
    assert read_rows(uri) is None
