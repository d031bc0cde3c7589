"""Loading a user's export of atomic events into the source Delta table."""

from __future__ import annotations

import csv
import json
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from incremental_assets.lib.environment import table_uri
from incremental_assets.lib.sample.generator import SampleParams, generate_events
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.source.contract import LOAD_DATE, REQUIRED_COLUMNS
from incremental_assets.lib.source.loader import SourceSchemaError, export_format, load_file

HEADER = [*REQUIRED_COLUMNS, "page_url", "domain_sessionidx", "campaign"]
ROWS = [
    # naive timestamps are UTC
    ["e1", "website", "page_view", "2024-03-01 10:15:30", "2024-03-01 10:15:29", "2024-03-01 10:15:29.5",
     "2024-03-01 10:15:30", "2024-03-01 10:16:00", "s1", "u1", "https://www.example.com/", "1", "spring"],
    # an offset is converted to UTC (02:30+03:00 is 23:30 UTC the day before); empty text is null
    ["e2", "", "link_click", "2024-03-02T02:20:00+03:00", "", "",
     "2024-03-02T02:20:00+03:00", "2024-03-02T02:30:00+03:00", "s1", "u1", "", "1", ""],
]


@pytest.fixture
def source(warehouse) -> str:
    return table_uri("atomic_events")


@pytest.fixture
def csv_file(tmp_path) -> Path:
    path = tmp_path / "events.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([HEADER, *ROWS])
    return path


def read(spark, uri):
    return spark.read.format("delta").load(uri)


def epoch_micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def test_csv_casts_to_the_contract_and_reads_naive_timestamps_as_utc(spark, source, csv_file):
    assert load_file(spark, csv_file, source) == 2

    table = read(spark, source)
    types = dict(table.dtypes)
    assert types["load_tstamp"] == "timestamp" and types["domain_sessionidx"] == "int" and types["campaign"] == "string"
    assert DeltaTable.forPath(spark, source).detail().first()["partitionColumns"] == [LOAD_DATE]
    first, second = (
        table.withColumn("load_micros", F.unix_micros("load_tstamp"))
        .select("event_id", "app_id", "dvce_sent_tstamp", LOAD_DATE, "load_micros")
        .orderBy("event_id")
        .collect()
    )
    assert first["load_micros"] == epoch_micros(datetime(2024, 3, 1, 10, 16))
    assert first[LOAD_DATE] == date(2024, 3, 1)
    assert second["load_micros"] == epoch_micros(datetime(2024, 3, 1, 23, 30))
    assert second[LOAD_DATE] == date(2024, 3, 1)
    assert second["app_id"] is None and second["dvce_sent_tstamp"] is None


def test_parquet_export_of_the_sample_loads_every_row(spark, source, tmp_path):
    params = SampleParams(users=5, events_per_day=200, start_date=date(2024, 1, 1))
    rows = generate_events(params, params.start, params.start + timedelta(hours=12))
    export = str(tmp_path / "export.parquet")
    events_frame(spark, rows).drop(LOAD_DATE).write.parquet(export)

    assert load_file(spark, export, source) == len(rows)
    assert read(spark, source).where(F.col("event_id").isNull()).count() == sum(1 for row in rows if row[0] is None)


def test_json_lines_with_upper_case_names(spark, source, tmp_path):
    path = tmp_path / "events.jsonl"
    names = ["EVENT_ID" if name == "event_id" else name for name in HEADER]
    records = [dict(zip(names, row)) for row in ROWS]
    records[1]["EVENT_ID"] = None
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n")

    assert load_file(spark, path, source) == 2
    assert sorted(row["event_id"] or "" for row in read(spark, source).collect()) == ["", "e1"]


def test_missing_columns_are_named_and_nothing_is_written(spark, source, csv_file, tmp_path):
    incomplete = tmp_path / "incomplete.csv"
    keep = [i for i, name in enumerate(HEADER) if name not in ("load_tstamp", "domain_userid")]
    with incomplete.open("w", newline="") as handle:
        csv.writer(handle).writerows([[row[i] for i in keep] for row in [HEADER, *ROWS]])

    with pytest.raises(SourceSchemaError, match=r"incomplete\.csv.*load_tstamp, domain_userid"):
        load_file(spark, incomplete, source)
    assert not Path(source).exists()

    load_file(spark, csv_file, source)
    version = DeltaTable.forPath(spark, source).history(1).first()["version"]
    with pytest.raises(SourceSchemaError):
        load_file(spark, incomplete, source)
    assert DeltaTable.forPath(spark, source).history(1).first()["version"] == version


