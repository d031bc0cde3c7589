"""benchmarks/report.py renders results.md from the bench's numbers; a part another command measured,
whose numbers this checkout does not have (benchmarks/results/ is not in git), keeps its section."""

import importlib.util
import json
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
_spec = importlib.util.spec_from_file_location("bench_report", BENCHMARKS / "report.py")  # not a package
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def test_a_part_without_its_numbers_keeps_its_section_and_one_with_them_is_rendered_again(tmp_path, monkeypatch):
    results = json.loads((BENCHMARKS / "results.json").read_text())
    old = "\n".join([
        "# Benchmark results", "", "## Empty and quiet runs", "", "stale figures",
        "## A run as a whole process", "", "figures of an earlier measurement", "",
        "## Maintenance", "", "maintenance figures", "",
    ])
    kept = report.sections(old)
    assert kept["A run as a whole process"] == ["## A run as a whole process", "", "figures of an earlier measurement", ""]

    (tmp_path / "maintenance.json").write_text(json.dumps({"files": 42}))
    monkeypatch.setattr(report, "PARTS", (
        ("A run as a whole process", tmp_path / "process.json", lambda numbers: ["## A run as a whole process", "new"]),
        ("Maintenance", tmp_path / "maintenance.json", lambda numbers: ["## Maintenance", f"{numbers['files']} files"]),
        ("Attributes history", tmp_path / "attributes_history.json", lambda numbers: ["## Attributes history"]),
    ))
    text = "\n".join(report.markdown(results, "make bench", kept))
    assert "figures of an earlier measurement" in text  # no process.json here: kept
    assert "42 files" in text and "maintenance figures" not in text  # its numbers are here: rendered again
    assert "stale figures" not in text  # the bench's own sections are always rendered afresh
    assert "## Attributes history" not in text  # neither numbers nor a section to keep


def test_the_warm_workers_first_pairs_are_shown_apart_from_the_pairs_measured():
    figures = {"60_days_warm": {"median_seconds": 6.5, "seconds": [6.4, 6.5, 6.9], "median_daily_seconds": 4.5,
                                "median_with_daily_seconds": 11.0, "first_pairs_with_daily_seconds": [21.9, 11.9]}}
    rows = [line for line in report.launched(figures) if line.startswith("| ")]
    assert rows[1:] == [
        "| one-hour run launched, 60 days of history, warm | 6.50 s (runs: 6.40, 6.50, 6.90) | 10 s or less ✓ |",
        "| the same with its daily run, 60 days of history, warm | 11.00 s (daily run 4.50 s) | 10 s or less ✗ |",
        "| the worker's first pairs after its start, 60 days of history | 21.90 s, 11.90 s | — |",
    ]


def test_an_own_process_s_first_pairs_are_not_called_the_worker_s():
    figures = {"60_days_own_process": {"median_seconds": 14.5, "seconds": [14.4, 14.5, 14.9], "median_daily_seconds": 11.5,
                                       "median_with_daily_seconds": 26.0, "first_pairs_with_daily_seconds": [27.1, 26.3]}}
    rows = [line for line in report.launched(figures) if line.startswith("| ")]
    assert rows[-1] == "| its first pairs, in a new process each, 60 days of history | 27.10 s, 26.30 s | — |"
    assert not any("worker" in row for row in rows)


def test_the_hours_a_section_runs_unmeasured_are_the_bench_s_not_the_report_s():
    median_run = {"seconds": 20.0, "phases": [], "incremental_job steps": {}}
    figures = {"median_seconds": 20.0, "seconds": [20.0], "median_floor_seconds": 7.0, "median_run": median_run}
    measured = {"events_per_day": 20_000, "one_hour_run_whole_process": {"7_days": figures, "60_days": figures},
                "ratio_60_to_7_days": 1.0, "one_hour_run_launched": {}}
    said = lambda numbers: next(line for line in report.whole_process(numbers) if line.startswith("`incremental-assets run`"))
    assert "after 3 hours it does not measure" in said({**measured, "unmeasured_hours": 3})
    assert "after 1 hour it does not measure" in said({**measured, "unmeasured_hours": 1})
    assert "after the hours it does not measure" in said(measured)  # measured before the bench recorded them


def test_each_timed_hour_is_shown_with_the_events_it_loaded_once_the_bench_records_them():
    figures = {"60_days_warm": {"median_seconds": 6.5, "seconds": [6.4, 6.5, 6.9], "events_loaded": [1523, 1611, 98]}}
    assert report.launched(figures)[4] == (
        "| one-hour run launched, 60 days of history, warm (hours of 1,523, 1,611, 98 events) | 6.50 s (runs: 6.40, 6.50, 6.90) "
        "| 10 s or less ✓ |")
    recorded_before = {"60_days_warm": {"median_seconds": 6.5, "seconds": [6.4, 6.5, 6.9]}}
    assert report.launched(recorded_before)[4].startswith("| one-hour run launched, 60 days of history, warm | ")


def test_figures_measured_before_the_benches_timed_a_working_days_hours_say_they_are_night_hours():
    median_run = {"seconds": 20.0, "phases": [], "incremental_job steps": {}}
    night = {"median_seconds": 20.0, "seconds": [20.0], "median_run": median_run}
    measured = {"events_per_day": 20_000, "one_hour_run_whole_process": {"7_days": night}, "ratio_7_to_7_days": 1.0}
    said = lambda numbers: next(line for line in report.whole_process(numbers) if line.startswith("`incremental-assets run`"))
    assert "the first hours after midnight" in said(measured)
    day = {**night, "events_loaded": [1779]}
    assert "after midnight" not in said({**measured, "one_hour_run_whole_process": {"7_days": day}})
