"""attributes_history and attributes at a real site's shape (3,000 users, a few events each on the
days they come back), kept over 30 days by runs days apart, with late loads and "last 7 days"
values aging out, held against the pandas oracle of test_attributes_history (computed from
filtered_events alone): the history on every day, attributes after every run. The runs recompute
only the keys whose daily rows changed (the history each from the values stored for the day
before): this is where a key left out, or a value carried wrong, would show."""

from datetime import date, timedelta

from dagster import DagsterInstance
from deltalake import DeltaTable

from incremental_assets.cli.runner import run_days, run_incremental
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import append_hours, generate_stream
from incremental_assets.lib.settings import IncrementalSettings
from tests.pipeline.test_attributes_history import events, history_rows, oracle, valid_on
from tests.warehouse_tables import scenario_environment

PARAMS = SampleParams(users=3000, days=30, events_per_day=6000, start_date=date(2024, 3, 1), seed=29, late_share=0.3,
                      bot_share=0.01)
LOADED = (18, 22, 26, 30)  # the stream's days loaded by each run (a run at the start of the next day)
LAST = date(2024, 4, 8)  # a week past the stream's end: every 7-day value has aged out


def settings(reference_day: date) -> IncrementalSettings:
    return IncrementalSettings(start_date="2024-03-01", backfill_limit_days=30, reprocess_days=30, min_rows_to_process=1,
                               attributes_reference_date=reference_day.isoformat())


def test_the_history_kept_by_runs_days_apart_holds_every_keys_values_on_every_day(spark, tmp_path):
    warehouse, source = tmp_path / "warehouse", tmp_path / "source"
    instance = DagsterInstance.ephemeral()
    with scenario_environment(warehouse, source, {}):
        generate_stream(spark, str(source), PARAMS, hours=LOADED[0] * 24)
        for before, loaded in zip((0, *LOADED), LOADED):
            if before:
                append_hours(spark, str(source), (loaded - before) * 24)
            end = PARAMS.start_date + timedelta(days=loaded)
            assert run_incremental(settings(end - timedelta(days=1)), now=f"{end}T00:30:00", instance=instance).success
            assert_attributes_hold(warehouse, end - timedelta(days=1))
        # Nothing new: the daily job of the last day again, with the reference day a week on, when
        # the 7-day values have aged out.
        last_loaded = PARAMS.start_date + timedelta(days=LOADED[-1] - 1)
        assert run_days(settings(LAST), last_loaded, last_loaded, instance).success
        assert_attributes_hold(warehouse, LAST)

    rows, filtered = history_rows(warehouse), events(warehouse)
    assert len({row["attribute_key"] for row in rows}) > 2500, "a site's shape: thousands of keys"
    day = PARAMS.start_date
    while day <= LAST:
        held, expected = valid_on(rows, day), oracle(filtered, day)
        wrong = sorted(key for key in held.keys() | expected.keys() if held.get(key) != expected.get(key))
        assert not wrong, f"as of {day}: {len(wrong)} keys differ, e.g. {wrong[0]}: {held.get(wrong[0])} != {expected.get(wrong[0])}"
        day += timedelta(days=1)


def assert_attributes_hold(warehouse, reference_day: date) -> None:
    """attributes (one row per key, as of the reference day) equals the oracle on that day."""
    rows = DeltaTable(f"{warehouse}/attributes").to_pyarrow_table().to_pylist()
    held = valid_on([{**row, "valid_from": date.min, "valid_to": None} for row in rows], reference_day)
    expected = oracle(events(warehouse), reference_day)
    wrong = sorted(key for key in held.keys() | expected.keys() if held.get(key) != expected.get(key))
    assert not wrong, f"attributes as of {reference_day}: {len(wrong)} keys differ, e.g. {wrong[0]}: {held.get(wrong[0])} != {expected.get(wrong[0])}"
