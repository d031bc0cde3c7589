"""Run limits on plain values: the spec's reference vectors, edge cases, the update rule."""

from dataclasses import replace
from datetime import date, datetime, timedelta

import pytest

from incremental_assets.lib.incremental.limits import (
    BatchStats,
    Cursor,
    RunLimits,
    RunState,
    keyhole_limits,
    nothing_new,
    run_limits,
)
from incremental_assets.lib.source.contract import load_days
from incremental_assets.lib.state.records import ManifestEntry

START = date(2021, 1, 1)
NOW = datetime(2021, 6, 1, 12, 0)


def limits(state, models=("a", "b"), now=NOW, backfill=30, lookback=6):
    entries = {m: ManifestEntry(m, last_success=ls) for m, ls in state.items()}
    return run_limits(entries, models, START, backfill, lookback, now)


def window(result):
    return result.state, result.lower, result.upper


def test_state_1_first_run():
    assert window(limits({})) == (RunState.FIRST_RUN, datetime(2021, 1, 1), datetime(2021, 1, 31))


def test_state_2_new_model():
    result = limits({"a": datetime(2021, 3, 1)})
    assert window(result) == (RunState.NEW_MODEL, datetime(2021, 1, 1), datetime(2021, 1, 31))


def test_state_3_out_of_sync_within_backfill():
    result = limits({"a": datetime(2021, 3, 1), "b": datetime(2021, 3, 5)})
    assert window(result) == (RunState.OUT_OF_SYNC, datetime(2021, 2, 28, 18), datetime(2021, 3, 5))


def test_state_3_out_of_sync_capped_by_backfill():
    result = limits({"a": datetime(2021, 3, 1), "b": datetime(2021, 5, 1)})
    assert window(result) == (RunState.OUT_OF_SYNC, datetime(2021, 2, 28, 18), datetime(2021, 3, 31))


def test_state_4_standard():
    result = limits({"a": datetime(2021, 3, 1), "b": datetime(2021, 3, 1)})
    assert window(result) == (RunState.STANDARD, datetime(2021, 2, 28, 18), datetime(2021, 3, 31))


def test_log_lines_name_the_state_and_window():
    result = limits({"a": datetime(2021, 3, 1), "b": datetime(2021, 3, 1)})
    assert result.log_lines == [
        "Standard incremental run",
        "Processing data between '2021-02-28 18:00:00' and '2021-03-31 00:00:00'",
    ]


def test_now_caps_first_and_standard_runs():
    now = datetime(2021, 1, 10, 8)
    assert limits({}, now=now).upper == now
    assert limits({"a": datetime(2021, 1, 9), "b": datetime(2021, 1, 9)}, now=now).upper == now


def test_new_model_is_capped_by_max_last_success_when_it_is_earlier():
    result = limits({"a": datetime(2021, 1, 10)})
    assert window(result) == (RunState.NEW_MODEL, datetime(2021, 1, 1), datetime(2021, 1, 10))


def test_models_outside_the_run_do_not_count():
    # "z" is far behind but not in this run: the run is a standard one over a and b.
    result = limits({"a": datetime(2021, 3, 1), "b": datetime(2021, 3, 1), "z": datetime(2021, 1, 2)})
    assert result.state is RunState.STANDARD


def test_zero_lookback_and_one_day_backfill():
    result = limits({"a": datetime(2021, 3, 1), "b": datetime(2021, 3, 1)}, backfill=1, lookback=0)
    assert window(result) == (RunState.STANDARD, datetime(2021, 3, 1), datetime(2021, 3, 2))


def test_an_empty_window_moves_the_position_on():
    entries = {m: ManifestEntry(m, last_success=datetime(2021, 2, 1), last_upper=datetime(2021, 4, 1)) for m in "ab"}
    result = run_limits(entries, "ab", START, 30, 6, NOW)
    assert window(result) == (RunState.STANDARD, datetime(2021, 3, 31, 18), datetime(2021, 5, 1))


def test_an_empty_first_run_leaves_a_position_without_last_success():
    entries = {m: ManifestEntry(m, last_upper=datetime(2021, 1, 31)) for m in "ab"}
    assert run_limits(entries, "ab", START, 30, 6, NOW).state is RunState.STANDARD


def batch(upper, batch_max, next_event=None, state=RunState.STANDARD):
    return BatchStats(RunLimits(state, upper - timedelta(days=1), upper, NOW), 1, batch_max, next_event)


