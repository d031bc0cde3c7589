"""benchmarks/results.md and its two charts, from the numbers `make bench` writes to results.json.

    .venv/bin/python benchmarks/report.py [results.json] [--out benchmarks/]

bench.py calls write_report after every bench; run this alone to render a results.json again.
Adds the parts other commands measure (PARTS: `make bench-process`, `make bench-object-store`,
`make bench-maintenance`, `make bench-history`) from their numbers in benchmarks/results/ when they
are there; a part whose numbers are not (that folder is not in git) keeps its section as results.md
has it. Comparisons measured by hand, before and after a change, live in comparisons.md.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

matplotlib.use("Agg")  # PNG files, no display
HERE = Path(__file__).parent
MAINTENANCE = HERE / "results" / "maintenance.json"
PROCESS = HERE / "results" / "process.json"
PROCESS_SITE = HERE / "results" / "process-site.json"
SITE_TITLE = "A run as a whole process, at a real site's shape"
OBJECT_STORE = HERE / "results" / "object_store.json"
HISTORY = HERE / "results" / "attributes_history.json"
ERASURE = HERE / "results" / "erasure.json"
TOP = 5  # rows of a "where the time goes" table

# The project's performance targets, marked met or not beside each figure.
PROCESS_RUN_MAX_SECONDS = 10.0
PROCESS_HISTORY_MAX_RATIO = 1.2
EMPTY_RUN_MAX_SECONDS = 1.0
QUIET_RUN_MAX_SECONDS = 2.0
BIG_WINDOW_MAX_RATIO_TO_FLOOR = 3.0
BACKFILL_MIN_EVENTS_PER_SECOND = 75_000


def write_report(results: dict, command: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    cost_vs_window(results, out_dir / "cost_vs_window.png")
    cost_vs_history(results, out_dir / "cost_vs_history.png")
    report = out_dir / "results.md"
    kept = sections(report.read_text()) if report.exists() else {}
    report.write_text("\n".join(markdown(results, command, kept)) + "\n")


def sections(text: str) -> dict[str, list[str]]:
    """A results.md's sections by title, each its lines from its title on."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = found.setdefault(line[3:], [])
        if current is not None:
            current.append(line)
    return found


def measured_again(results: dict) -> str:
    """The parts measured again since (`make bench BENCH_ONLY=part`), and when."""
    again = results.get("measured_again") or {}
    return "".join(f"; `{part}` again on {m['measured_at']} ({m['reps']} repetitions)" for part, m in again.items())


def histories(results: dict) -> dict[int, dict]:
    found = results["steady_state"]["histories"]
    return {days: found[f"{days}_days"] for days in results["size"]["histories"]}


