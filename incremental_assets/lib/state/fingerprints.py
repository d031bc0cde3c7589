"""What each table was built under, and what a change of settings means for it.

A table's fingerprint holds the settings and definitions its content depends on: for the session
layer the source rules (identifiers, cursor, filters, the session cap), for filtered_events those
and `event_names`, for the daily layer those and the attribute key and every attribute's
definition. Settings that change no stored row (windows, lookbacks, freshness, maintenance, the
reference day) are in none. A difference between a table's stored fingerprint and the current
one is a change, in one of three kinds, as SQLMesh's plans have them:

- additive: attributes added or removed; their columns are computed for every day (or dropped),
  nothing else is touched;
- breaking: a source rule, a filter, the attribute key, or an attribute redefined; the table is
  rebuilt for every day (a redefined attribute: its column);
- forward-only, only when asked: nothing is rebuilt, and the table records the day the change
  took effect from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Iterable, Mapping

ADDITIVE, BREAKING, FORWARD_ONLY = "additive", "breaking", "forward_only"


@dataclass(frozen=True)
class Fingerprint:
    """The settings (and attribute definitions, and an asset's declared code version) a table's
    content depends on, as canonical JSON values."""

    settings: Mapping[str, Any]
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    version: str | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.as_json().encode()).hexdigest()[:12]

    def as_json(self) -> str:
        return json.dumps({"settings": self.settings, "attributes": self.attributes, "version": self.version},
                          sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> "Fingerprint":
        raw = json.loads(text)
        return cls(raw["settings"], raw.get("attributes") or {}, raw.get("version"))


def fingerprint_of(
    values: Mapping[str, Any], rules: Iterable[str], attributes: Mapping[str, Mapping[str, Any]] | None = None,
    version: str | None = None,
) -> Fingerprint:
    """The fingerprint of a table that depends on `rules` (and `attributes`), from the settings'
    `values`. A setting with no effect under the others is left out: the identifier columns when
    an expression is set, allow_null_app_id when app_ids is empty."""
    settings = {name: values[name] for name in rules}
    for ids in ("session_identifiers", "user_identifiers"):
        if ids in settings and settings.get(ids.replace("identifiers", "identifier_sql")):
            settings.pop(ids)
    if "allow_null_app_id" in settings and not settings.get("app_ids"):
        settings.pop("allow_null_app_id")
    return Fingerprint(json.loads(json.dumps(settings, default=str)), dict(attributes or {}), version)


@dataclass(frozen=True)
class Stored:
    """A table's recorded fingerprint, since when, and the day a forward-only change took effect."""

    fingerprint: Fingerprint
    since: Any = None
    effective_from: date | None = None


@dataclass(frozen=True)
class TableChange:
    """What a change of settings does to one table."""

    table: str
    kind: str  # ADDITIVE, BREAKING or FORWARD_ONLY
    settings: tuple[str, ...] = ()  # settings whose change rebuilds the whole table
    added: tuple[str, ...] = ()  # attributes whose columns are computed for every day
    redefined: tuple[str, ...] = ()  # attributes whose columns are recomputed for every day
    removed: tuple[str, ...] = ()  # attributes whose columns are dropped
    version: bool = False  # the asset's declared code version changed: rebuilt
    earlier_release: bool = False  # built by a release that recorded no fingerprint: settings unknown
    whole: bool = False  # attributes changed in a table rebuilt whole on that, whatever the change's kind

    @property
    def rebuild(self) -> bool:
        """The whole table is rebuilt (every day), not some of its columns."""
        return self.whole or (self.kind != FORWARD_ONLY and (bool(self.settings) or self.version or self.earlier_release))

    def describe(self) -> str:
        what = []
        if self.earlier_release:
            what.append("built by an earlier release, which recorded no settings")
        if self.settings:
            what.append(f"settings {', '.join(self.settings)} changed")
        if self.version:
            what.append("its code version changed")
        for verb, names in (("added", self.added), ("redefined", self.redefined), ("removed", self.removed)):
            if names:
                what.append(f"attribute(s) {', '.join(names)} {verb}")
        if self.whole:
            action = "rebuilt for every key from start_date (from daily_aggregates: no source data dropped)"
        elif self.kind == FORWARD_ONLY and self.earlier_release:
            action = "nothing rebuilt: adopted as built under the current settings"
        elif self.kind == FORWARD_ONLY:
            action = "nothing rebuilt: the change applies from now on"
        elif self.rebuild:
            action = "rebuilt for every day"
        else:
            actions = []
            if self.added or self.redefined:
                actions.append(f"column(s) {', '.join((*self.added, *self.redefined))} computed for every day")
            if self.removed:
                actions.append(f"column(s) {', '.join(self.removed)} dropped")
            action = "; ".join(actions)
        return f"{self.table:<28} {self.kind:<13} {'; '.join(what)} -> {action}"


@dataclass(frozen=True)
class Plan:
    """The changes between the tables' stored fingerprints and the current settings; `adopted`:
    new tables (no fingerprint, no rows yet), recorded under the current settings when first written."""

    changes: tuple[TableChange, ...] = ()
    adopted: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.changes

    @property
    def additive_only(self) -> bool:
        return bool(self.changes) and all(change.kind == ADDITIVE for change in self.changes)

    def describe(self) -> list[str]:
        if self.empty:
            return ["Every table was built under the current settings: nothing to apply."]
        upgrade = [] if not any(change.earlier_release for change in self.changes) else [
            "Tables built by an earlier release did not record their settings: applying rebuilds them under the "
            "current ones; if no setting changed at the upgrade, apply --forward-only adopts them as they are."]
        return [
            f"The settings differ from those {len(self.changes)} table(s) were built under:",
            *(f"  {change.describe()}" for change in self.changes),
            *upgrade,
            "Nothing is written until the plan is applied: incremental-assets apply "
            "(or, to rebuild nothing and apply it from now on: incremental-assets apply --forward-only)",
        ]


def plan(
    stored: Mapping[str, Stored | None], current: Mapping[str, Fingerprint], forward_only: bool = False,
    built: Iterable[str] = (), rebuilt_whole: Iterable[str] = (),
) -> Plan:
    """The plan that brings every table of `current` (in its order) to its current fingerprint.
    `built`: tables that hold rows; one of them without a fingerprint was built by an earlier
    release under settings nobody recorded, so it is planned like a breaking change (rebuilt), or
    adopted as it is when forward-only. A table without rows is new: recorded when first written.
    `rebuilt_whole`: tables rebuilt whole on any change of the attributes, whatever its kind (their
    columns are the attributes)."""
    built = set(built)
    changes, adopted = [], []
    for table, now in current.items():
        before = stored.get(table)
        if before is None and table in built:
            changes.append(TableChange(table, FORWARD_ONLY if forward_only else BREAKING, earlier_release=True))
            continue
        if before is None:
            adopted.append(table)
            continue
        change = _change(table, before.fingerprint, now, forward_only)
        if change is not None:
            redefined = change.added or change.removed or change.redefined
            changes.append(replace(change, whole=table in set(rebuilt_whole) and bool(redefined)))
    return Plan(tuple(changes), tuple(adopted))


def _change(table: str, before: Fingerprint, now: Fingerprint, forward_only: bool) -> TableChange | None:
    if before == now:
        return None
    names = sorted(set(before.settings) | set(now.settings))
    settings = tuple(name for name in names if before.settings.get(name) != now.settings.get(name))
    added = tuple(sorted(set(now.attributes) - set(before.attributes)))
    removed = tuple(sorted(set(before.attributes) - set(now.attributes)))
    redefined = tuple(sorted(a for a in set(now.attributes) & set(before.attributes) if now.attributes[a] != before.attributes[a]))
    version = before.version != now.version
    if forward_only:
        kind = FORWARD_ONLY
    elif settings or redefined or version:
        kind = BREAKING
    else:
        kind = ADDITIVE
    return TableChange(table, kind, settings, added, redefined, removed, version)