def after_run(state, succeeded, stats):
    """The manifest after a run: assets that succeeded advance, all others keep their row."""
    updated = dict(state)
    for model in succeeded:
        updated[model] = Cursor(model, state.get(model), stats).advanced() or state.get(model)
    return updated


def test_manifest_update_rule_reference_vector():
    state = {
        "a": ManifestEntry("a", last_success=datetime(2021, 1, 4)),
        "b": ManifestEntry("b", last_success=datetime(2021, 1, 2)),
        "d": ManifestEntry("d", last_success=datetime(2021, 1, 2)),
    }
    updated = after_run(state, ["a", "b", "c"], batch(datetime(2021, 1, 3, 12), datetime(2021, 1, 3)))
    assert {m: e.last_success.date().isoformat() for m, e in updated.items()} == {
        "a": "2021-01-04", "b": "2021-01-03", "c": "2021-01-03", "d": "2021-01-02"
    }
    assert updated["c"].first_success == datetime(2021, 1, 3)


def test_failed_asset_keeps_its_value_and_the_next_run_syncs():
    state = {m: ManifestEntry(m, last_success=datetime(2021, 3, 1)) for m in "ab"}
    after = after_run(state, ["a"], batch(datetime(2021, 3, 31), datetime(2021, 3, 2)))
    assert after["b"].last_success == datetime(2021, 3, 1)
    result = run_limits(after, "ab", START, 30, 6, NOW)
    assert window(result) == (RunState.OUT_OF_SYNC, datetime(2021, 2, 28, 18), datetime(2021, 3, 2))


def test_empty_window_moves_on_to_the_next_source_event():
    state = {"a": ManifestEntry("a", last_success=datetime(2021, 3, 1))}
    after = after_run(state, ["a"], batch(datetime(2021, 3, 31), None, next_event=datetime(2021, 4, 15)))
    assert after["a"].last_success == datetime(2021, 3, 1)
    assert after["a"].position == datetime(2021, 4, 15)


def test_empty_window_with_nothing_after_it_moves_to_its_upper_limit():
    state = {"a": ManifestEntry("a", last_success=datetime(2021, 3, 1))}
    stats = batch(datetime(2021, 3, 31), datetime(2021, 3, 1))  # only re-read lookback events
    assert stats.caught_up
    assert after_run(state, ["a"], stats)["a"].position == datetime(2021, 3, 31)


def test_skip_when_already_ahead():
    stats = batch(datetime(2021, 1, 10), datetime(2021, 1, 9))
    ahead = Cursor("a", ManifestEntry("a", last_success=datetime(2021, 1, 10)), stats)
    assert ahead.ahead and ahead.advanced() is None
    assert not Cursor("b", ManifestEntry("b"), stats).ahead
    assert not Cursor("c", None, stats).ahead


def test_nothing_new_only_when_every_asset_of_the_run_is_past_the_window():
    limits = RunLimits(RunState.STANDARD, datetime(2021, 6, 1, 6), NOW, NOW)
    at_now = ManifestEntry("a", last_success=datetime(2021, 6, 1, 9), last_upper=NOW)  # moved on to 'now'
    behind = ManifestEntry("b", last_success=datetime(2021, 6, 1, 11, 59))
    assert nothing_new(limits, {"a": at_now, "b": replace(at_now, model="b")}, ["a", "b"])
    assert not nothing_new(limits, {"a": at_now, "b": behind}, ["a", "b"])
    assert not nothing_new(limits, {"a": at_now}, ["a", "b"]), "b is new: it backfills"
    keyhole = RunLimits(RunState.KEYHOLE, datetime(2021, 5, 1), datetime(2021, 5, 2), NOW)
    assert not nothing_new(keyhole, {"a": at_now}, ["a"]), "an explicit window is processed wherever the manifest is"


def test_an_explicit_window_writes_no_state():
    stats = batch(datetime(2021, 1, 10), datetime(2021, 1, 9), state=RunState.KEYHOLE)
    entry = ManifestEntry("a", last_success=datetime(2021, 5, 1))
    keyhole = Cursor("a", entry, stats)
    assert not keyhole.ahead, "a keyhole backfill processes its window wherever the manifest stands"
    assert keyhole.advanced() is None
    assert Cursor("new", None, stats).advanced() is None


def test_keyhole_validation():
    assert keyhole_limits(datetime(2021, 1, 1), datetime(2021, 1, 2), NOW).state is RunState.KEYHOLE
    with pytest.raises(ValueError, match="must not be after upper"):
        keyhole_limits(datetime(2021, 1, 3), datetime(2021, 1, 2), NOW)
    with pytest.raises(ValueError, match="must not be in the future"):
        keyhole_limits(datetime(2021, 1, 1), datetime(2022, 1, 2), NOW)


