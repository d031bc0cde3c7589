"""`make bench-erasure`: what forgetting people costs against the size of the warehouse.

    .venv/bin/python benchmarks/erasure.py [--events-per-day 4000] [--histories 7 28] [--keys 1 10]

A stream at a real site's shape (measure.EVENTS_PER_USER) with `--histories` days, processed; then
one untimed request (the warehouse's first MERGEs compile), then one `forget` request per entry of
`--keys` (that many people at once, never the same person twice), timed as the command runs it:
resolve, delete from every table, recount, audit; then `forget --purge` of them all, timed (each
table vacuumed of every file its current version does not read, and its log cut there). Writes
benchmarks/results/erasure.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench import Bench
from deltalake import DeltaTable

from incremental_assets.cli.runner import incremental_of
from incremental_assets.lib import environment
from incremental_assets.lib.state.store import StateStore
from incremental_assets.lib.upkeep.erasure import erase, purge

from measure import save_results


def table_rows() -> dict[str, int]:
    rows = {}
    for table in ("filtered_events", "sessions", "daily_aggregates", "attributes_history"):
        rows[table] = DeltaTable(environment.table_uri(table)).to_pyarrow_table(columns=[]).num_rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events-per-day", type=int, default=4_000)
    parser.add_argument("--histories", type=int, nargs="+", default=[7, 28])
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 10])
    args = parser.parse_args()
    results = {"events_per_day": args.events_per_day, "shape": "site", "histories": {}}
    with tempfile.TemporaryDirectory(prefix="incremental-assets-erasure-") as root:
        bench = Bench(Path(root), reps=1)
        for days in args.histories:
            source, params = bench.stream(f"erasure-{days}", days, args.events_per_day, shape="site")
            settings = bench.settings(params, erasure_salt_file=str(Path(root) / "salt"))
            bench.run(settings, source)
            people = (row[0] for row in bench.spark.read.format("delta").load(environment.table_uri("attributes"))
                      .select("attribute_key").orderBy("attribute_key").toLocalIterator())
            history = {"rows_before": table_rows(), "requests": []}
            # Untimed: the first MERGEs of a warehouse compile what the timed requests then reuse.
            erase(settings, [next(people)], "attribute_key", bench.spark, bench.instance, incremental_of(settings))
            for count in args.keys:
                keys = [next(people) for _ in range(count)]
                started = time.perf_counter()
                erasure = erase(settings, keys, "attribute_key", bench.spark, bench.instance, incremental_of(settings))
                seconds = time.perf_counter() - started
                history["requests"].append({"keys": count, "seconds": round(seconds, 1),
                                            "seconds_per_key": round(seconds / count, 2), "rows_erased": sum(erasure.rows.values())})
            started = time.perf_counter()
            purged = purge(StateStore(), bench.instance)
            history["purge"] = {"seconds": round(time.perf_counter() - started, 1), "tables": len(purged.vacuumed),
                                "logs_cut": len(purged.log_cut), "waiting": sorted(purged.waiting), "requests_gone": len(purged.gone)}
            results["histories"][str(days)] = history
    save_results("erasure", results)


if __name__ == "__main__":
    main()
