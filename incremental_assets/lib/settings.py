"""The variables: one typed settings object, with defaults overridden in this order by
a deployment's environment (`INCREMENTAL_ASSETS_<NAME>`), a YAML file (`--config`, else
`INCREMENTAL_ASSETS_CONFIG`, else `./incremental_assets.yaml` when it exists), `--set name=value`,
and, per run, the Dagster launchpad (it is a resource: `resources: settings: config: ...`).

`validate()` runs before any Spark session starts, so a bad value costs nothing but a message.
"""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

import yaml
from dagster import Config, ConfigurableResource
from pydantic import Field, model_validator

from incremental_assets.lib.attributes import (
    AGGREGATIONS,
    SAMPLE_ATTRIBUTES,
    AttributeDefinitionError,
    AttributeSpec,
    parse_attributes,
)

ENV_PREFIX = "INCREMENTAL_ASSETS_"
CONFIG_ENV = "INCREMENTAL_ASSETS_CONFIG"
LOCAL_CONFIG = "incremental_assets.yaml"
SESSION_TIMESTAMPS = ("load_tstamp", "collector_tstamp")
DEFAULT_START_DATE = "2020-01-01"


class SettingsError(Exception):
    """One or more variables are out of range; the message names each and its allowed values.

    Not a ValueError, so pydantic passes it through as it is instead of wrapping it."""


class ConditionConfig(Config):
    column: str
    op: str = Field(description="=, !=, >, >=, <, <=, in, not_null")
    value: str | None = None
    values: list[str] = Field(default_factory=list, description="For op 'in'")


class AttributeConfig(Config):
    name: str
    aggregation: str = Field(description=", ".join(AGGREGATIONS))
    property: str | None = None
    event_names: list[str] = Field(default_factory=list)
    conditions: list[ConditionConfig] = Field(default_factory=list)
    period: str = Field(default="lifetime", description="lifetime or 'last N days'")

    def as_definition(self) -> dict:
        definition = self.model_dump(exclude={"conditions"})
        definition["conditions"] = [
            {"column": c.column, "op": c.op, "value": c.values if c.op == "in" else c.value} for c in self.conditions
        ]
        return definition