def markdown(results: dict, command: str, kept: dict[str, list[str]] | None = None) -> list[str]:
    size, steady = results["size"], results["steady_state"]
    days = histories(results)
    first, last = size["histories"][0], size["histories"][-1]
    window, backfill = results["big_window"], results["first_backfill"]
    lines = [
        "# Benchmark results",
        "",
        f"Command: `{command}`  ",
        f"Machine: {results['machine']}  ",
        f"Measured: {results['measured_at']}{measured_again(results)}  ",
        f"Engine: {results['engine']} (other pairs measured against it: [engine.md](engine.md))  ",
        (
            f"Size: {size['name']}: {size['events_per_day']:,} events a day, histories of "
            f"{', '.join(map(str, days))} days, {size['reps']} repetitions (medians)  "
        ),
        (
            "Targets: the project's performance targets (✓ met, ✗ not). "
            "Every number, with Spark's jobs by call site: [results.json](results.json). "
            "Changes measured side by side, before and after: [comparisons.md](comparisons.md)."
        ),
        "",
        "![Run time against the new events in the run](cost_vs_window.png)",
        "![Run time against days of history](cost_vs_history.png)",
        "",
    ]

    def section(title: str, why: str, rows: list[tuple[str, str, str]]) -> None:
        lines.extend([f"## {title}", "", why, "", "| figure | value | target | command |", "|---|---|---|---|"])
        lines.extend(f"| {figure} | {value} | {target or '—'} | `{command}` |" for figure, value, target in rows)
        lines.append("")

    def where_the_time_goes(title: str, steps: dict[str, float]) -> None:
        ranked = sorted(step_names(steps).items(), key=lambda item: -item[1])
        lines.extend([f"{title}:", "", "| step | seconds |", "|---|---|"])
        lines.extend(f"| {name} | {value:.2f} |" for name, value in ranked[:TOP])
        if rest := ranked[TOP:]:
            lines.append(f"| the other {len(rest)} steps | {sum(value for _, value in rest):.2f} |")
        lines.append("")

    def largest_spark_jobs(jobs: dict[str, float]) -> None:
        lines.extend(["Its largest Spark jobs, by call site:", "", "| Spark job | seconds |", "|---|---|"])
        lines.extend(f"| `{name}` | {value:.2f} |" for name, value in list(jobs.items())[:TOP])
        lines.append("")

    rows = []
    for d, h in days.items():
        empty = h["empty_run_seconds"]
        rows.append((f"empty run, {d} days of history", s(empty),
                     target(f"under {EMPTY_RUN_MAX_SECONDS:g} s", empty < EMPTY_RUN_MAX_SECONDS)))
        quiet = h["quiet_run_seconds"]
        rows.append((f"quiet run, {d} days of history", s(quiet),
                     target(f"{QUIET_RUN_MAX_SECONDS:g} s or less", quiet <= QUIET_RUN_MAX_SECONDS)))
    for name in ("empty", "quiet"):
        p = days[last][f"{name}_run_where_the_time_goes"]
        rows.append((f"{name} run, {last} days: in Spark jobs / outside them",
                     f"{p['spark_jobs_seconds']:.2f} / {p['outside_spark_jobs_seconds']:.2f} s", ""))
    section(
        "Empty and quiet runs",
        "With nothing new loaded: an empty run (same 'now') finds every asset there and reads nothing; "
        "a quiet run (the first after the history's backfill, at a later 'now') finds the source as the last run "
        "assessed it and nothing past the assets' positions: it reads nothing and moves them on.",
        rows,
    )
    where_the_time_goes(f"Where the quiet run's time goes, {last} days of history",
                        days[last]["quiet_run_where_the_time_goes"]["steps"])

    rows = []
    for d, h in days.items():
        rows.append((f"one-hour run, {d} days of history ({h['new_events_per_hour']:,} new events)",
                     f"{s(h['one_hour_run_seconds'])}, of which daily runs {s(h['of_which_daily_runs_seconds'])}", ""))
        rows.append((f"its floor, {d} days of history", s(h["one_hour_floor_seconds"]), ""))
    rows.append((f"one-hour run, {last} / {first} days of history", f"{steady[f'ratio_{last}_to_{first}_days']:.2f}x",
                 "should not grow with history"))
    for table, m in steady["merge_scope"].items():
        since = f" (from {m['merge_target_floor']})" if m["merge_target_floor"] else ""
        rows.append((f"MERGE into `{table}` after {last} days: files it may read / all",
                     f"{m['files_in_merge_scope']} / {m['files_in_table']}{since}", ""))
    section(
        "One-hour runs",
        "One incremental run over one new hour of loads (its daily runs included), against the plain-Spark "
        "floor: the same rows read and appended once to a Delta table.",
        rows,
    )
    where_the_time_goes(f"Where the one-hour run's time goes, {last} days of history", days[last]["one_hour_steps"])

    ratio = window["ratio_to_floor"]
    section(
        "Big window",
        "One run over two days of loads, against its floor and the dedupe floor (the same rows deduplicated "
        "on event_id into event_date partitions with plain Spark: filtered_events' bare write).",
        [
            (f"run over {window['new_events']:,} new events", runs(window["run_seconds"], window["runs_seconds"]), ""),
            ("of which its daily runs", s(window["of_which_daily_runs_seconds"]), ""),
            ("floor", s(window["floor_seconds"]), ""),
            ("run / floor", f"{ratio:.2f}x",
             target(f"{BIG_WINDOW_MAX_RATIO_TO_FLOOR:g}x or less", ratio <= BIG_WINDOW_MAX_RATIO_TO_FLOOR)),
            ("run without its daily runs / floor", f"{window['incremental_run_ratio_to_floor']:.2f}x", ""),
            ("dedupe floor", s(window["dedupe_floor_seconds"]), ""),
            ("dedupe floor / floor", f"{window['dedupe_floor_ratio_to_floor']:.2f}x", ""),
        ],
    )
    where_the_time_goes("Where the big window's time goes (the median run)", window["steps"])
    largest_spark_jobs(window["largest_spark_jobs"])

    speed = backfill["events_per_second"]
    section(
        "First backfill",
        "The whole pipeline (the incremental run and its daily runs) over a 30-day stream, from an empty warehouse.",
        [
            (f"first backfill of {backfill['source_events']:,} events",
             runs(backfill["seconds"], backfill["runs_seconds"]), ""),
            ("events per second", f"{speed:,}",
             target(f"{BACKFILL_MIN_EVENTS_PER_SECOND:,} or more", speed >= BACKFILL_MIN_EVENTS_PER_SECOND)),
        ],
    )
    where_the_time_goes("Where the first backfill's time goes (the median run)", backfill["steps"])
    largest_spark_jobs(backfill["largest_spark_jobs"])

    section(
        "Daily layer",
        "Daily aggregates recomputed on the first backfill's warehouse: one partition, and 30 days in one run.",
        [
            ("one daily partition", s(backfill["daily_one_partition_seconds"]), ""),
            ("30-day backfill in one run", s(backfill["daily_thirty_day_backfill_seconds"]), ""),
        ],
    )
    section(
        "Memory",
        "Peak resident memory over the whole bench: its Spark JVM (driver and local executors) and its Python process.",
        [
            ("Spark JVM", f"{results['memory']['jvm_peak_mb']:,} MB", ""),
            ("Python", f"{results['memory']['python_peak_mb']:,} MB", ""),
        ],
    )
    section(
        "Spark start",
        "A cold Spark start with Delta in a fresh process: the floor under every run in its own process.",
        [("cold Spark start with Delta", s(results["spark_start_seconds"]), "")],
    )
    for title, numbers, render in PARTS:
        if numbers.exists():
            lines.extend(render(json.loads(numbers.read_text())))
        elif title in (kept or {}):
            lines.extend(kept[title])
    return lines


