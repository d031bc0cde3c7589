"""The phases a process reports to the bench: each lasts from the previous mark to its own, the
first from the process's start, so they add up to the process's life so far."""

import json
import time

import pytest

from incremental_assets.lib import timings


def test_marks_are_consecutive_phases_from_the_process_start(tmp_path, monkeypatch):
    out = tmp_path / "timings.json"
    monkeypatch.setenv(timings.TIMINGS_ENV, str(out))
    monkeypatch.setattr(timings, "_marks", [])
    monkeypatch.setattr(timings, "_details", {})
    timings.mark("first")
    time.sleep(0.2)
    timings.mark("second")
    timings.detail("steps", {"a": 1.5})
    timings.write()
    written = json.loads(out.read_text())
    (first, since_start), (second, slept) = written["phases"]
    assert (first, second) == ("first", "second")
    assert 0.19 <= slept < 1.0
    lived = time.time() - timings.process_started()
    assert 0 < since_start + slept <= lived + 0.02  # a clock tick of /proc's resolution
    assert written["steps"] == {"a": 1.5}


def test_nothing_is_kept_or_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(timings.TIMINGS_ENV, raising=False)
    monkeypatch.setattr(timings, "_marks", [])
    timings.mark("ignored")
    timings.write()
    assert timings._marks == [] and list(tmp_path.iterdir()) == []


class ConnectSession:
    """What a Spark Connect client session answers for the driver it does not have."""

    @property
    def sparkContext(self):
        from pyspark.errors import PySparkAttributeError

        raise PySparkAttributeError(errorClass="JVM_ATTRIBUTE_NOT_SUPPORTED", messageParameters={"attr_name": "sparkContext"})


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_a_spark_connect_session_ends_its_process_with_no_jobs_reported(tmp_path, monkeypatch, on):
    """The command line's exit asks for Spark's jobs of whatever session is active."""
    if on:
        monkeypatch.setenv(timings.TIMINGS_ENV, str(tmp_path / "timings.json"))
    else:
        monkeypatch.delenv(timings.TIMINGS_ENV, raising=False)
    monkeypatch.setattr(timings, "_details", {})
    timings.spark_jobs(ConnectSession())
    assert timings._details == {}