def test_append_twice_doubles_and_replace_replaces(spark, source, csv_file):
    load_file(spark, csv_file, source)
    load_file(spark, csv_file, source, mode="append")
    assert read(spark, source).count() == 4

    assert load_file(spark, csv_file, source, mode="replace") == 2
    assert read(spark, source).count() == 2


def test_unknown_format_and_mode_are_refused(spark, source, csv_file, tmp_path):
    with pytest.raises(ValueError, match=r"\.xlsx"):
        load_file(spark, tmp_path / "events.xlsx", source)
    with pytest.raises(ValueError, match="mode"):
        load_file(spark, csv_file, source, mode="merge")
    assert not Path(source).exists()


def test_values_that_are_not_of_their_type_are_named_and_nothing_is_written(spark, source, tmp_path):
    """An unparseable timestamp (and a count that is no number) fail the load with the column and
    the value, before anything is written; blank text stays a null."""
    bad = tmp_path / "bad.csv"
    rows = [list(ROWS[0]), list(ROWS[1])]
    rows[1][HEADER.index("collector_tstamp")] = "yesterday at noon"
    rows[0][HEADER.index("domain_sessionidx")] = "first"
    with bad.open("w", newline="") as handle:
        csv.writer(handle).writerows([HEADER, *rows])
    message = r"nothing was loaded from .*bad\.csv: collector_tstamp: 1 value\(s\) are neither a timestamp nor an epoch number \(e\.g\. 'yesterday at noon'\); values not of their column's type: domain_sessionidx holds 'first'"
    with pytest.raises(SourceSchemaError, match=message):
        load_file(spark, bad, source)
    assert not Path(source).exists()


TITLED = [*HEADER, "page_title"]
TITLED_ROWS = [
    [*ROWS[0], "Home"],
    [*ROWS[1], ""],
    # RFC 4180: a quoted field holds line breaks, commas and quotes (doubled)
    ["e3", "website", "page_view", "2024-03-01 11:00:00", "2024-03-01 11:00:00", "2024-03-01 11:00:00",
     "2024-03-01 11:00:00", "2024-03-01 11:01:00", "s2", "u2", "https://www.example.com/shoes", "1", "",
     'Shoes "on sale"\nsecond line, with a comma'],
]
BESIDE_AN_EXPORT = {"_SUCCESS": "", ".part-0.crc": "crc", "part-0.csv.crc": "crc", ".hidden.csv": "not,an,export\n"}


def write_export(path: Path, rows: list[list[str]]) -> Path:
    """Rows of TITLED as a CSV file (the csv module quotes what RFC 4180 asks) or JSON lines."""
    if path.suffix == ".csv":
        with path.open("w", newline="") as handle:
            csv.writer(handle).writerows([TITLED, *rows])
    else:
        path.write_text("".join(json.dumps(dict(zip(TITLED, row))) + "\n" for row in rows))
    return path


def rows_of(spark, uri) -> list:
    return sorted(read(spark, uri).collect(), key=lambda row: row["event_id"])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_folder_of_files_loads_as_one_file_holding_their_rows(spark, source, warehouse, tmp_path, suffix):
    """Format from the files; what tools write beside an export (markers, hidden files, checksums) is no part of it."""
    folder = tmp_path / "export"
    folder.mkdir()
    for i, row in enumerate(TITLED_ROWS):
        write_export(folder / f"part-{i}{suffix}", [row])
    for name, text in BESIDE_AN_EXPORT.items():
        (folder / name).write_text(text)
    one_file = write_export(tmp_path / f"all{suffix}", TITLED_ROWS)

    assert load_file(spark, folder, source) == load_file(spark, one_file, f"{warehouse}/from_one_file") == 3
    assert rows_of(spark, source) == rows_of(spark, f"{warehouse}/from_one_file")
    assert rows_of(spark, source)[2]["page_title"] == 'Shoes "on sale"\nsecond line, with a comma'