def attributes_history(h: dict) -> list[str]:
    built, hour = h["built_whole"], h["one_hour_median"]
    hours = h["one_hour_runs"]
    return [
        "## Attributes history",
        "",
        f"Measured {h['measured_at']}, in one Spark session: {h['days_of_history']} days of "
        f"{h['events_per_day']:,} events a day ({h['keys']:,} keys). The history's backfill builds "
        "`attributes_history` whole; each one-hour run after it keeps it (the daily run's step beside "
        "`attributes`'s); a point-in-time lookup gives each example the values of the day before it. "
        f"Command: `.venv/bin/python {h['command']}`.{' ' + h['conditions'] if h.get('conditions') else ''}",
        "",
        "| figure | value |",
        "|---|---|",
        f"| rows per key over {h['days_of_history']} days | {h['rows_per_key']:.2f} ({h['history_rows']:,} rows) |",
        f"| built whole: `attributes_history` / `attributes` | {s(built['attributes_history'])} / {s(built['attributes'])} |",
        f"| one-hour run: `attributes_history` / `attributes` | {runs(hour['attributes_history'], [r['attributes_history'] for r in hours])}"
        f" / {runs(hour['attributes'], [r['attributes'] for r in hours])} |",
        f"| lookup of {h['lookup_rows']:,} examples | {runs(h['lookup_median_seconds'], h['lookup_seconds'])}, "
        f"{h['lookup_rows_out'][0]:,} rows out |",
        "",
    ]


