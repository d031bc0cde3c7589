"""Every encoding of time a user's export can carry loads as the same rows, or is refused whole:
one rule for CSV, Parquet, JSON lines and a Delta table (ISO text with or without an
offset, timestamp types of each unit, epochs of each unit), against the canonical load of the same
events.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.source.loader import LoadOptions, SourceSchemaError, load
from incremental_assets.lib.source.timestamps import EpochUnit

TIMES = ["collector_tstamp", "dvce_created_tstamp", "dvce_sent_tstamp", "derived_tstamp", "load_tstamp"]
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def canonical_events() -> pa.Table:
    """Two days of the sample stream (every anomaly class of the generator), to the whole second so
    that every encoding, epoch seconds included, holds them exactly."""
    params = SampleParams(users=4, days=2, events_per_day=60, start_date=date(2024, 3, 1), seed=11)
    table = generate_table(params, params.start, params.start + timedelta(days=2)).drop(["load_date"])
    for name in TIMES:
        seconds = table.column(name).cast(pa.timestamp("s", "UTC"), safe=False).cast(pa.timestamp("us", "UTC"))
        table = table.set_column(table.schema.get_field_index(name), name, seconds)
    return table


def encoded(values: list[datetime | None], encoding: str) -> list:
    """A time column as an export writes it."""
    kind, _, unit = encoding.partition(" ")
    out = []
    for value in values:
        if value is None:
            out.append(None)
        elif kind == "iso":
            out.append({"naive": value.strftime("%Y-%m-%d %H:%M:%S"), "Z": value.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "+02:00": (value + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S+02:00")}[unit])
        else:  # epoch
            out.append((value - EPOCH) // timedelta(seconds=1) * PER_SECOND[unit])
    return out


def write_export(table: pa.Table, fmt: str, encoding: str, folder: Path) -> Path:
    """The canonical events with their times in `encoding`, as a `fmt` export."""
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    for name in TIMES:
        values = columns[name]
        if encoding.startswith("timestamp"):  # a Parquet timestamp type of this unit (and zone)
            _, unit, *zone = encoding.split(" ")
            columns[name] = pa.array([v and v.replace(tzinfo=None) for v in values], pa.timestamp("us")).cast(
                pa.timestamp(unit, zone[0] if zone else None))
        elif encoding.startswith("mistyped"):  # milliseconds labelled as seconds by the writer
            columns[name] = pa.array(encoded(values, "epoch ms"), pa.timestamp("s"))
        else:
            columns[name] = encoded(values, encoding)
    path = folder / ("export-table" if fmt == "delta" else f"export.{fmt}")
    if fmt == "delta":  # a Delta table as the export (a directory)
        deltalake.write_deltalake(path, pa.table({n: v if isinstance(v, pa.Array) else pa.array(v) for n, v in columns.items()}))
    elif fmt == "jsonl":
        rows = [dict(zip(columns, row)) for row in zip(*columns.values())]
        path.write_text("\n".join(json.dumps(row, default=str) for row in rows) + "\n")
    elif fmt == "csv":
        text = pa.table({name: pa.array([None if v is None else str(v) for v in values], pa.string())
                         for name, values in columns.items()})
        pacsv.write_csv(text, path)
    else:
        pq.write_table(pa.table({n: v if isinstance(v, pa.Array) else pa.array(v) for n, v in columns.items()}), path)
    return path


def stored(spark, uri: str) -> list[tuple]:
    frame = spark.read.format("delta").load(uri)
    return sorted(tuple(row) for row in frame.select(*sorted(frame.columns)).collect())


@pytest.fixture(scope="module")
def canonical(spark, tmp_path_factory):
    """The events, and the source table their canonical export (Parquet, UTC microseconds) loads."""
    folder = tmp_path_factory.mktemp("canonical")
    table = canonical_events()
    pq.write_table(table, folder / "canonical.parquet")
    uri = str(folder / "source")
    load(spark, folder / "canonical.parquet", uri, LoadOptions())
    rows = stored(spark, uri)
    assert len(rows) == table.num_rows and pc.sum(pc.is_null(table.column("event_id"))).as_py() > 0
    return table, rows


ENCODINGS = ["iso naive", "iso Z", "iso +02:00", "epoch s", "epoch ms", "epoch us", "epoch ns"]
CELLS = [(fmt, encoding) for fmt in ("csv", "jsonl", "parquet") for encoding in ENCODINGS] + [
    ("parquet", encoding) for encoding in
    ("timestamp s", "timestamp ms", "timestamp us", "timestamp ns", "timestamp ns UTC", "timestamp ms UTC")
] + [("delta", "timestamp us UTC"), ("delta", "epoch ms"), ("delta", "iso +02:00")]


@pytest.mark.parametrize("fmt, encoding", CELLS, ids=[f"{f}-{e}" for f, e in CELLS])
def test_each_encoding_loads_exactly_the_rows_of_the_canonical_load(spark, canonical, tmp_path, fmt, encoding):
    table, rows = canonical
    export = write_export(table, fmt, encoding, tmp_path)
    uri = str(tmp_path / "source")
    result = load(spark, export, uri, LoadOptions())
    assert stored(spark, uri) == rows
    if encoding.startswith("epoch"):
        assert set(result.units.values()) == {EpochUnit(encoding.split(" ")[1])}, "the unit its magnitude tells"


REFUSED = [
    # (format, encoding, the unit given, what the one line says after the count of collector_tstamp's values)
    ("csv", "epoch ms", EpochUnit.SECONDS, "epoch value(s) outside 1990-01-01 .. {latest} as seconds (e.g. 1709"),
    ("jsonl", "epoch ms", EpochUnit.SECONDS, "epoch value(s) outside 1990-01-01 .. {latest} as seconds"),
    ("parquet", "epoch s", EpochUnit.MILLIS, "epoch value(s) outside 1990-01-01 .. {latest} as milliseconds"),
    ("parquet", "mistyped", None, "timestamp(s) outside 1990-01-01 .. {latest} (e.g. the year 561"),
]
HINTS = {
    "csv": "; they look like epoch milliseconds (--epoch-unit ms)",
    "jsonl": "; they look like epoch milliseconds (--epoch-unit ms)",
    "parquet": "",
}


@pytest.mark.parametrize("fmt, encoding, unit, says", REFUSED, ids=[f"{f}-{e}-as-{u}" for f, e, u, _ in REFUSED])
def test_a_wrong_unit_is_refused_whole_naming_column_count_and_likely_unit(spark, canonical, tmp_path, fmt, encoding, unit, says):
    table, _ = canonical
    export = write_export(table, fmt, encoding, tmp_path)
    uri = tmp_path / "source"
    with pytest.raises(SourceSchemaError) as refused:
        load(spark, export, str(uri), LoadOptions(epoch_unit=unit))
    message = str(refused.value)
    latest = date.today() + timedelta(days=365)  # days_late_allowed 0 here
    count = table.num_rows  # collector_tstamp is never null: each of its values is outside
    assert message.startswith(f"nothing was loaded from {export}: collector_tstamp, dvce_created_tstamp, ")
    assert f": {count} {says.format(latest=latest)}" in message and "\n" not in message
    if encoding == "mistyped":
        assert "they look 1,000 times too large, as if epoch milliseconds were read as seconds" in message
    elif encoding == "epoch ms":
        assert HINTS[fmt] in message
    assert not uri.exists(), "nothing written"
