"""attributes_history on the bench's longest history, in one process and one Spark session: what it
costs beside `attributes` (built whole by the history's backfill, then kept by one-hour runs), how
many rows it holds per key, and a point-in-time lookup of many (key, timestamp) examples.

    .venv/bin/python benchmarks/history.py [--days 90] [--events-per-day 20000] [--lookups 100000] [--reps 3] [--conditions TEXT]

Writes benchmarks/results/attributes_history.json (make bench adds it to results.md).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench import Bench, median
from deltalake import DeltaTable
from measure import save_results

from incremental_assets.lib import environment
from incremental_assets.lib.catalog import ATTRIBUTES, ATTRIBUTES_HISTORY
from incremental_assets.lib.sample.stream import append_hours, read_stream_state
from incremental_assets.lib.transforms.daily import as_of_day_before

def daily_step(summary, step: str) -> float:
    """Seconds the runs' daily runs spent in `step`."""
    return round(sum(run.step_seconds.get(step, 0.0) for run in summary.daily_runs), 2)


def lookup_seconds(bench: Bench, keys: list[str], first: datetime, last: datetime, rows: int) -> tuple[float, int]:
    """`rows` examples (a key, 1 % never seen, and a moment between `first` and `last`) looked up in the
    history, the result written to Spark's no-op sink: seconds, and rows out."""
    pick = random.Random(7)
    span = (last - first).total_seconds()
    examples = [
        (i, pick.choice(keys) if pick.random() > 0.01 else f"unseen-{i}", first + timedelta(seconds=pick.random() * span))
        for i in range(rows)
    ]
    frame = bench.spark.createDataFrame(examples, "example long, user string, at timestamp").cache()
    frame.count()
    history = bench.spark.read.format("delta").load(environment.table_uri(ATTRIBUTES_HISTORY))
    looked = as_of_day_before(frame, history, key="user", at="at")
    started = time.perf_counter()
    looked.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    out = looked.count()
    frame.unpersist()
    return round(seconds, 2), out


def measure(bench: Bench, days: int, events_per_day: int, lookups: int) -> dict:
    source, params = bench.stream(f"history-{days}", days, events_per_day)
    settings = bench.settings(params)
    _, backfill = bench.run(settings, source)  # the history's backfill: attributes_history built whole
    table = DeltaTable(environment.table_uri(ATTRIBUTES_HISTORY)).to_pyarrow_table(columns=["attribute_key"])
    keys = sorted(set(table.column("attribute_key").to_pylist()))
    hours = []
    for _ in range(bench.reps):
        append_hours(bench.spark, source, 1)
        _, summary = bench.run(settings, source)
        hours.append({step: daily_step(summary, step) for step in (ATTRIBUTES, ATTRIBUTES_HISTORY)})
    _, loaded_until = read_stream_state(source)
    first = datetime.combine(params.start_date, datetime.min.time())
    looked = [lookup_seconds(bench, keys, first, loaded_until, lookups) for _ in range(bench.reps)]
    rows = DeltaTable(environment.table_uri(ATTRIBUTES_HISTORY)).count()
    return {
        "days_of_history": days,
        "events_per_day": events_per_day,
        "keys": len(keys),
        "history_rows": rows,
        "rows_per_key": round(rows / len(keys), 2),
        "built_whole": {step: daily_step(backfill, step) for step in (ATTRIBUTES, ATTRIBUTES_HISTORY)},
        "one_hour_runs": hours,
        "one_hour_median": {step: median([h[step] for h in hours]) for step in (ATTRIBUTES, ATTRIBUTES_HISTORY)},
        "lookup_rows": lookups,
        "lookup_rows_out": [out for _, out in looked],
        "lookup_seconds": [seconds for seconds, _ in looked],
        "lookup_median_seconds": median([seconds for seconds, _ in looked]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--events-per-day", type=int, default=20_000)
    parser.add_argument("--lookups", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--conditions", default="", help="what else the machine ran meanwhile, shown with the figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="incremental-assets-history-") as root:
        result = {
            "measured_at": datetime.now().isoformat(timespec="seconds"),
            "command": f"benchmarks/history.py --days {args.days} --events-per-day {args.events_per_day} "
                       f"--lookups {args.lookups} --reps {args.reps}",
            "conditions": args.conditions,
            **measure(Bench(Path(root), args.reps), args.days, args.events_per_day, args.lookups),
        }
    save_results("attributes_history", result)


if __name__ == "__main__":
    main()
