"""The source events contract: Snowplow's canonical atomic column names (SPEC §2)."""

from __future__ import annotations

from pyspark.sql import types as T

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
