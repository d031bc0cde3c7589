"""How often a run opens a Delta table's log, and what an open costs on an object store.

One-hour runs in one Spark session (as the warm worker runs them) over a sample history on local
disk: every deltalake open of a table's log during the last run and its daily run is counted, by
table and by the project's function that asked. Then the warehouse's tables are copied file for
file into a bucket of moto's S3 server (tests/s3_server.py), and opening each one's log there is
timed: a fresh open, and bringing an open table up to date (`update_incremental`).

    .venv/bin/python benchmarks/log_opens.py [--days 7] [--events-per-day 20000] [--runs 2]

Writes benchmarks/results/log_opens.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import deltalake

from measure import RESULTS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import Bench  # noqa: E402
from incremental_assets.lib.sample.stream import append_hours  # noqa: E402
from tests.s3_server import BUCKET, s3_server  # noqa: E402

PACKAGE = str(ROOT / "incremental_assets")
LOG_MODULE = str(ROOT / "incremental_assets" / "lib" / "delta" / "log.py")


class Opens:
    """Every DeltaTable opened while counting: by table, and by the project's function that asked
    (the innermost frame of the package outside lib/delta/log.py, which only opens)."""

    def __init__(self):
        self.counting = False
        self.by_table: collections.Counter = collections.Counter()
        self.by_caller: collections.Counter = collections.Counter()
        self.seconds = 0.0
        opened = deltalake.DeltaTable.__init__
        opens = self

        def counted(table, table_uri, *args, **kwargs):
            started = time.perf_counter()
            opened(table, table_uri, *args, **kwargs)
            if opens.counting:
                opens.seconds += time.perf_counter() - started
                opens.by_table[str(table_uri).rstrip("/").rsplit("/", 1)[-1]] += 1
                frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PACKAGE)]
                asking = next((f for f in reversed(frames) if f.filename != LOG_MODULE), frames[-1] if frames else None)
                opens.by_caller[f"{Path(asking.filename).stem}.{asking.name}" if asking else "outside the package"] += 1

        deltalake.DeltaTable.__init__ = counted


def median_ms(action, reps: int = 7) -> float:
    action()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def copied_to_bucket(warehouse: Path, prefix: str) -> None:
    import boto3

    client = boto3.client("s3")
    for path in warehouse.rglob("*"):
        if path.is_file() and not path.name.endswith(".crc"):
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(warehouse)}")


def open_costs(tables: list[Path], prefix: str) -> dict[str, dict]:
    costs = {}
    for table in tables:
        uri = f"s3://{BUCKET}/{prefix}/{table.name}"
        opened = deltalake.DeltaTable(uri)
        costs[table.name] = {
            "version": opened.version(),
            "local_open_ms": median_ms(lambda: deltalake.DeltaTable(str(table))),
            "s3_open_ms": median_ms(lambda: deltalake.DeltaTable(uri)),
            "s3_update_incremental_ms": median_ms(opened.update_incremental),
        }
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--events-per-day", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=2, help="one-hour runs after the history's backfill; the last is counted")
    args = parser.parse_args()

    opens = Opens()
    bench = Bench(Path(tempfile.mkdtemp(prefix="log-opens-")), 1)
    source, params = bench.stream("history", args.days, args.events_per_day)
    settings = bench.settings(params)
    bench.run(settings, source)  # the history's backfill
    for run in range(args.runs):
        append_hours(bench.spark, source, 1)
        opens.counting = run == args.runs - 1
        seconds, summary = bench.run(settings, source)
    opens.counting = False
    warehouse = Path(source).parent
    tables = sorted(path.parent for path in warehouse.glob("*/_delta_log"))
    with s3_server() as env:
        os.environ.update(env)
        copied_to_bucket(warehouse, "warehouse")
        costs = open_costs(tables, "warehouse")
    results = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "history_days": args.days,
        "events_per_day": args.events_per_day,
        "counted_run_seconds": round(seconds, 2),
        "daily_runs": len(summary.daily_runs),
        "opens": sum(opens.by_table.values()),
        "seconds_in_local_opens": round(opens.seconds, 3),
        "opens_by_table": dict(opens.by_table.most_common()),
        "opens_by_caller": dict(opens.by_caller.most_common()),
        "open_costs": costs,
        "s3_seconds_of_opens_per_run": round(sum(n * costs[t]["s3_open_ms"] for t, n in opens.by_table.items() if t in costs) / 1000, 2),
        "s3_seconds_if_updated_instead": round(
            sum(n * costs[t]["s3_update_incremental_ms"] for t, n in opens.by_table.items() if t in costs) / 1000, 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "log_opens.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k not in ("open_costs", "opens_by_caller")}, indent=2))


if __name__ == "__main__":
    main()