def object_store(o: dict) -> list[str]:
    """The same runs on local disk and on moto's S3 server, side by side."""
    hour, window = o["one_hour_run_whole_process"], o["big_window_run"]
    command = (f".venv/bin/python benchmarks/object_store.py --events-per-day {o['events_per_day']} --days {o['days']} "
               f"--reps {len(hour['local']['seconds'])} --window-events {o['window_events']}")
    rows = [(f"one-hour run as a process, {o['days']} days of history", runs(hour[store]["median_seconds"], hour[store]["seconds"]))
            for store in ("local", "s3")]
    rows += [(f"one run over {o['window_events']:,} loaded events (ten days)", s(window[store]["seconds"])) for store in ("local", "s3")]
    return [
        "## Local disk and an object store, side by side",
        "",
        (f"Measured {o['measured_at']}. The same runs with the warehouse (and its source) in a local folder and in a "
         "bucket of moto's S3 server on 127.0.0.1: the one-hour runs alternating between the two, then the big window on "
         "each. They show the cost of the S3 API's requests (listings, Delta log reads, conditional commits), not a "
         f"remote store's latency. Command: `{command}`."),
        "",
        "| figure | local disk | S3 (moto) |",
        "|---|---|---|",
        *(f"| {rows[i][0]} | {rows[i][1]} | {rows[i + 1][1]} |" for i in (0, 2)),
        "",
    ]


def whole_process(p: dict) -> list[str]:
    """One-hour runs as whole processes, and where the median run's seconds went."""
    histories = p["one_hour_run_whole_process"]
    site = p.get("shape") == "site"
    command = f".venv/bin/python benchmarks/process.py --events-per-day {p['events_per_day']}{' --shape site' if site else ''} --histories " + " ".join(
        name.removesuffix("_days") for name in histories) + (" --no-launched" if not p.get("one_hour_run_launched") else "") + (
        " --before DIR" if "before" in p else "")
    ratio_key = next(key for key in p if key.startswith("ratio_"))
    rows = [(f"one-hour run as a process, {name.replace('_', ' ')} of history{hours_loaded(h)}",
             runs(h["median_seconds"], h["seconds"]),
             target(f"{PROCESS_RUN_MAX_SECONDS:g} s or less", h["median_seconds"] <= PROCESS_RUN_MAX_SECONDS))
            for name, h in histories.items()]
    rows.extend((f"its floor as a process, {name.replace('_', ' ')} of history", f"{h['median_floor_seconds']:.2f} s", "—")
                for name, h in histories.items() if "median_floor_seconds" in h)
    rows.append((ratio_key.removeprefix("ratio_").replace("_to_", " / ").replace("_", " "), f"{p[ratio_key]:.2f}x",
                 target(f"{PROCESS_HISTORY_MAX_RATIO:g}x or less", p[ratio_key] <= PROCESS_HISTORY_MAX_RATIO)))
    earlier = p.get("before", {}).get("one_hour_run_whole_process", {})
    for name, h in histories.items():
        if "median_history_step_seconds" in h:
            then = earlier.get(name, {}).get("median_history_step_seconds")
            rows.append((f"its `attributes_history` step, {name.replace('_', ' ')} of history",
                         s(h["median_history_step_seconds"]) + (f" (before: {s(then)})" if then is not None else ""), "—"))
        if name in earlier:
            rows.append((f"the same run before ({p['before']['code']}), {name.replace('_', ' ')} of history",
                         runs(earlier[name]["median_seconds"], earlier[name]["seconds"]), "—"))
    shape = (f"{p['events_per_day']:,} events a day from {p['users']:,} users" if "users" in p
             else f"{p['events_per_day']:,} events a day")
    lines = [
        f"## {SITE_TITLE if site else 'A run as a whole process'}",
        "",
        (f"`incremental-assets run` over one new hour of loads ({shape}), timed from outside: "
         "what a schedule tick or the daemon's run launcher pays, since each run is a fresh process. Its floor, timed "
         "right after it: a fresh Python process that starts the session the run's first Spark step starts, reads the "
         "same hour's source rows, appends them once to a Delta table with plain Spark and exits (no Dagster, no state). "
         "Every section below (and the earlier code's runs, with --before) runs on its own copy of the same history, "
         f"over the same hours, after {_unmeasured(p)} it does not measure{_night(histories)}. "
         f"Command: `{command}`" + (f", measured {p['measured']}" if "measured" in p else "") + ". "
         "The floor moves with the machine: read a run's seconds against the floor measured beside it."),
        "",
        "| figure | value | target |",
        "|---|---|---|",
        *(f"| {figure} | {value} | {goal} |" for figure, value, goal in rows),
        "",
    ]
    lines.extend(launched(p.get("one_hour_run_launched", {})))
    for name, h in histories.items():
        run = h["median_run"]
        jobs = (f"; Spark's jobs {run['spark_jobs_seconds']:.2f} s in {run['spark_jobs']}, of which Delta's log and "
                f"file listing {run['delta_log_jobs_seconds']:.2f} s" if "spark_jobs" in run else "; Spark's jobs not listed")
        lines.extend([f"Where the median run's seconds go, {name.replace('_', ' ')} of history ({run['seconds']:.2f} s{jobs}):", "",
                      "| phase | seconds |", "|---|---|"])
        lines.extend(f"| {phase} | {seconds:.2f} |" for phase, seconds in run["phases"])
        steps = sorted(step_names(run["incremental_job steps"]).items(), key=lambda item: -item[1])[:TOP]
        lines.extend(["", "Its incremental job's slowest steps:", "", "| step | seconds |", "|---|---|"])
        lines.extend(f"| {step} | {seconds:.2f} |" for step, seconds in steps)
        lines.append("")
    return lines


