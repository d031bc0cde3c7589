"""Where a process's seconds go, for the bench (benchmarks/process.py): with
INCREMENTAL_ASSETS_TIMINGS set to a file, the command line marks each phase of its process (from
the moment the kernel started it) and writes them there as JSON when it exits. Unset, it costs a
dictionary lookup per mark."""

from __future__ import annotations

import json
import math
import os
import time

TIMINGS_ENV = "INCREMENTAL_ASSETS_TIMINGS"
_marks: list[tuple[str, float]] = []
_details: dict[str, object] = {}


def enabled() -> bool:
    return bool(os.environ.get(TIMINGS_ENV))


def process_started() -> float:
    """The wall-clock moment this process was started (Linux: /proc), to a clock tick."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as system:
        boot = next(int(line.split()[1]) for line in system if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def mark(phase: str) -> None:
    """The end of `phase`: it lasted from the previous mark (or the process's start) to now."""
    if enabled():
        _marks.append((phase, time.time()))


def detail(name: str, value: object) -> None:
    """A figure beside the phases (a run's steps, Spark's jobs)."""
    if enabled():
        _details[name] = value


def write() -> None:
    """The phases as seconds, in order, and the details, to the file TIMINGS_ENV names."""
    if not enabled():
        return
    previous, phases = process_started(), []
    for phase, moment in _marks:
        phases.append([phase, round(moment - previous, 3)])
        previous = moment
    with open(os.environ[TIMINGS_ENV], "w") as out:
        json.dump({"phases": phases, **_details}, out, indent=1)


def finished_jobs(session, after: int = -1) -> list[tuple[int, str, float]]:
    """(job id, name, seconds) of each job of the session's driver after job `after` that has
    finished, from the driver's status store: the record behind its web UI, kept with the UI off
    (a run's default), and cheaper to read than the UI's REST API (benchmarks/comparisons.md). A
    job's name is its description, when it has one (Delta's), then where it was called."""
    jobs = session.sparkContext._jsc.sc().statusStore().jobsList(None)
    finished = []
    for index in range(jobs.size()):
        job = jobs.apply(index)
        submitted, completed, description = job.submissionTime(), job.completionTime(), job.description()
        if job.jobId() > after and submitted.isDefined() and completed.isDefined():
            name = f"{description.get() if description.isDefined() else ''} {job.name()}".strip()
            finished.append((job.jobId(), name, (completed.get().getTime() - submitted.get().getTime()) / 1000))
    return finished


def seconds_by_name(jobs: list[tuple[int, str, float]]) -> dict[str, float]:
    """finished_jobs' seconds summed by the jobs' names (where they were called), largest first."""
    spent: dict[str, float] = {}
    for _, name, seconds in jobs:
        spent[name] = spent.get(name, 0.0) + seconds
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def spark_jobs(session) -> None:
    """Seconds in Spark's jobs, all and by where they were called (nothing from a Spark Connect
    client, whose driver is the server's)."""
    from pyspark.errors import PySparkAttributeError

    if not enabled():
        return
    try:
        session.sparkContext
    except PySparkAttributeError:  # a Spark Connect session: its jobs run in the server
        return
    jobs = finished_jobs(session)
    by_site = seconds_by_name(jobs)
    detail("spark_jobs", len(jobs))
    # fsum: the same total whatever the order the jobs are added in (by site, or one by one)
    detail("spark_jobs_seconds", round(math.fsum(seconds for _, _, seconds in jobs), 2))
    # Delta's own jobs: a table's snapshot rebuilt from its log, and the files a query may read.
    detail("delta_log_jobs_seconds", round(sum(v for k, v in by_site.items() if k.startswith("Delta:")), 2))
    detail("spark_jobs_by_call_site", {k: round(v, 2) for k, v in by_site.items()})
