"""Local disk against an object store, side by side: the same history in a local warehouse and in a
bucket of moto's S3 server on 127.0.0.1 (tests/s3_server.py), then one-hour runs as whole processes,
alternating between the two, and a window of about a million events processed by one run (a whole
process) on each.

moto's server is a Python process on this machine: it shows what the S3 API's requests cost the
project's runs (listings, Delta log reads, conditional commits), not a remote store's latency.

    .venv/bin/python benchmarks/object_store.py [--events-per-day N] [--days 3] [--reps 3] [--window-events 1000000]

Writes benchmarks/results/object_store.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from measure import RESULTS
from process import CLI, history, one_hour_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3_server import BUCKET, s3_server  # noqa: E402

STORES = ("local", "s3")


def warehouse(store: str, root: Path, name: str) -> str:
    return f"s3a://{BUCKET}/{name}" if store == "s3" else str(root / store / name)


def big_window(env: dict[str, str], events: int) -> dict:
    """About `events` events over ten days, loaded and never processed, then one run over them all."""
    per_day = events // 10
    start = date.today() - timedelta(days=13)
    settings = Path(env["INCREMENTAL_ASSETS_CONFIG"])
    settings.write_text(f"start_date: '{start}'\nbackfill_limit_days: 400\n")
    subprocess.run([CLI, "generate", "--users", str(max(40, per_day // 50)), "--days", "10", "--events-per-day", str(per_day),
                    "--start-date", str(start), "--seed", "5"], env=env, check=True, capture_output=True)
    started = time.perf_counter()
    done = subprocess.run([CLI, "run"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"run failed:\n{done.stdout}\n{done.stderr}")
    return {"seconds": round(seconds, 2), "said": next(line for line in done.stdout.splitlines() if "events this run" in line)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events-per-day", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window-events", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-object-store-") as tmp, s3_server() as s3:
        root = Path(tmp)
        envs = {}
        for store in STORES:
            aws = s3 if store == "s3" else {}
            envs[store] = history(root / store, args.days, args.events_per_day, warehouse(store, root, "history"), aws)
        runs: dict[str, list[dict]] = {store: [] for store in STORES}
        for rep in range(args.reps):
            for store, env in envs.items():
                runs[store].append(one_hour_run(env, root / f"timings-{store}-{rep}.json", floor=False))
        windows = {}
        for store, env in envs.items():
            (root / store / "window").mkdir()
            window_env = {**env, "INCREMENTAL_ASSETS_WAREHOUSE": warehouse(store, root, "window"),
                          "INCREMENTAL_ASSETS_CONFIG": str(root / store / "window" / "settings.yaml"),
                          "DAGSTER_HOME": str(root / store / "window" / "dagster_home")}
            windows[store] = big_window(window_env, args.window_events)
    results = {
        "measured_at": date.today().isoformat(),
        "events_per_day": args.events_per_day, "days": args.days, "window_events": args.window_events,
        "one_hour_run_whole_process": {
            store: {"median_seconds": round(statistics.median(r["seconds"] for r in rs), 2), "seconds": [r["seconds"] for r in rs]}
            for store, rs in runs.items()
        },
        "big_window_run": windows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "object_store.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