def hours_loaded(h: dict) -> str:
    """The events each timed hour loaded, as the bench recorded them (none before it did)."""
    events = [n for n in h.get("events_loaded", []) if n is not None]
    return f" (hours of {', '.join(f'{n:,}' for n in events)} events)" if events else ""


def _night(histories: dict) -> str:
    """The note on figures measured before the benches recorded each timed hour's events: those
    timed the hours after midnight."""
    if any(h.get("events_loaded") for h in histories.values()):
        return ""
    return (" (measured before the benches timed a working day's hours: these are the first hours after midnight, "
            "when the sample's people are not active and an hour loads a small part of a daytime hour's events)")


def _unmeasured(p: dict) -> str:
    """The hours each section ran first without measuring them, as the bench recorded them."""
    hours = p.get("unmeasured_hours")
    return "the hours" if hours is None else f"{hours} hour{'' if hours == 1 else 's'}"


def launched(figures: dict) -> list[str]:
    """The same one-hour run launched through the instance: in its own process, and in the warm worker."""
    if not figures:
        return []
    rows = []
    for name, h in figures.items():
        days, how = name.split("_days_")
        meets = how == "warm" and h["median_seconds"] <= PROCESS_RUN_MAX_SECONDS
        rows.append((f"one-hour run launched, {days} days of history, {how.replace('_', ' ')}{hours_loaded(h)}",
                     runs(h["median_seconds"], h["seconds"]), target(f"{PROCESS_RUN_MAX_SECONDS:g} s or less", meets) if how == "warm" else "—"))
        if "median_with_daily_seconds" in h:
            both = h["median_with_daily_seconds"]
            rows.append((f"the same with its daily run, {days} days of history, {how.replace('_', ' ')}",
                         f"{both:.2f} s (daily run {h['median_daily_seconds']:.2f} s)",
                         target(f"{PROCESS_RUN_MAX_SECONDS:g} s or less", both <= PROCESS_RUN_MAX_SECONDS) if how == "warm" else "—"))
        if "first_pairs_with_daily_seconds" in h:
            first = "the worker's first pairs after its start" if how == "warm" else "its first pairs, in a new process each"
            rows.append((f"{first}, {days} days of history",
                         ", ".join(f"{seconds:.2f} s" for seconds in h["first_pairs_with_daily_seconds"]), "—"))
    warmed = ("after its rehearsal; each way after its first pairs, shown apart" if any("first_pairs_with_daily_seconds" in h for h in figures.values())
              else "after its rehearsal")
    return [
        ("Launched through the instance as a sensor tick or the UI launches it (`dagster job launch`), in a process "
         f"of its own and in the warm worker (`incremental-assets serve`, {warmed}), timed from the run's "
         "creation to its end in the run records: the incremental job, then the daily run its days call for (what the "
         "daily sensor requests; the sensor's interval between the two is not counted):"),
        "",
        "| figure | value | target |",
        "|---|---|---|",
        *(f"| {figure} | {value} | {goal} |" for figure, value, goal in rows),
        "",
    ]


