"""`make demo`: the sample stream, then the main job over it, recorded in the Dagster instance."""

from __future__ import annotations

import time

from dagster import DagsterInstance

from incremental_assets import environment
from incremental_assets.previews import read_rows, table_version

DEMO_APPEND_HOURS = 6


def run_demo() -> None:
    started = time.perf_counter()
    environment.dagster_home()
    from incremental_assets.definitions import defs
    from incremental_assets.resources.spark import build_spark_session
    from incremental_assets.sample.generator import SampleParams
    from incremental_assets.sample.stream import append_hours, generate_stream, read_stream_state

    spark = build_spark_session()
    source = environment.table_uri(environment.SAMPLE_TABLE)
    if read_stream_state(source) is None:
        params = SampleParams()
        rows = generate_stream(spark, source, params)
        print(f"Sample stream: {rows} events over {params.days} days from {params.start_date} -> {source}")
    else:
        rows = append_hours(spark, source, DEMO_APPEND_HOURS)
        print(f"Sample stream continued: {DEMO_APPEND_HOURS} more hourly load batches, {rows} events")

    instance = DagsterInstance.get()
    result = defs.resolve_job_def("main_job").execute_in_process(instance=instance)
    if not result.success:
        raise SystemExit("main_job failed: see the run in the Dagster UI (make ui)")
    _print_summary()
    print(f"Demo finished in {time.perf_counter() - started:.0f}s; run id {result.run_id} (make ui to browse it)")


def _print_summary() -> None:
    summary = read_rows(environment.table_uri("source_load_summary")) or []
    print("\nsource_load_summary (per load day):")
    print(f"  {'load_date':<12}{'rows':>8}{'null ids':>10}{'dupes':>8}{'sessions':>10}")
    for row in sorted(summary, key=lambda r: r["load_date"]):
        print(
            f"  {str(row['load_date']):<12}{row['rows']:>8}{row['null_event_id']:>10}"
            f"{row['duplicate_event_ids']:>8}{row['sessions']:>10}"
        )
    print("\nDelta tables:")
    for name in ("atomic_events", "source_load_summary"):
        uri = environment.table_uri(name)
        print(f"  {name:<22} version {table_version(uri)}  {uri}")
