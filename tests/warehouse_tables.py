"""The tables of a warehouse, as sorted rows to compare two warehouses that processed the same
events differently (batched against one-shot, interrupted against uninterrupted, the batch's
scan narrowed against a whole one)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from dagster import AssetKey, DagsterInstance
from deltalake import DeltaTable
from pytest import MonkeyPatch

from incremental_assets.cli.runner import run_days, run_until_caught_up
from incremental_assets.defs.base import sessions as batch_step
from incremental_assets.lib.catalog import ATTRIBUTES
from incremental_assets.lib.sample.generator import SampleParams, generate_table
from incremental_assets.lib.sample.stream import STREAM_SCHEMA
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.transforms import sessions as transforms
from incremental_assets.lib.utc import utcnow

COMPARED = (
    "filtered_events", "sessions_lifecycle_manifest", "quarantined_sessions", "sessions", "daily_aggregates", "attributes",
    "attributes_history",
)
# The day attributes are as of in warehouses built at different times, fixed once: attributes_history
# runs through its reference day, so two builds on either side of midnight UTC would differ.
REFERENCE_DAY = utcnow().date().isoformat()
# Columns that say when a run did something, not what the data is: left out of the comparison.
RUN_DEPENDENT = {"quarantined_sessions": ("quarantined_at",)}


def comparable_tables(warehouse: str | Path) -> dict[str, list[tuple]]:
    """The compared tables as deltalake reads them (no JVM; the same on local disk and an object store)."""
    tables = {}
    for name in COMPARED:
        table = DeltaTable(f"{warehouse}/{name}").to_pyarrow_table()
        columns = sorted(c for c in table.column_names if c not in RUN_DEPENDENT.get(name, ()))
        rows = [tuple(row[c] for c in columns) for row in table.select(columns).to_pylist()]
        tables[name] = sorted(rows, key=lambda row: tuple((value is None, value) for value in row))  # nulls last
    return tables


def read_alike_by_checks(spark, warehouse: str | Path) -> None:
    """Every compared table reads the same through the checks' small path (deltalake's Arrow handed
    to Spark: read_just_written) as through Spark's Delta reader: schema and rows. So does the last
    run's batch, read whole, as the incremental assets receive it (BatchHandler.load)."""
    from incremental_assets.lib.delta.read import read_just_written, read_table

    for name in (*COMPARED, "events_this_run"):
        spark_read = read_table(spark, f"{warehouse}/{name}")
        small_read = read_just_written(spark, f"{warehouse}/{name}", None if name == "events_this_run" else spark_read.columns)
        assert small_read.schema == spark_read.schema, name
        assert sorted(map(repr, small_read.collect())) == sorted(map(repr, spark_read.collect())), name


