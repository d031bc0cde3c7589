"""Spark's record of the jobs a process ran, as the bench reads it (lib/timings.py): from the
driver's status store, with its web UI off as in a user's run. Finding: the benches read it from
the UI's REST API, which has been off by default since the driver listens on 127.0.0.1 only:
`make bench` failed at its first profiled run, and `make bench-process` timed its runs with the UI
on and a listing of most of a second that a user's run does not pay."""

import inspect
import time

from incremental_assets.lib import timings


def test_the_jobs_after_a_mark_are_read_with_the_ui_off_by_name_and_seconds(spark):
    assert spark.sparkContext.uiWebUrl is None, "the test session's UI is off, as a run's"
    mark = max((job_id for job_id, _, _ in timings.finished_jobs(spark)), default=-1)
    started = time.perf_counter()
    spark.sparkContext.setJobDescription("Delta: a described job")
    try:
        lines = [inspect.currentframe().f_lineno + 1]
        spark.range(3).collect()
    finally:
        spark.sparkContext.setJobDescription(None)
    lines.append(inspect.currentframe().f_lineno + 1)
    spark.range(4).collect()
    took = time.perf_counter() - started
    jobs = timings.finished_jobs(spark, after=mark)
    assert [job_id > mark for job_id, _, _ in jobs] == [True, True]
    names = sorted(name for _, name, _ in jobs)
    assert names[0].startswith("Delta: a described job collect at ") and names[1].startswith("collect at "), names
    assert all(name.rpartition("/")[2] in (f"test_spark_jobs.py:{line}" for line in lines) for name in names), names
    assert all(0 <= seconds <= took for _, _, seconds in jobs)


def test_a_process_reports_its_jobs_by_call_site(spark, tmp_path, monkeypatch):
    monkeypatch.setenv(timings.TIMINGS_ENV, str(tmp_path / "timings.json"))
    monkeypatch.setattr(timings, "_details", {})
    line = inspect.currentframe().f_lineno + 1
    spark.range(5).collect()
    timings.spark_jobs(spark)
    details = timings._details
    every = timings.finished_jobs(spark)
    assert details["spark_jobs"] == len(every) > 0
    assert details["spark_jobs_seconds"] == round(sum(seconds for _, _, seconds in every), 2)
    by_site = details["spark_jobs_by_call_site"]
    assert abs(sum(by_site.values()) - details["spark_jobs_seconds"]) <= 0.005 * (len(by_site) + 1)
    assert any(site.startswith("collect at ") and site.endswith(f"test_spark_jobs.py:{line}") for site in by_site), by_site