def test_a_quoted_field_may_hold_line_breaks_and_doubled_quotes(spark, source, tmp_path):
    export = write_export(tmp_path / "events.csv", TITLED_ROWS)

    assert load_file(spark, export, source) == 3
    assert [row["page_title"] for row in rows_of(spark, source)] == ["Home", None, 'Shoes "on sale"\nsecond line, with a comma']


MALFORMED = {
    "a quote left open": ("events.csv", 'e3,website,page_view,"2024-03-01 11:00:00,2024-03-01 11:00:00\n',
                          r"1 record\(s\) are not CSV: a quote left open, or more or fewer fields than the header; "
                          r"the first in .*bad\.csv: 'e3,website,page_view,\"2024-03-01 11:00:00"),
    "a field too few": ("events.csv", "e3,website,page_view\n", r"1 record\(s\) are not CSV: .*the first in .*bad\.csv: 'e3,website,page_view'"),
    "a JSON line cut short": ("events.jsonl", '{"event_id": "e3", "app_id": \n', r"1 record\(s\) are not JSON objects; the first in .*bad\.jsonl"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_record_is_refused_naming_its_file_and_nothing_is_written(spark, source, tmp_path, case):
    """The times of a record that does not parse are wrong too: the refusal names the cause alone."""
    name, bad_record, says = MALFORMED[case]
    folder = tmp_path / "export"
    folder.mkdir()
    good = write_export(folder / name, TITLED_ROWS[:2])
    bad = write_export(folder / f"bad{good.suffix}", TITLED_ROWS[2:])
    bad.write_text(bad.read_text() + bad_record)

    with pytest.raises(SourceSchemaError, match=f"^nothing was loaded from {folder}: {says}") as refused:
        load_file(spark, folder, source)
    assert "tstamp" not in str(refused.value)
    assert not Path(source).exists()


def test_a_folder_of_one_known_format_is_required(tmp_path):
    """A folder's format is its files' (Parquet also by its magic number: Hive writes no suffix); a
    Delta table is a folder with a log. Each refusal names the folder and what it holds."""
    delta, parquet = tmp_path / "delta", tmp_path / "parquet"
    (delta / "_delta_log").mkdir(parents=True)
    (parquet / "load_date=2024-03-01").mkdir(parents=True)
    table = pa.table({"event_id": ["e1"]})
    pq.write_table(table, parquet / "load_date=2024-03-01" / "part-0.parquet")
    pq.write_table(table, parquet / "000000_0")
    (parquet / "_SUCCESS").write_text("")
    assert (export_format(str(delta)), export_format(str(parquet))) == ("delta", "parquet")

    mixed, empty, headers = tmp_path / "mixed", tmp_path / "empty", tmp_path / "headers"
    for folder in (mixed, empty, headers):
        folder.mkdir()
        for name, text in BESIDE_AN_EXPORT.items():
            (folder / name).write_text(text)
    write_export(mixed / "a.csv", TITLED_ROWS)
    write_export(mixed / "b.jsonl", TITLED_ROWS)
    (mixed / "notes.txt").write_text("exported on Monday")
    write_export(headers / "a.csv", TITLED_ROWS)
    (headers / "b.csv").write_text("event_id,app_id\ne9,website\n")
    with pytest.raises(ValueError, match=f"^Cannot load {mixed}: its files must be all CSV, all JSON lines or all Parquet; "
                                         r"it holds csv: 1 file\(s\), e\.g\. a\.csv; json: 1 file\(s\), e\.g\. b\.jsonl; "
                                         r"no known format: 1 file\(s\), e\.g\. notes\.txt$"):
        export_format(str(mixed))
    with pytest.raises(ValueError, match=f"^Nothing to load in {empty}: it holds no data file"):
        export_format(str(empty))
    with pytest.raises(ValueError, match=f"^Cannot load {headers}: its CSV files must share one header, but a.csv has "
                                         "event_id,.*,page_title and b.csv has event_id,app_id$"):
        export_format(str(headers))