def test_no_models_is_an_error():
    with pytest.raises(ValueError, match="at least one incremental asset"):
        limits({}, models=())


def test_the_load_days_a_window_can_hold():
    # Window [01-02 23:00, 01-04 01:00]. Nothing is loaded before its cursor's day, so from 01-02;
    # with the load_tstamp cursor up to the upper limit's day, with collector_tstamp with no end
    # (an event collected in the window may be loaded any day after).
    lower, upper = datetime(2021, 1, 2, 23), datetime(2021, 1, 4, 1)
    assert load_days("load_tstamp", lower, upper) == (date(2021, 1, 2), date(2021, 1, 4))
    assert load_days("collector_tstamp", lower, upper) == (date(2021, 1, 2), None)


def test_the_next_standard_lower_is_the_first_position_minus_the_lookback():
    from incremental_assets.lib.incremental.limits import next_standard_lower

    entries = {"a": ManifestEntry("a", last_success=datetime(2021, 3, 5)), "b": ManifestEntry("b", last_success=datetime(2021, 3, 1))}
    assert next_standard_lower(entries, ["a", "b"], 6) == datetime(2021, 2, 28, 18)
    assert next_standard_lower(entries, ["a", "new"], 6) == datetime(2021, 3, 4, 18), "a new asset has no position"
    assert next_standard_lower({}, ["a"], 6) is None


def test_a_quiet_window_repeats_a_successful_run_that_moved_every_asset_over_the_same_source_version():
    from incremental_assets.lib.delta.log import Snapshot
    from incremental_assets.lib.incremental.run_plan import RunPlan, plan_table, repeated_run

    source = Snapshot("table-1", 7, datetime(2021, 6, 1, 11))
    standard = RunLimits(RunState.STANDARD, datetime(2021, 6, 1, 6), NOW, NOW)

    def plan(run_id, models=("a", "b"), version=7, table_id="table-1", state=RunState.STANDARD, upper=11):
        earlier = RunLimits(state, datetime(2021, 6, 1), datetime(2021, 6, 1, upper), datetime(2021, 6, 1, upper))
        return plan_table(RunPlan(earlier, run_id, models, source=replace(source, version=version, table_id=table_id))).to_pylist()[0]

    def log(*finished):
        records = {run: [(run, "a", "Processing"), (run, "a", status)] for run, status in finished}
        moment = datetime(2021, 6, 1)
        return lambda run: [dict(zip(("run_id", "asset", "status"), r), recorded_at=moment + timedelta(seconds=i), pid=None,
                                 host=None) for i, r in enumerate(records.get(run, []))]

    def run_id(found):
        return found and found.run_id

    ok = log(("r1", "Processed"), ("r2", "Processed"))
    assert run_id(repeated_run(standard, ("a", "b"), source, [plan("r1")], ok)) == "r1"
    assert run_id(repeated_run(standard, ("a",), source, [plan("r1")], ok)) == "r1", "it moved a superset"
    assert repeated_run(standard, ("a", "b"), source, [plan("r1")], log(("r1", "Failed"))) is None
    assert repeated_run(standard, ("a", "b"), source, [plan("r1", version=6)], ok) is None, "rows arrived since"
    assert repeated_run(standard, ("a", "b"), source, [plan("r1", table_id="other")], ok) is None, "another source table"
    assert repeated_run(standard, ("a", "b", "c"), source, [plan("r1")], ok) is None, "c was not moved by it"
    assert repeated_run(standard, ("a", "b"), source, [plan("r1", state=RunState.KEYHOLE)], ok) is None, "a keyhole moves nothing"
    assert run_id(repeated_run(standard, ("a", "b"), source, [plan("r0", version=6), plan("r1")], ok)) == "r1"
    out_of_sync = replace(standard, state=RunState.OUT_OF_SYNC)
    assert repeated_run(out_of_sync, ("a", "b"), source, [plan("r1")], ok) is None, "only a standard window is quiet"
    # The run that read furthest: its upper limit is where this window's check starts.
    furthest = repeated_run(standard, ("a", "b"), source, [plan("r1", upper=9), plan("r2", upper=11)], ok)
    assert (furthest.run_id, furthest.limits.upper) == ("r2", datetime(2021, 6, 1, 11))
    failed_last = log(("r1", "Processed"), ("r2", "Failed"))
    assert run_id(repeated_run(standard, ("a", "b"), source, [plan("r1", upper=9), plan("r2", upper=11)], failed_last)) == "r1"