def found_alike_by_checks(spark, warehouse: str | Path) -> None:
    """What the checks look for in a small read's rows, found in Arrow as Spark finds it, on the
    warehouse's own rows with faults planted (sessions and event ids stored again, sessions' ends
    pushed a year past their start, events of a session never stored or a year after theirs); the
    days' sums of events alike; and the rows each commit of filtered_events inserted, read from
    deltalake's change feed as from Spark's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from incremental_assets.lib.checks import sums_by
    from incremental_assets.lib.delta.arrow import to_spark
    from incremental_assets.lib.delta.read import inserted_rows, inserted_as_read, read_just_written, read_to_check
    from incremental_assets.lib.transforms import violations as V
    from incremental_assets.lib.transforms.daily import day_arrivals

    def planted(table: str, columns: list[str], planting) -> tuple:
        rows = read_to_check(spark, f"{warehouse}/{table}", columns)
        assert isinstance(rows, pa.Table), table  # small: deltalake read it
        rows = pa.concat_tables([rows, planting(rows)])
        return rows, to_spark(spark, rows, read_just_written(spark, f"{warehouse}/{table}", columns).schema)

    def later_ends(rows: pa.Table) -> pa.Table:  # three sessions stored again, three more ending a year after they start
        year = pa.scalar(timedelta(days=365)).cast(pa.duration(rows.schema.field("start_tstamp").type.unit))
        pushed = rows.slice(3, 3)
        ends = pc.add(pushed["start_tstamp"], year)
        return pa.concat_tables([rows.slice(0, 3), pushed.set_column(pushed.schema.get_field_index("end_tstamp"), "end_tstamp", ends)])

    def strays(rows: pa.Table) -> pa.Table:  # three events of a session never stored, three a year after theirs
        year = pa.scalar(timedelta(days=365)).cast(pa.duration(rows.schema.field(ts).type.unit))
        unknown = rows.slice(0, 3).set_column(1, SESSION, pa.array(["never-stored"] * min(3, rows.num_rows), pa.string()))
        later = rows.slice(3, 3)
        return pa.concat_tables([unknown, later.set_column(2, ts, pc.add(later[ts], year))])

    def misplaced_intervals(rows: pa.Table) -> pa.Table:  # rows stored again a day later, and a day earlier
        starts = rows.schema.get_field_index("valid_from")

        def moved(part: pa.Table, days: int) -> pa.Table:
            day = pc.add(part["valid_from"].cast(pa.int32()), pa.scalar(days, pa.int32())).cast(pa.date32())
            return part.set_column(starts, rows.schema.field(starts), day)

        return pa.concat_tables([moved(rows.slice(0, 3), 1), moved(rows.slice(3, 3), -1)])

    settings = IncrementalSettings()
    cap, ts, SESSION = settings.max_session_days, settings.session_timestamp, "session_identifier"
    lifecycle = planted("sessions_lifecycle_manifest", [SESSION, "start_tstamp", "end_tstamp"], later_ends)
    ids = planted("filtered_events", ["event_id"], lambda rows: rows.slice(0, 2))
    events = planted("filtered_events", ["event_id", SESSION, ts], strays)
    days = planted("daily_aggregates", ["event_date", "events"], lambda rows: rows.slice(0, 5))
    history_columns = [field.name for field in DeltaTable(f"{warehouse}/attributes_history").schema().fields]
    history = planted("attributes_history", history_columns, misplaced_intervals)
    for in_arrow, in_spark in (
        (V.lifecycle_violations(lifecycle[0], cap), V.lifecycle_violations(lifecycle[1], cap)),
        (V.duplicated_event_ids(ids[0]), V.duplicated_event_ids(ids[1])),
        (V.events_beyond_cap(events[0], lifecycle[0], ts, cap), V.events_beyond_cap(events[1], lifecycle[1], ts, cap)),
        (V.interval_violations(history[0], history_columns[3:]), V.interval_violations(history[1], history_columns[3:])),
    ):
        assert found_rows(in_arrow) == found_rows(in_spark) != []
    assert sums_by(days[0], "event_date", "events") == sums_by(days[1], "event_date", "events")
    # The rows each commit of filtered_events inserted, from deltalake's change feed as from Spark's.
    uri, columns = f"{warehouse}/filtered_events", ["event_id", SESSION, ts]
    for version in range(1, DeltaTable(uri).version() + 1):
        in_arrow = inserted_as_read(spark, uri, version, columns, 1)
        assert found_rows(in_arrow) == found_rows(inserted_rows(spark, uri, version).select(*columns)), version
    # The days the daily manifest finds in the inserts since a commit, from either change feed.
    latest, arriving = DeltaTable(uri).version(), ["event_date", "load_tstamp", "derived_tstamp"]
    for first in sorted({1, max(1, latest - 2), latest}):
        in_arrow = day_arrivals(inserted_as_read(spark, uri, first, arriving, 1, latest))
        in_spark = day_arrivals(inserted_rows(spark, uri, first, latest).select(*arriving))
        assert in_arrow == in_spark, first


def found_rows(offending) -> list[tuple]:
    """A check's offending rows (Arrow's or Spark's), sorted, their instants as Spark's rows show them (naive, in UTC)."""
    import pyarrow as pa

    def naive(value):
        return value.astimezone(timezone.utc).replace(tzinfo=None) if isinstance(value, datetime) and value.tzinfo else value

    if isinstance(offending, pa.Table):
        rows = [tuple(naive(value) for value in row.values()) for row in offending.to_pylist()]
    else:
        rows = [tuple(row) for row in offending.collect()]
    return sorted(rows, key=lambda row: [(value is None, value) for value in row])


def sample_source(spark, params: SampleParams, root: Path) -> str:
    """The sample stream of `params` (its days, and two more of late loads) as the source table under `root`."""
    source = str(root / "source")
    rows = generate_table(params, params.start, params.start + timedelta(days=params.days + 2))
    write_events(spark, spark.createDataFrame(rows, STREAM_SCHEMA), source, "append")
    return source


@contextmanager
def scenario_environment(warehouse, source, settings: dict, home=None):
    """One scenario's warehouse, source, Dagster home and settings in os.environ (so a child
    process started inside gets them too), restored after."""
    values = {
        "INCREMENTAL_ASSETS_WAREHOUSE": str(warehouse),
        "INCREMENTAL_ASSETS_SOURCE": str(source),
        **({"DAGSTER_HOME": str(home)} if home is not None else {}),
        **{f"INCREMENTAL_ASSETS_{name.upper()}": str(value) for name, value in settings.items()},
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def reference_run(spark, params: SampleParams, settings: dict, root: Path, days: tuple | None = None):
    """The sample source of `params` under `root`, and the comparable tables an uninterrupted
    in-process run leaves over it: `run --until-caught-up`, then a daily backfill of `days`
    (first, last) if given. What a scenario run elsewhere (a cluster, after a crash) must equal."""
    source = sample_source(spark, params, root)
    with scenario_environment(root / "warehouse", source, settings):
        run_settings, instance = IncrementalSettings(**settings), DagsterInstance.ephemeral()
        runs = run_until_caught_up(run_settings, report=lambda line: None, instance=instance)
        if days is not None:
            runs.append(run_days(run_settings, *days, instance))
    assert all(run.success for run in runs), [run.error for run in runs]
    return source, comparable_tables(root / "warehouse")


def built_under(settings: IncrementalSettings) -> None:
    """Record every table's fingerprint under `settings`, as a run's lease does: tables a test
    plants without a run would otherwise look built by an earlier release."""
    from incremental_assets.lib.catalog import BUILT_IN_INCREMENTAL
    from incremental_assets.lib.state.settings_plan import current_fingerprints
    from incremental_assets.lib.state.store import StateStore

    StateStore().record_fingerprints(current_fingerprints(settings, dict.fromkeys(BUILT_IN_INCREMENTAL)), "test")


def attributes_values_from(instance: DagsterInstance) -> list[str]:
    """Where each write of attributes that recomputed keys took their values from (its metadata
    `values_from`, without the version it names), the latest first."""
    records = instance.fetch_materializations(AssetKey(ATTRIBUTES), limit=100).records
    metadata = [record.asset_materialization.metadata for record in records]
    return [entry["values_from"].value.split(" (")[0] for entry in metadata if "values_from" in entry]


RUN_ACCOUNTS = ("asset", "partition", "status", "lower_limit", "upper_limit", "rows", "rows_read", "rows_kept", "skipped")


def run_accounts(warehouse: str | Path) -> list[str]:
    """What a warehouse's runs counted, step by step: windows, rows read, kept, and skipped by reason."""
    log = DeltaTable(f"{warehouse}/run_log").to_pyarrow_table(columns=list(RUN_ACCOUNTS))
    return sorted(repr(tuple(row.values())) for row in log.to_pylist())


@contextmanager
def batch_scan(narrowed: bool):
    """Runs in this process scan the source for their batch narrowed to their sessions and window
    (as a run whose sessions are few enough to broadcast does), yielding each narrowing's (rows
    scanned, rows kept); or not narrowed: every row of the sessions' span, as above that bound."""
    counts: list[tuple[int, int]] = []
    narrow = transforms._of_sessions_or_window

    def counted(rows, *args):
        kept = narrow(rows, *args)
        counts.append((rows.count(), kept.count()))
        return kept

    with MonkeyPatch.context() as patch:
        if narrowed:
            patch.setattr(transforms, "_of_sessions_or_window", counted)
        else:
            patch.setattr(batch_step, "BROADCAST_SESSIONS", -1)  # no run's sessions are few enough, none at all included
            patch.setattr(transforms, "_of_sessions_or_window", None)  # so never narrowed
        yield counts
