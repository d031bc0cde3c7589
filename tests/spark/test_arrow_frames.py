"""Frames a step makes from Python values go to Spark as Arrow (lib/delta/arrow.py): the same
schema and rows as Spark's own `createDataFrame` of Python rows, without a Python worker."""

from __future__ import annotations

import math
import random
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import types as T

from incremental_assets.defs.base.sessions import LIFECYCLE_SCHEMA, QUARANTINE_SCHEMA
from incremental_assets.lib.delta.arrow import from_rows, no_rows

EVERY_KIND = T.StructType([
    T.StructField("key", T.StringType(), False),
    T.StructField("day", T.DateType()),
    T.StructField("at", T.TimestampType()),
    T.StructField("n", T.LongType()),
    T.StructField("x", T.DoubleType()),
    T.StructField("amount", T.DecimalType(10, 2)),
    T.StructField("on", T.BooleanType()),
    T.StructField("tags", T.ArrayType(T.StringType())),
    T.StructField("last", T.StructType([T.StructField("at", T.TimestampType()), T.StructField("value", T.StringType())])),
])
# Worked by hand: a non-UTC aware time is the same instant as its naive UTC time; nulls in every
# nullable column; an empty list; NaN; a key of characters outside ASCII.
BY_HAND = [
    ("a", date(2024, 3, 1), datetime(2024, 3, 1, 23, 59, 59, 999999), 1, 0.5, Decimal("12.30"), True, ["x", "y"],
     (datetime(2024, 2, 29, 12), "v")),
    ("ü", None, datetime(2024, 3, 2, 1, tzinfo=timezone(timedelta(hours=2))), None, math.nan, None, None, [], None),
    ("", date(1970, 1, 1), None, -2**63, None, Decimal("-0.01"), False, None, (None, None)),
]


def as_compared(rows) -> list[str]:
    """Rows in a stable order, NaN comparable (it equals nothing, itself included)."""
    return sorted(repr(tuple(row)).replace("nan", "NaN") for row in rows)


def generated(seed: int, count: int) -> list[tuple]:
    rng = random.Random(seed)
    maybe = lambda value: None if rng.random() < 0.2 else value  # noqa: E731
    start = datetime(2023, 12, 31, 22)
    return [(
        "".join(rng.choice("ab€ 𝄞") for _ in range(rng.randrange(0, 6))),
        maybe(date(2024, 1, 1) + timedelta(days=rng.randrange(-400, 400))),
        maybe(start + timedelta(microseconds=rng.randrange(10**12))),
        maybe(rng.randrange(-2**63, 2**63)),
        maybe(rng.choice([rng.uniform(-1e9, 1e9), math.inf, -0.0])),
        maybe(Decimal(rng.randrange(-10**9, 10**9)) / 100),
        maybe(rng.random() < 0.5),
        maybe([maybe(rng.choice("pq")) for _ in range(rng.randrange(0, 3))]),
        maybe((maybe(start - timedelta(seconds=rng.randrange(10**8))), maybe(rng.choice(["s", ""])))),
    ) for _ in range(count)]


@pytest.mark.parametrize("rows", [BY_HAND, [], *[generated(seed, 200) for seed in (1, 2, 3)]], ids=["by-hand", "none", "seed-1", "seed-2", "seed-3"])
def test_rows_made_from_arrow_are_sparks_rows_of_the_same_python_values(spark, rows):
    expected = spark.createDataFrame(rows, EVERY_KIND)
    made = from_rows(spark, rows, EVERY_KIND)
    assert made.schema == expected.schema == EVERY_KIND
    assert as_compared(made.collect()) == as_compared(expected.collect())


def test_by_hand_the_aware_time_is_its_instant_and_naive_ones_are_utc(spark):
    made = {row.key: row for row in from_rows(spark, BY_HAND, EVERY_KIND).collect()}
    assert made["ü"].at == datetime(2024, 3, 1, 23) and made["a"].at == datetime(2024, 3, 1, 23, 59, 59, 999999)
    assert made["a"].last.at == datetime(2024, 2, 29, 12) and made[""].n == -2**63 and made["ü"].tags == []


@pytest.mark.parametrize("schema", [LIFECYCLE_SCHEMA, QUARANTINE_SCHEMA, EVERY_KIND], ids=["lifecycle", "quarantine", "every-kind"])
def test_no_rows_has_the_schema_spark_gives_no_python_rows(spark, schema):
    made = no_rows(spark, schema)
    assert made.schema == spark.createDataFrame([], schema).schema == schema
    assert made.collect() == [] and made.groupBy(schema.names[0]).count().collect() == []


def test_frames_from_arrow_start_no_python_worker_and_python_rows_do(spark, python_workers_refused):
    """The fixture's interpreter records a start: these frames' jobs never ask for one; a frame of
    Python rows does, and its job fails on the refusing interpreter (so the fixture can fail)."""
    assert from_rows(spark, BY_HAND, EVERY_KIND).groupBy("on").count().count() == 3
    assert no_rows(spark, LIFECYCLE_SCHEMA).join(from_rows(spark, [("s",)], LIFECYCLE_SCHEMA[:1]), "session_identifier").count() == 0
    assert not python_workers_refused.exists()
    with pytest.raises(Py4JJavaError):
        spark.createDataFrame([("s",)], "k string").count()
    assert python_workers_refused.exists()
    python_workers_refused.unlink()  # found as it should be; the fixture checks the rest of the test