def maintenance(m: dict) -> list[str]:
    """The maintenance pass's files and read times, before and after."""
    command = f".venv/bin/python benchmarks/maintenance.py --runs {m['small_runs']} --events-per-day {m['events_per_day']}"
    rows = [("files, all tables", m["total_files"]["before"], m["total_files"]["after"])]
    for table, files in m["files_before"].items():
        rows.append((f"files of `{table}`", files, m["files_after"].get(table, "—")))
    for read, seconds in m["reads_seconds_before"].items():
        rows.append((f"{read.replace('_', ' ')} (s)", seconds, m["reads_seconds_after"][read]))
    changed = [table for table, same in m["same_rows_after_maintenance"].items() if not same]
    return [
        "## Maintenance",
        "",
        (
            f"What {m['small_runs']} one-hour runs on a week of history leave behind ({m['small_runs_seconds']} s), "
            f"and what `maintenance_job` ({m['maintenance_job_seconds']} s) makes of it; reads are medians of 3. "
            f"Command: `{command}`."
        ),
        "",
        "| figure | before | after |",
        "|---|---|---|",
        *(f"| {figure} | {before} | {after} |" for figure, before, after in rows),
        "",
        "Same rows after maintenance: " + ("every table." if not changed else f"**not** in {', '.join(changed)}."),
        "",
    ]


def _purged(purge: dict | None) -> str:
    if purge is None:
        return "—"
    waiting = f"; waiting: {', '.join(purge['waiting'])}" if purge["waiting"] else ""
    return f"{purge['seconds']} ({purge['tables']}, {purge.get('logs_cut', '?')}{waiting})"


def erasure(e: dict) -> list[str]:
    """Seconds per forget request against the warehouse's size."""
    keys = sorted({request["keys"] for history in e["histories"].values() for request in history["requests"]})
    command = (f".venv/bin/python benchmarks/erasure.py --events-per-day {e['events_per_day']} --histories "
               + " ".join(e["histories"]) + " --keys " + " ".join(map(str, keys)))
    header = ["days of history", "filtered_events rows", "attributes_history rows",
              *(f"{n} key{'s' if n > 1 else ''}: s (s per key)" for n in keys), "purge: s (tables vacuumed, logs cut)"]
    rows = []
    for days, history in e["histories"].items():
        timed = {request["keys"]: f"{request['seconds']} ({request['seconds_per_key']})" for request in history["requests"]}
        rows.append([days, f"{history['rows_before']['filtered_events']:,}", f"{history['rows_before']['attributes_history']:,}",
                     *(timed.get(n, "—") for n in keys), _purged(history.get("purge"))])
    return [
        "## Erasure",
        "",
        (f"`forget` of people never forgotten before, as the command runs it (resolve, delete from every table, recount, "
         f"audit), then `forget --purge` of them all (every table vacuumed of the files its current version does not read, its log cut there), "
         f"at a real site's shape ({e['events_per_day']:,} events a day). Command: `{command}`."),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(map(str, row)) + " |" for row in rows),
        "",
    ]