class IncrementalSettings(ConfigurableResource):
    start_date: str = Field(default=DEFAULT_START_DATE, description="First day processed (YYYY-MM-DD, UTC)")
    backfill_limit_days: int = Field(default=30, description="Longest window of one run, in days (>= 1)")
    lookback_window_hours: float = Field(default=6, description="Overlap re-read before the last position (>= 0)")
    session_timestamp: str = Field(default="load_tstamp", description="Cursor column: load_tstamp or collector_tstamp")
    source_load_date_column: str = Field(
        default="load_date",  # atomic_events.LOAD_DATE: the column the loader and the sample write
        description="Source column holding the UTC date of load_tstamp (a partition or clustering column): runs "
        "read only the load days a window can hold. Snowplow's Lake Loader names it date_load_tstamp. A source "
        "without the default column is read whole",
    )
    max_session_days: int = Field(default=3, description="Sessions longer than this are capped and quarantined (>= 1)")
    days_late_allowed: int = Field(default=3, description="Events sent later than this after creation are dropped (>= 0)")
    session_lookback_days: int = Field(default=730, description="How far back stored sessions are matched (>= 1)")
    upsert_lookback_days: int = Field(default=30, description="The filtered_events and sessions MERGEs look back this far (>= 0)")
    app_ids: list[str] = Field(default_factory=list, description="Only these app_ids (empty: all)")
    allow_null_app_id: bool = Field(default=False, description="Keep events without app_id when app_ids is set")
    event_names: list[str] = Field(default_factory=list, description="Events kept in filtered_events (empty: all)")
    reprocess_days: int = Field(default=5, description="Late data older than this is not applied automatically (>= 0)")
    min_rows_to_process: int = Field(default=1, description="Pending late events needed to recompute a day (>= 1)")
    allow_null_dvce_tstamps: bool = Field(default=False, description="Late-sent filter falls back to collector_tstamp")
    allow_refresh: bool = Field(default=False, description="Required for a full refresh of manifests and tables")
    apply_additive_changes: bool = Field(
        default=False,
        description="Attributes added or removed are applied by themselves (the source sensor requests apply_plan_job); "
        "other changes wait for `incremental-assets apply`",
    )
    session_identifiers: list[str] = Field(
        default_factory=lambda: ["domain_sessionid"], description="Session id: first non-null of these columns"
    )
    session_identifier_sql: str | None = Field(default=None, description="Or a Spark SQL expression for the session id")
    user_identifiers: list[str] = Field(
        default_factory=lambda: ["domain_userid"], description="User id: first non-null of these columns"
    )
    user_identifier_sql: str | None = Field(default=None, description="Or a Spark SQL expression for the user id")
    attribute_key: str = Field(default="user_identifier", description="filtered_events column attributes are per")
    attributes: list[AttributeConfig] = Field(
        default_factory=lambda: [AttributeConfig(**a) for a in SAMPLE_ATTRIBUTES], description="Declared attributes"
    )
    filtered_events_fresh_hours: float = Field(
        default=3, description="filtered_events shows stale (red) when not updated for this many hours (> 0)"
    )
    daily_aggregates_fresh_hours: float = Field(
        default=30, description="daily_aggregates shows stale (red) when not updated for this many hours (> 0)"
    )
    sensor_interval_seconds: int = Field(
        default=30, description="How often the sensors that request runs look at the source and the manifests (>= 5)"
    )
    maintenance_retention_hours: float = Field(
        default=168, description="History table maintenance keeps (VACUUM retention; >= 168, Delta's own minimum)"
    )
    maintenance_zorder_by: dict[str, list[str]] = Field(
        default_factory=lambda: {"attributes_history": ["attribute_key"]},
        description="Tables whose compaction Z-orders their files by these columns, e.g. "
        "{sessions_lifecycle_manifest: [session_identifier]} (columns that keep statistics; the others: plain "
        "compaction). Default: attributes_history by attribute_key, so a lookup of one key reads few files",
    )
    erasure_salt_file: str | None = Field(
        default=None, description="File of the secret that erased keys are hashed with (`forget`); default "
        "DAGSTER_HOME/erasure_salt, made on first use. Keep it: without it no later request matches an earlier one",
    )
    attributes_reference_date: str | None = Field(
        default=None, description="Day 'last N days' counts back from (YYYY-MM-DD); default today"
    )

    @model_validator(mode="after")
    def _validated(self) -> "IncrementalSettings":
        """Validated once, when built: from load_settings, or from launchpad config at run start."""
        return self.validate_all()

    @property
    def start(self) -> date:
        return date.fromisoformat(self.start_date)

    def upsert_floor(self, first_day: date) -> date:
        """The first day a MERGE of rows dated from `first_day` on reads in its target: a
        stored copy of one of them lies within upsert_lookback_days before it."""
        return first_day - timedelta(days=self.upsert_lookback_days)

    def attribute_specs(self) -> list[AttributeSpec]:
        return parse_attributes(a.as_definition() for a in self.attributes)

    def reference_day(self) -> date:
        return date.fromisoformat(self.attributes_reference_date) if self.attributes_reference_date else _today()

    def validate_all(self, today: date | None = None) -> "IncrementalSettings":
        """Raise SettingsError naming every variable that is out of range."""
        today = today or _today()
        problems = []
        try:
            if self.start > today:
                problems.append(f"start_date must not be in the future (got {self.start_date}, today is {today})")
        except ValueError:
            problems.append(f"start_date must be a date YYYY-MM-DD (got {self.start_date!r})")
        minimums = {
            "backfill_limit_days": 1, "lookback_window_hours": 0, "max_session_days": 1, "days_late_allowed": 0,
            "session_lookback_days": 1, "upsert_lookback_days": 0, "reprocess_days": 0, "min_rows_to_process": 1,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if value < minimum:
                kind = "a number" if name == "lookback_window_hours" else "an integer"
                problems.append(f"{name} must be {kind} >= {minimum} (got {value})")
        for name in ("filtered_events_fresh_hours", "daily_aggregates_fresh_hours"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be a number of hours > 0 (got {getattr(self, name)})")
        if not self.sensor_interval_seconds >= 5:  # the daemon looks at its sensors every 5 s at most
            problems.append(f"sensor_interval_seconds must be an integer >= 5 (got {self.sensor_interval_seconds})")
        if not self.maintenance_retention_hours >= 168:
            problems.append(
                f"maintenance_retention_hours must be >= 168 (got {self.maintenance_retention_hours}): the daily "
                "layer's change-feed reads and time travel need a week of history"
            )
        for table, columns in self.maintenance_zorder_by.items():
            if not columns or not all(isinstance(c, str) and c for c in columns):
                problems.append(f"maintenance_zorder_by: {table} needs a list of column names (got {columns!r})")
        if not self.source_load_date_column.strip():
            problems.append("source_load_date_column must name a column of the source table")
        if self.session_timestamp not in SESSION_TIMESTAMPS:
            problems.append(f"session_timestamp must be one of {', '.join(SESSION_TIMESTAMPS)} (got {self.session_timestamp!r})")
        for name in ("session_identifiers", "user_identifiers"):
            if not getattr(self, name) and not getattr(self, name.replace("identifiers", "identifier_sql")):
                problems.append(f"{name} must name at least one column (or set {name[:-1]}_sql)")
        try:
            self.attribute_specs()
        except AttributeDefinitionError as error:
            problems.append(f"attributes: {error}")
        if self.attributes_reference_date:
            try:
                date.fromisoformat(self.attributes_reference_date)
            except ValueError:
                problems.append(f"attributes_reference_date must be a date YYYY-MM-DD (got {self.attributes_reference_date!r})")
        if problems:
            raise SettingsError("Invalid settings: " + "; ".join(problems))
        return self


def _today() -> date:
    return datetime.now(timezone.utc).date()


def load_settings(
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> IncrementalSettings:
    """Defaults, then the environment, then a YAML file, then explicit overrides; validated.

    Reads no table: the Dagster definitions load from this, whatever the warehouse holds.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    values.update(_from_environment(environ))
    values.update(read_config_file(config_file or default_config_file(environ)))
    values.update(overrides or {})
    unknown = sorted(set(values) - set(IncrementalSettings.model_fields))
    if unknown:
        raise SettingsError(f"Unknown variable(s) {unknown}; known: {sorted(IncrementalSettings.model_fields)}")
    values = {name: _coerce(name, value) for name, value in values.items()}
    return IncrementalSettings(**values)


def default_config_file(environ: Mapping[str, str]) -> Path | None:
    """INCREMENTAL_ASSETS_CONFIG, else ./incremental_assets.yaml when there is one."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV])
    local = Path(LOCAL_CONFIG)
    return local if local.exists() else None


def read_config_file(config_file: str | Path | None) -> dict[str, Any]:
    if not config_file:
        return {}
    path = Path(config_file)
    if not path.exists():
        raise SettingsError(f"No settings file at {path}")
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"{path} must hold a mapping of variable: value")
    return loaded


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """`--set name=value` pairs."""
    parsed = {}
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        if not sep:
            raise SettingsError(f"--set takes name=value, got {assignment!r}")
        parsed[name.strip()] = value.strip()
    return parsed


def _from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        name: environ[ENV_PREFIX + name.upper()]
        for name in IncrementalSettings.model_fields
        if ENV_PREFIX + name.upper() in environ
    }


def _coerce(name: str, value: Any) -> Any:
    """Text from the environment or --set, turned into the field's type with a clear error."""
    annotation = str(IncrementalSettings.model_fields[name].annotation)
    if isinstance(value, date):
        return value.isoformat()
    if not isinstance(value, str):
        return value
    try:
        if "list" in annotation:
            return [item.strip() for item in value.split(",") if item.strip()]
        if "bool" in annotation:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return value.lower() in ("true", "1", "yes")
        if "int" in annotation:
            return int(value)
        if "float" in annotation:
            return float(value)
    except ValueError:
        raise SettingsError(f"{name} must be of type {annotation.replace('<class ', '').rstrip('>')} (got {value!r})") from None
    return value
