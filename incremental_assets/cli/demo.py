"""`make demo`: the sample stream, incremental runs until caught up, and what they left behind."""

from __future__ import annotations

import os
import time
from datetime import date
from pathlib import Path

import yaml

from incremental_assets.cli.show import cell
from incremental_assets.lib import environment
from incremental_assets.lib.delta.log import read_rows, row_count, table_version
from incremental_assets.lib.settings import LOCAL_CONFIG, default_config_file, load_settings, read_config_file

DEMO_APPEND_HOURS = 6
# A short backfill limit so the demo shows the manifest catching up over several runs.
DEMO_OVERRIDES = {"backfill_limit_days": 2}
TABLES = (
    "atomic_events", "incremental_manifest", "new_event_limits", "sessions_lifecycle_manifest",
    "quarantined_sessions", "events_this_run", "filtered_events", "sessions",
    "daily_aggregation_manifest", "daily_aggregates", "attributes",
)
SHOWN_ATTRIBUTES = ("attribute_key", "page_views", "page_views_7d", "sessions_7d", "last_page_url", "distinct_apps")


def run_demo() -> None:
    started = time.perf_counter()
    environment.dagster_home()
    from incremental_assets.cli.runner import instance_or_default, run_until_caught_up
    from incremental_assets.lib.state.hooks import record_source_version
    from incremental_assets.lib.sample.generator import SampleParams
    from incremental_assets.lib.sample.stream import append_hours, generate_stream, read_stream_state
    from incremental_assets.lib.spark import build_spark_session

    spark = build_spark_session()
    source = environment.table_uri(environment.ATOMIC_EVENTS)
    state = read_stream_state(source)
    if state is None:
        params = SampleParams()
        rows = generate_stream(spark, source, params)
        print(f"Sample stream: {rows} events over {params.days} days from {params.start_date} -> {source}")
    else:
        params = state[0]
        rows = append_hours(spark, source, DEMO_APPEND_HOURS)
        print(f"Sample stream continued: {DEMO_APPEND_HOURS} more hourly load batches, {rows} events")
    record_source_version(instance_or_default(None), "sample stream", rows)
    settings_file = ensure_start_date(params.start_date)

    settings = load_settings(overrides=DEMO_OVERRIDES)
    print(
        f"\nIncremental runs (start_date {settings.start_date} from {settings_file}, backfill_limit_days "
        f"{settings.backfill_limit_days}); Dagster's event stream goes to {environment.run_log_file()}:"
    )
    summaries = run_until_caught_up(settings, report=lambda line: print(f"  run: {line}"))
    if not summaries[-1].success:
        raise SystemExit(f"Run {summaries[-1].run_id} failed: see it in the Dagster UI (make ui)")
    _print_tables()
    print(f"\nDemo finished in {time.perf_counter() - started:.0f}s ({len(summaries)} runs; make ui to browse them)")


def ensure_start_date(first_day: date) -> Path:
    """Put the sample's first day into the settings file the demo and `make ui` read, unless it
    names a start_date already: the definitions take it from there, never from the warehouse."""
    path = default_config_file(os.environ) or Path(LOCAL_CONFIG)
    values = read_config_file(path) if path.exists() else {}
    if "start_date" not in values:
        values["start_date"] = first_day.isoformat()
        path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def _print_tables() -> None:
    state = read_rows(environment.table_uri("incremental_manifest")) or []
    print("\nincremental_manifest:")
    for row in sorted(state, key=lambda r: r["model"]):
        print(f"  {row['model']:<16} last_success {row['last_success']}  last_upper {row['last_upper']}")
    days = read_rows(environment.table_uri("daily_aggregation_manifest")) or []
    print("\ndaily_aggregation_manifest:")
    print(f"  {'event_date':<12}{'status':<16}{'processed':>10}{'pending late':>14}{'late total':>12}")
    for row in sorted(days, key=lambda r: r["event_date"]):
        print(
            f"  {str(row['event_date']):<12}{row['status']:<16}{row['processed_events']:>10}"
            f"{row['pending_late_events']:>14}{row['late_events_total']:>12}"
        )
    attributes = read_rows(environment.table_uri("attributes"), columns=list(SHOWN_ATTRIBUTES)) or []
    print(f"\nattributes (5 of {len(attributes)} users):")
    for row in sorted(attributes, key=lambda r: -(r["page_views"] or 0))[:5]:
        print("  " + "  ".join(f"{name}={cell(row[name])}" for name in SHOWN_ATTRIBUTES))
    print("\nDelta tables:")
    for name in TABLES:
        uri = environment.table_uri(name)
        print(f"  {name:<28} {str(row_count(uri)):>8} rows  version {table_version(uri)}")