# The parts other commands measure, by their section's title: rendered from their numbers when
# there, else kept as results.md has them.
PARTS = (
    ("A run as a whole process", PROCESS, whole_process),
    (SITE_TITLE, PROCESS_SITE, whole_process),
    ("Local disk and an object store, side by side", OBJECT_STORE, object_store),
    ("Maintenance", MAINTENANCE, maintenance),
    ("Attributes history", HISTORY, attributes_history),
    ("Erasure", ERASURE, erasure),
)


def step_names(steps: dict[str, float]) -> dict[str, float]:
    """Dagster's step keys as a person reads them. An asset check's key is its asset's and its own
    name (it runs after its asset, so after it here); a freshness check's ends in a hash."""
    named, assets = {}, []
    for key, seconds in steps.items():
        asset = max((a for a in assets if key.startswith(a + "_")), key=len, default=None)
        if asset:
            rest = key.removeprefix(asset + "_")
            name = f"`{asset}` " + ("checks" if rest == "checks" else f"check: {rest.replace('_', ' ')}")
        elif re.search(r"_[0-9a-f]{8}$", key):
            name = key[:-9].replace("_", " ")
        else:
            assets.append(key)
            name = f"`{key}`"
        named[name] = seconds
    return named


def s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def runs(median: float, each: list[float]) -> str:
    return f"{s(median)} (runs: {', '.join(f'{value:.2f}' for value in each)})"


def target(text: str, met: bool) -> str:
    return f"{text} {'✓' if met else '✗'}"


def cost_vs_window(results: dict, path: Path) -> None:
    """A run's seconds against the new events it finds: nothing new, one hour, the big window, the backfill."""
    days, window, backfill = histories(results).values(), results["big_window"], results["first_backfill"]
    series = {
        "empty run": [(0, h["empty_run_seconds"]) for h in days],
        "quiet run": [(0, h["quiet_run_seconds"]) for h in days],
        "one-hour run": [(h["new_events_per_hour"], h["one_hour_run_seconds"]) for h in days],
        "big window": [(window["new_events"], window["run_seconds"])],
        "first backfill": [(backfill["source_events"], backfill["seconds"])],
        "plain-Spark floor": [(h["new_events_per_hour"], h["one_hour_floor_seconds"]) for h in days]
        + [(window["new_events"], window["floor_seconds"])],
    }
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, points in series.items():
        ax.scatter(*zip(*points), label=label, marker="x" if "floor" in label else "o")
    ax.set_xscale("symlog", linthresh=10)  # log, with room for the runs that find nothing
    ax.set_xlim(left=-3)
    ax.set_ylim(bottom=0)
    ax.set(xlabel="new events in the run (0, then log scale)", ylabel="run time (s)",
           title=f"Run time against window size ({results['size']['name']} bench)")
    save(fig, ax, path)


def cost_vs_history(results: dict, path: Path) -> None:
    """Empty, quiet and one-hour runs (and the hour's floor) against days of history."""
    days = histories(results)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, key in (("one-hour run", "one_hour_run_seconds"), ("quiet run", "quiet_run_seconds"),
                       ("empty run", "empty_run_seconds"), ("one hour's plain-Spark floor", "one_hour_floor_seconds")):
        ax.plot(list(days), [h[key] for h in days.values()], marker="o", label=label)
    ax.set_xticks(list(days))
    ax.set_ylim(bottom=0)
    ax.set(xlabel="days of history before the run", ylabel="run time (s)",
           title=f"Run time against history ({results['size']['events_per_day']:,} events a day)")
    save(fig, ax, path)


def save(fig, ax, path: Path) -> None:
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=HERE / "results.json")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.md and the charts go")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    size = results["size"]["name"]
    write_report(results, "make bench" + ("" if size == "small" else f" BENCH_SIZE={size}"), args.out)
    print(f"wrote {args.out / 'results.md'} and its charts")


if __name__ == "__main__":
    main()
