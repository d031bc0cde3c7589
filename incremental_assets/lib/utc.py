"""All times are UTC. The run logic works in naive UTC datetimes; deltalake hands back aware
ones, and PySpark reads naive ones in the process's local zone. These convert at the edges."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

# The Arrow type of a Delta `timestamp` column, for tables written with deltalake.
UTC_TIMESTAMP = pa.timestamp("us", tz="UTC")


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def naive(moment: datetime | None) -> datetime | None:
    """An aware datetime as naive UTC; naive ones and None pass through."""
    return moment.astimezone(timezone.utc).replace(tzinfo=None) if moment and moment.tzinfo else moment


def aware(value: Any) -> Any:
    """A naive (UTC) datetime marked UTC, for PySpark; any other value passes through."""
    return value.replace(tzinfo=timezone.utc) if isinstance(value, datetime) and value.tzinfo is None else value


def aware_row(row: tuple) -> tuple:
    return tuple(aware(value) for value in row)
