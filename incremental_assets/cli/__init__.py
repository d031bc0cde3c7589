"""`incremental-assets`: set up, generate or load source events, run the pipeline, inspect tables."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import date
from pathlib import Path
from typing import NoReturn

from incremental_assets.lib import environment
from incremental_assets.lib.catalog import ERASED_BY
from incremental_assets.lib.errors import one_line


def entry() -> None:
    """The console script. Spark's own log goes to a file beside the run's event stream."""
    from incremental_assets.lib import timings
    from incremental_assets.lib.spark import JVM_LOG_ENV

    timings.mark("interpreter and the command line")
    os.environ.setdefault(JVM_LOG_ENV, str(environment.home_dir() / "logs" / "spark.log"))
    _native_output_to(environment.run_log_file())
    leave(main())


def _native_output_to(log: Path) -> None:
    """What native code writes to the process's stderr (a Rust panic's message and backtrace under
    deltalake, an abort in Arrow's threads, the JVM's launcher) goes to the log file; Python's
    stderr, which gets the command's one error line, stays where it was (the terminal)."""
    sys.stderr.flush()
    terminal = os.dup(2)
    sys.stderr = open(terminal, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    log.parent.mkdir(parents=True, exist_ok=True)
    native = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(native, 2)
    os.close(native)


def leave(code: int) -> NoReturn:
    """Stop the Spark session and exit with `code`, without Python's final teardown, in which native
    thread pools (Arrow's, under deltalake and pyarrow) now and then abort a finished, successful
    process with "terminate called without an active exception" and a non-zero status."""
    from incremental_assets.lib import timings

    if "pyspark.sql" in sys.modules:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            timings.spark_jobs(session)  # the bench's alone: its own phase, not the exit's
            timings.mark("the bench's listing of Spark's jobs")
            session.stop()
    timings.mark("exit")
    timings.write()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if environment.on_object_store():
            environment.s3_endpoint()  # a store deltalake would refuse is named before anything starts
        environment.small_writes_by_deltalake()  # and a write engine that is none, before a run starts
        return args.command(args) or 0
    except Exception as error:  # noqa: BLE001 - every failure ends in one line; its traceback goes to the log
        return _failed(error)


def _failed(error: BaseException) -> int:
    """One `error:` line naming the cause (and, in the messages this project raises, the way out); the
    whole traceback in the log file the line names. Exit 2."""
    import traceback

    log = environment.run_log_file()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} error in {' '.join(sys.argv)}\n")
        handle.write("".join(traceback.format_exception(error)))
    print(f"error: {one_line(error)} (traceback: {log})", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="incremental-assets", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    setup = commands.add_parser("setup", help="resolve the Delta jars once, record the driver's class archive, prepare DAGSTER_HOME")
    setup.set_defaults(command=_setup)

    generate = commands.add_parser("generate", help="write (or continue) the sample event stream")
    generate.add_argument("--users", type=int, default=40)
    generate.add_argument("--days", type=int, default=5)
    generate.add_argument("--events-per-day", type=int, default=1500)
    generate.add_argument("--start-date", type=date.fromisoformat, default=None, help="default: today - days")
    generate.add_argument("--seed", type=int, default=42)
    generate.add_argument("--late-share", type=float, default=0.05)
    generate.add_argument("--duplicate-share", type=float, default=0.02)
    generate.add_argument("--bot-share", type=float, default=0.05)
    generate.add_argument(
        "--append-hours", type=int, default=None, metavar="H",
        help="continue the existing stream with its next H hourly load batches",
    )
    generate.set_defaults(command=_generate)

    load = commands.add_parser(
        "load", help="load a CSV / Parquet / JSON-lines export, or a Delta or Parquet table, of atomic events"
    )
    _settings_arguments(load)
    load.add_argument("file")
    load.add_argument("--mode", choices=["append", "replace"], default="append")
    load.add_argument("--dry-run", action="store_true", help="check and count the export, write nothing")
    load.add_argument("--epoch-unit", choices=["s", "ms", "us", "ns"], help="unit of epoch numbers (default: from their magnitude)")
    load.add_argument("--earliest", type=date.fromisoformat, help="first plausible day of any time (default 1990-01-01)")
    load.add_argument("--latest", type=date.fromisoformat, help="day after the last plausible one (default today + days_late_allowed + a year)")
    load.add_argument(
        "--no-process", action="store_true",
        help="leave rows behind the incremental cursor unprocessed: print the command that processes them",
    )
    load.set_defaults(command=_load)

    run = commands.add_parser("run", help="one incremental run (recorded in the Dagster instance)")
    _settings_arguments(run)
    run.add_argument("--until-caught-up", action="store_true", help="repeat until the window reaches now")
    run.add_argument("--lower", help="keyhole backfill: lower limit (ISO timestamp); the manifest does not move")
    run.add_argument("--upper", help="keyhole backfill: upper limit (ISO timestamp)")
    run.set_defaults(command=_run)

    preview = commands.add_parser("preview", help="state, limits, new events and days of the next run; writes nothing")
    _settings_arguments(preview)
    preview.set_defaults(command=_preview)

    show_plan = commands.add_parser("plan", help="what the current settings change in the tables built so far; writes nothing")
    _settings_arguments(show_plan)
    show_plan.set_defaults(command=_plan)

    apply = commands.add_parser("apply", help="carry out the plan: rebuild what it rebuilds, then run until caught up")
    _settings_arguments(apply)
    apply.add_argument(
        "--forward-only", action="store_true",
        help="rebuild nothing: the tables take the new settings from now on and record the day they did",
    )
    apply.set_defaults(command=_apply)

    backfill = commands.add_parser("backfill", help="recompute daily_aggregates for a range of days (one run)")
    _settings_arguments(backfill)
    backfill.add_argument("--start", required=True, type=date.fromisoformat, help="first day (YYYY-MM-DD)")
    backfill.add_argument("--end", required=True, type=date.fromisoformat, help="last day, inclusive")
    backfill.set_defaults(command=_backfill)

    refresh = commands.add_parser(
        "refresh", help="full refresh: empty the manifests and derived tables (needs allow_refresh), then rebuild"
    )
    _settings_arguments(refresh)
    refresh.set_defaults(command=_refresh)

    forget = commands.add_parser("forget", help="erase one person's rows from every table, with an audit record (docs/operations.md)")
    forget.add_argument("--key", action="append", default=[], help="an identifier to erase (repeat for several)")
    forget.add_argument("--file", help="a file of identifiers, one per line")
    forget.add_argument("--source", action="store_true", help="delete their rows from the source table too (its owner's VACUUM "
                        "makes them unreadable there); without it, every run drops them")
    forget.add_argument("--status", action="store_true", help="which tables still hold files with erased rows (no JVM)")
    forget.add_argument("--purge", action="store_true", help="then vacuum at once the warehouse's tables that still hold files "
                        "with erased rows (else maintenance_job does, after its retention): their time travel ends there")
    forget.add_argument("--by", default="attribute_key", choices=ERASED_BY,
                        help="the column the identifiers are values of (default: the attribute key)")
    _settings_arguments(forget)
    forget.set_defaults(command=_forget)
    resolve = commands.add_parser("resolve", help="mark a failed run's run_log records Resolved (no JVM)")
    resolve.add_argument("run_id")
    resolve.set_defaults(command=_resolve)
    show = commands.add_parser("show", help="print a table of the warehouse (no JVM)")
    show.add_argument("table")
    show.add_argument("--limit", type=int, default=20)
    show.set_defaults(command=_show)

    attributes = commands.add_parser("attributes", help="one key's attributes as of the end of a day (no JVM)")
    attributes.add_argument("--key", required=True, help="the attribute key (default: a user_identifier)")
    attributes.add_argument("--as-of", required=True, type=date.fromisoformat, metavar="YYYY-MM-DD")
    attributes.set_defaults(command=_attributes)

    server = commands.add_parser("connect-server", help="serve Spark Connect with Delta (foreground; SPARK_REMOTE=sc://HOST:PORT)")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=15002)
    server.add_argument("--master", default="local[*]", help="where the server's work runs")
    server.set_defaults(command=_connect_server)

    serve = commands.add_parser(
        "serve", help="a warm worker: execute the runs Dagster launches in one long-lived Spark session (foreground)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="default: any free port (written to DAGSTER_HOME/worker.json)")
    serve.set_defaults(command=_serve)

    demo = commands.add_parser("demo", help="generate the sample stream and run the pipeline over it")
    demo.set_defaults(command=_demo)
    return parser


def _settings_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.yaml", help="settings for this command (see docs/settings.md)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override one variable")


def _settings(args):
    """Validated before any Spark session starts: a bad value costs only a message."""
    from incremental_assets.lib.settings import load_settings, parse_assignments

    return load_settings(args.config, parse_assignments(args.set))


def _run(args) -> int:
    from incremental_assets.cli.runner import run_incremental, run_until_caught_up
    from incremental_assets.lib import timings

    timings.mark("imports")
    settings = _settings(args)
    _instance_advice(environment.dagster_home())
    timings.mark("settings")
    if (args.lower is None) != (args.upper is None):
        raise ValueError("a keyhole backfill needs both --lower and --upper")
    if args.until_caught_up:
        if args.lower:
            raise ValueError("--until-caught-up does not combine with a keyhole window")
        summaries = run_until_caught_up(settings)
    else:
        summaries = [run_incremental(settings, lower=args.lower, upper=args.upper)]
        print(summaries[0].describe())
        left = summaries[0].left_behind() if args.lower is None else None  # a keyhole's window is the caller's
        if left:
            print(left)
    return _outcome(summaries)


def _outcome(summaries) -> int:
    print(f"Dagster's event stream: {environment.run_log_file()}")
    failed = next((s.failed_run() for s in summaries if not s.success), None)
    if failed is None:
        return 0
    print(f"error: run {failed.run_id} failed{failed.failure_text()} (the run's events: {environment.run_log_file()})", file=sys.stderr)
    return 2


def _backfill(args) -> int:
    from incremental_assets.cli.runner import run_days
    from incremental_assets.lib.incremental.days import backfill_range
    from incremental_assets.lib.utc import utcnow

    settings = _settings(args)
    first, last, note = backfill_range(args.start, args.end, settings.start, utcnow().date())
    if note:
        print(note)
    summary = run_days(settings, first, last)
    print(f"daily_aggregates {first} .. {last}: {'ok' if summary.success else 'FAILED'} (run {summary.run_id})")
    print(f"Dagster's event stream: {environment.run_log_file()}")
    return _outcome([summary]) if not summary.success else 0


def _plan(args) -> None:
    from incremental_assets.cli.runner import incremental_of
    from incremental_assets.lib.state.settings_plan import pending_plan
    from incremental_assets.lib.state.store import StateStore

    settings = _settings(args)
    changes, _ = pending_plan(settings, StateStore(), incremental_of(settings))
    print("\n".join(changes.describe()))


def _apply(args) -> int:
    from incremental_assets.cli.runner import apply_changes

    applied = apply_changes(_settings(args), forward_only=args.forward_only)
    return _outcome(applied.runs) if applied.runs else 0


def _preview(args) -> None:
    from incremental_assets.cli.preview import preview

    print(preview(_settings(args)).describe())


def _setup(args) -> None:
    from incremental_assets.cli.runner import instance_or_default, record_class_archive
    from incremental_assets.lib.spark import driver_jars

    started = time.perf_counter()
    jars = driver_jars()
    home = environment.dagster_home()
    store = " (with S3A's, for the object store)" if environment.on_object_store() else ""
    print(f"Delta jars{store} ready ({len(jars)} files, {time.perf_counter() - started:.1f}s); DAGSTER_HOME={home}")
    started = time.perf_counter()
    archive = record_class_archive()
    if archive is not None:
        print(f"Driver class archive ready ({archive.stat().st_size // 2**20} MB, {time.perf_counter() - started:.1f}s): {archive}")
    instance_or_default(None)  # its tables made now, before `make ui` starts three processes that open it
    print(f"Dagster instance: {environment.instance_config(home)}")
    _instance_advice(home)


def _instance_advice(home: Path) -> None:
    advice = environment.instance_advice(home)
    if advice:
        print(f"note: {advice}")


def _connect_server(args) -> None:
    """Replaced by spark-submit (same process id): stopping it stops the server."""
    from incremental_assets.lib.spark import connect_server_command

    command = connect_server_command(args.port, args.host, args.master)
    os.dup2(sys.stderr.fileno(), 2)  # the server's own output, on the terminal as before (see entry)
    os.execv(command[0], command)


def _serve(args) -> None:
    from incremental_assets.cli.runner import instance_or_default
    from incremental_assets.cli.serve import Worker

    home = environment.home_dir()
    if not (home / "dagster.yaml").exists():  # a home no one set up: no daemon launches into it
        raise SystemExit(
            f"error: DAGSTER_HOME={home} has no dagster.yaml, so no daemon launches runs into it: start the worker with "
            "the daemon's DAGSTER_HOME (the one `incremental-assets setup` and `make ui` use), or run "
            "`incremental-assets setup` with this one first"
        )
    worker = Worker(instance_or_default(None), args.host, args.port)
    worker.take_sigterm()
    try:
        worker.warm()
        worker.serve_forever()
    except KeyboardInterrupt:
        print("Stopped", flush=True)


def _spark():
    from incremental_assets.lib.spark import build_spark_session

    return build_spark_session()


def _generate(args) -> None:
    from incremental_assets.cli.runner import instance_or_default
    from incremental_assets.lib.state.hooks import record_source_version
    from incremental_assets.lib.sample.generator import SampleParams
    from incremental_assets.lib.sample.stream import append_hours, generate_stream

    uri = environment.table_uri(environment.ATOMIC_EVENTS)
    if args.append_hours is not None:
        rows = append_hours(_spark(), uri, args.append_hours)
        record_source_version(instance_or_default(None), f"sample stream: {args.append_hours} more hour(s)", rows)
        print(f"Appended {args.append_hours} hourly load batch(es), {rows} rows, to {uri}")
        return
    params = SampleParams(
        users=args.users,
        days=args.days,
        events_per_day=args.events_per_day,
        seed=args.seed,
        late_share=args.late_share,
        duplicate_share=args.duplicate_share,
        bot_share=args.bot_share,
        **({"start_date": args.start_date} if args.start_date else {}),
    )
    rows = generate_stream(_spark(), uri, params)
    record_source_version(instance_or_default(None), "sample stream", rows)
    print(f"Wrote {rows} sample events ({params.days} days from {params.start_date}) to {uri}")


def _load(args) -> int:
    from incremental_assets.cli.runner import load_export
    from incremental_assets.lib.source.loader import LoadOptions
    from incremental_assets.lib.source.timestamps import EpochUnit, Plausible

    settings = _settings(args)
    window = Plausible.around(date.today(), settings.days_late_allowed, args.earliest, args.latest)
    options = LoadOptions(args.mode, EpochUnit(args.epoch_unit) if args.epoch_unit else None, window)
    print(f"Source table: {environment.source_table_uri()} ({args.mode}{', dry run' if args.dry_run else ''})")
    outcome = load_export(settings, args.file, options, dry_run=args.dry_run, process=not args.no_process)
    if not outcome.success:
        return _outcome([outcome.keyhole, *outcome.keyhole.daily_runs])
    return 0


def _refresh(args) -> int:
    from incremental_assets.cli.runner import incremental_of, instance_or_default, run_until_caught_up
    from incremental_assets.lib.upkeep.refresh import refresh

    settings = _settings(args)
    for table, rows in refresh(settings, instance_or_default(None), incremental_of(settings)).items():
        print(f"emptied {table} ({rows} rows)")
    print(f"Rebuilding from {settings.start_date}:")
    return _outcome(run_until_caught_up(settings))


def _forget(args) -> int:
    from incremental_assets.cli.runner import incremental_of, instance_or_default
    from incremental_assets.lib.state.store import StateStore
    from incremental_assets.lib.upkeep.erasure import erase, purge

    settings = _settings(args)
    if args.status:
        return _erasure_status()
    keys = [*args.key, *(Path(args.file).read_text().splitlines() if args.file else [])]
    if keys or not args.purge:
        erasure = erase(settings, keys, args.by, _spark(), instance_or_default(None), incremental_of(settings), source=args.source)
        for table, rows in erasure.rows.items():
            print(f"  {table:<28} {rows:>8} rows erased")
        for table in erasure.not_covered:
            print(f"  {table:<28} not covered: it has no user_identifier column")
        print(f"Erasure {erasure.request_id} recorded in {environment.table_uri('erasure_log')} (keys as salted hashes only)")
    if args.purge:
        purged = purge(StateStore(), instance_or_default(None))
        for table in purged.vacuumed:
            print(f"  {table:<28} vacuumed: no file its current version does not read is left")
        for table, why in purged.waiting.items():
            print(f"  {table:<28} not purged: {why}")
        for request in purged.gone:
            print(f"Erasure {request}: physically gone")
        for table in purged.log_cut:
            print(f"  {table:<28} log cut at its current version: no older commit (nor its files' statistics) is left")
    return 0


def _erasure_status() -> int:
    from incremental_assets.lib.state.store import StateStore
    from incremental_assets.lib.upkeep.erasure import SOURCE, files_left

    state = StateStore()
    left = files_left(state)
    for request in state.erasure_log():
        gone = request["physically_gone_at"]
        print(f"{request['request_id']}  requested {request['requested_at']:%Y-%m-%d %H:%M} UTC by {request['requested_by']}: "
              f"{request['status']}{f', physically gone {gone:%Y-%m-%d %H:%M} UTC' if gone else ''}")
        for table, files in left.get(request["request_id"], {}).items():
            held = "unknown: its commits' log is cleaned up" if files is None else f"{len(files)} file(s) readable through time travel"
            print(f"  {table:<28} {held}" if files != [] else f"  {table:<28} gone")
    held = {table for tables in left.values() for table, files in tables.items() if files != []}
    if held - {SOURCE}:
        print("Erased rows stay in files time travel reads until maintenance_job vacuums them (maintenance_retention_hours "
              "after the erasure; docs/operations.md, Erasure)")
    if SOURCE in held:
        print("The source's files are its owner's to vacuum: maintenance_job does not touch the source table")
    return 0


def _resolve(args) -> int:
    from incremental_assets.lib.state.store import StateStore

    resolved = StateStore().resolve(args.run_id)
    if not resolved:
        print(f"error: run {args.run_id} has no Failed record left to resolve (see: incremental-assets show run_log)", file=sys.stderr)
        return 2
    print(f"Run {args.run_id}: {resolved} Failed record(s) marked Resolved")
    return 0


def _show(args) -> None:
    from incremental_assets.cli.show import print_table

    print_table(environment.table_uri(args.table), limit=args.limit)


def _attributes(args) -> int:
    from incremental_assets.cli.show import print_attributes_as_of
    from incremental_assets.lib.catalog import ATTRIBUTES_HISTORY

    return 0 if print_attributes_as_of(environment.table_uri(ATTRIBUTES_HISTORY), args.key, args.as_of) else 1


def _demo(args) -> None:
    from incremental_assets.cli.demo import run_demo

    run_demo()


if __name__ == "__main__":
    sys.exit(main())
