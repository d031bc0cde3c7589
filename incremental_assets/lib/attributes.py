"""Declared attributes: what each user-level metric is, validated when definitions load.

    {"name": "page_views_7d", "aggregation": "count", "event_names": ["page_view"], "period": "last 7 days"}
    {"name": "last_page", "aggregation": "last", "property": "page_url", "event_names": ["page_view"]}
    {"name": "apps", "aggregation": "unique_list", "property": "app_id",
     "conditions": [{"column": "platform", "op": "=", "value": "web"}]}

daily_aggregates keeps, per key and day, an exact partial of each attribute (a count, a sum, a
min or max, the first and last value with their timestamps, the set of distinct values), so every
attribute, count_distinct and unique_list included, is exact over any period.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

AGGREGATIONS = ("count", "sum", "min", "max", "first", "last", "count_distinct", "unique_list")
OPERATORS = ("=", "!=", ">", ">=", "<", "<=", "in", "not_null")
PERIOD = re.compile(r"^last (\d+) days?$")
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class AttributeDefinitionError(ValueError):
    """An attribute definition that cannot be computed; the message names the attribute and field."""


@dataclass(frozen=True)
class Condition:
    column: str
    op: str
    value: Any = None


@dataclass(frozen=True)
class AttributeSpec:
    name: str
    aggregation: str
    column: str | None = None  # the definition's "property"
    event_names: tuple[str, ...] = ()
    conditions: tuple[Condition, ...] = ()
    period: str = "lifetime"

    @property
    def days(self) -> int | None:
        """None for lifetime, N for 'last N days'."""
        match = PERIOD.match(self.period)
        return int(match.group(1)) if match else None

    @property
    def partial(self) -> str:
        """The column in daily_aggregates that holds this attribute's per-day partial."""
        return f"{self.name}__partial"


def parse_attributes(raw: Iterable[Mapping[str, Any]]) -> list[AttributeSpec]:
    specs = [_parse(item, index) for index, item in enumerate(raw)]
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AttributeDefinitionError(f"attribute names must be unique; repeated: {duplicates}")
    return specs


def _parse(item: Mapping[str, Any], index: int) -> AttributeSpec:
    name = item.get("name")
    where = f"attribute {name!r}" if name else f"attribute #{index + 1}"
    unknown = sorted(set(item) - {"name", "aggregation", "property", "event_names", "conditions", "period"})
    if unknown:
        raise AttributeDefinitionError(f"{where}: unknown field(s) {unknown}")
    if not isinstance(name, str) or not NAME.match(name):
        raise AttributeDefinitionError(f"{where}: name must be lower_snake_case (letters, digits, _)")
    aggregation = item.get("aggregation")
    if aggregation not in AGGREGATIONS:
        raise AttributeDefinitionError(f"{where}: aggregation must be one of {', '.join(AGGREGATIONS)} (got {aggregation!r})")
    prop = item.get("property")
    if aggregation != "count" and not prop:
        raise AttributeDefinitionError(f"{where}: aggregation {aggregation} needs a property column")
    period = item.get("period", "lifetime")
    if period != "lifetime" and not (isinstance(period, str) and PERIOD.match(period) and int(PERIOD.match(period).group(1)) >= 1):
        raise AttributeDefinitionError(f"{where}: period must be 'lifetime' or 'last N days' with N >= 1 (got {period!r})")
    conditions = tuple(_condition(c, where) for c in item.get("conditions") or ())
    return AttributeSpec(name, aggregation, prop, tuple(item.get("event_names") or ()), conditions, period)


def _condition(raw: Mapping[str, Any], where: str) -> Condition:
    if not raw.get("column") or raw.get("op") not in OPERATORS:
        raise AttributeDefinitionError(f"{where}: a condition needs a column and an op among {', '.join(OPERATORS)} (got {dict(raw)})")
    if raw["op"] == "in" and not isinstance(raw.get("value"), list):
        raise AttributeDefinitionError(f"{where}: condition 'in' on {raw['column']} needs a list value")
    return Condition(raw["column"], raw["op"], raw.get("value"))


SAMPLE_ATTRIBUTES: list[dict[str, Any]] = [
    {"name": "page_views", "aggregation": "count", "event_names": ["page_view"]},
    {"name": "page_views_7d", "aggregation": "count", "event_names": ["page_view"], "period": "last 7 days"},
    {"name": "sessions_7d", "aggregation": "count_distinct", "property": "session_identifier", "period": "last 7 days"},
    {"name": "first_seen", "aggregation": "min", "property": "derived_tstamp"},
    {"name": "last_seen", "aggregation": "max", "property": "derived_tstamp"},
    {"name": "last_page_url", "aggregation": "last", "property": "page_url", "event_names": ["page_view"]},
    {"name": "distinct_apps", "aggregation": "unique_list", "property": "app_id"},
    {"name": "carts_added", "aggregation": "count", "event_names": ["add_to_cart"]},
]
