"""What `incremental-assets run` says after one run that leaves source events past its window."""

import pytest

from incremental_assets.cli.runner import RunSummary
from incremental_assets.lib.catalog import EVENTS_THIS_RUN


def summary(success=True, **batch) -> RunSummary:
    return RunSummary("r1", success, {EVENTS_THIS_RUN: batch} if batch else {})


@pytest.mark.parametrize("state, why", [
    ("new_model", "a new incremental asset is backfilled from start_date one window at a time"),
    ("out_of_sync", "the incremental assets are brought in sync one window at a time"),
    ("first_run", "its window ended at backfill_limit_days"),
    ("standard", "its window ended at backfill_limit_days"),
])
def test_a_run_short_of_the_newest_event_says_why_and_how_to_catch_up(state, why):
    said = summary(run_state=state, caught_up=False, next_event="2024-03-02 00:00:05").left_behind()
    assert said == (f"Not caught up: {why}, and source events from 2024-03-02 00:00:05 on wait for the next run. "
                    "Run again, or: incremental-assets run --until-caught-up")


def test_nothing_is_said_when_caught_up_failed_or_stopped_before_its_batch():
    assert summary(run_state="new_model", caught_up=True, next_event=None).left_behind() is None
    assert summary(False, run_state="new_model", caught_up=False, next_event="x").left_behind() is None
    assert summary().left_behind() is None  # every asset already past the window: no batch counted
