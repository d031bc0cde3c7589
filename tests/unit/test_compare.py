"""Rows two versions of a table hold differently (lib/delta/compare.py), on the column types
daily_aggregates holds, worked out by hand. tests/pipeline/test_attributes_history.py holds it
against Python's comparison of every row on a daily table Spark wrote and rewrote."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa

from incremental_assets.lib.delta.compare import differing_keys, equal_rows

KEYS = ["attribute_key", "event_date"]
D1, D2 = date(2026, 11, 1), date(2026, 11, 2)
T1, T2 = datetime(2026, 11, 1, 9, tzinfo=timezone.utc), datetime(2026, 11, 1, 10, tzinfo=timezone.utc)
LAST = pa.struct([("tstamp", pa.timestamp("us", tz="UTC")), ("value", pa.string())])
SCHEMA = pa.schema([
    ("attribute_key", pa.string()), ("event_date", pa.date32()), ("events", pa.int64()),
    ("seen", pa.timestamp("us", tz="UTC")), ("apps", pa.list_(pa.string())), ("last_url", LAST),
])


def table(*rows: tuple) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, row)) for row in rows], SCHEMA)


def test_equal_rows_nulls_equal_only_nulls_at_every_depth():
    pairs = [  # (a, b, equal)
        (1, 1, True), (1, 2, False), (None, None, True), (None, 0, False),
    ]
    a, b = pa.array([p[0] for p in pairs], pa.int64()), pa.array([p[1] for p in pairs], pa.int64())
    assert equal_rows(a, b).to_pylist() == [p[2] for p in pairs]
    lists = [(["a", "b"], ["a", "b"], True), (["a", "b"], ["b", "a"], False), ([], None, False),
             ([None], [None], True), ([None], ["a"], False), (["a"], ["a", "a"], False), (None, None, True),
             (["a", "b"], ["a", "c"], False), (["c"], ["c"], True)]
    a, b = pa.array([p[0] for p in lists], pa.list_(pa.string())), pa.array([p[1] for p in lists], pa.list_(pa.string()))
    assert equal_rows(a, b).to_pylist() == [p[2] for p in lists]
    structs = [({"tstamp": T1, "value": "x"}, {"tstamp": T1, "value": "x"}, True),
               ({"tstamp": T1, "value": "x"}, {"tstamp": T2, "value": "x"}, False),
               ({"tstamp": T1, "value": None}, {"tstamp": T1, "value": "x"}, False),
               ({"tstamp": T1, "value": None}, {"tstamp": T1, "value": None}, True),
               (None, {"tstamp": None, "value": None}, False), (None, None, True)]
    a, b = pa.array([p[0] for p in structs], LAST), pa.array([p[1] for p in structs], LAST)
    assert equal_rows(a, b).to_pylist() == [p[2] for p in structs]
    maps = [([("k", 1)], [("k", 1)], True), ([("k", 1)], [("k", 2)], False), (None, [], False), (None, None, True)]
    kind = pa.map_(pa.string(), pa.int64())
    a, b = pa.array([p[0] for p in maps], kind), pa.array([p[1] for p in maps], kind)
    assert equal_rows(a, b).to_pylist() == [p[2] for p in maps]


def test_differing_keys_added_removed_and_changed_rows():
    was = table(
        ("u1", D1, 3, T1, ["web"], {"tstamp": T1, "value": "/a"}),   # the same after
        ("u1", D2, 1, T1, ["web"], None),                            # removed
        ("u2", D1, 2, T1, ["web", "ios"], None),                     # a list changed
        ("u3", D1, 5, None, None, {"tstamp": T1, "value": "/b"}),   # the same, nulls included
        ("u4", D1, 5, T1, [], {"tstamp": T1, "value": "/c"}),       # a struct's field changed
    )
    now = table(
        ("u4", D1, 5, T1, [], {"tstamp": T2, "value": "/c"}),
        ("u3", D1, 5, None, None, {"tstamp": T1, "value": "/b"}),
        ("u2", D1, 2, T1, ["ios", "web"], None),
        ("u5", D2, 1, T2, ["web"], None),                            # added
        ("u1", D1, 3, T1, ["web"], {"tstamp": T1, "value": "/a"}),
    )
    assert differing_keys(was, now, KEYS) == [("u1", D2), ("u2", D1), ("u4", D1), ("u5", D2)]
    assert differing_keys(now, now, KEYS) == []
    assert differing_keys(table(), now, KEYS) == sorted(zip(now["attribute_key"].to_pylist(), now["event_date"].to_pylist()))
    assert differing_keys(table(), table(), KEYS) == []


def test_a_column_added_or_retyped_changes_every_row():
    was = table(("u1", D1, 3, T1, ["web"], None), ("u2", D1, 1, T1, [], None))
    now = table(("u1", D1, 3, T1, ["web"], None), ("u3", D2, 1, T1, [], None))
    added = now.append_column("carts", pa.array([0, 0], pa.int64()))
    assert differing_keys(was, added, KEYS) == [("u1", D1), ("u2", D1), ("u3", D2)]
    retyped = now.set_column(2, "events", pa.array([3.0, 1.0]))
    assert differing_keys(was, retyped, KEYS) == [("u1", D1), ("u2", D1), ("u3", D2)]


def test_a_null_key_matches_itself_and_sorts_first():
    """A real export's events without a user id share one null attribute_key (the public Snowplow
    export does): it is compared like any key, and the keys still sort."""
    was = table((None, D1, 2, T1, ["web"], None), (None, D2, 1, T1, ["web"], None), ("u1", D1, 1, T1, [], None))
    now = table((None, D1, 2, T1, ["web"], None), (None, D2, 3, T1, ["web"], None), ("u1", D1, 2, T1, [], None))
    assert differing_keys(was, now, KEYS) == [(None, D2), ("u1", D1)]
    assert differing_keys(was, now.append_column("carts", pa.array([0, 0, 0], pa.int64())), KEYS) == [
        (None, D1), (None, D2), ("u1", D1)]
