"""Sessions at their cap are quarantined whatever the run that finds them: a late event that caps an
older session, and a run killed between the cap and the quarantine."""

from datetime import timedelta

from dagster import DagsterInstance

from incremental_assets.cli.runner import run_until_caught_up
from incremental_assets.lib.delta.read import read_table
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA
from incremental_assets.lib.source.loader import write_events
from incremental_assets.lib.transforms import sessions as sessions_transforms
from incremental_assets.lib.utc import utcnow

STREAM_START = (utcnow() - timedelta(days=300)).replace(hour=0, minute=0, second=0, microsecond=0)


def bot_stream(spark, tmp_path, monkeypatch) -> IncrementalSettings:
    """BOT, whose late event caps its session in a run over a later window: in a source of its own,
    with the settings that process it (max_session_days 1, backfill_limit_days 1, cursor load_tstamp)."""
    source = str(tmp_path / "export")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    def hit(event_id, loaded):
        collector = loaded - timedelta(minutes=1)
        values = {
            "event_id": event_id, "app_id": "website", "event_name": "page_view", "collector_tstamp": collector,
            "dvce_created_tstamp": collector, "dvce_sent_tstamp": collector, "derived_tstamp": collector,
            "load_tstamp": loaded, "domain_sessionid": "BOT", "domain_userid": "u", "page_url": "/",
        }
        return tuple(values.get(name) for name in SAMPLE_SCHEMA.fieldNames()) + (loaded.date(),)
    day = STREAM_START
    rows = [hit("b1", day + timedelta(hours=10)), hit("b2", day + timedelta(hours=10, minutes=5)),
            hit("b3", day + timedelta(days=2, hours=12))]
    write_events(spark, events_frame(spark, rows), source, "append")
    return IncrementalSettings(start_date=day.date().isoformat(), max_session_days=1, backfill_limit_days=1)


def bot_runs(settings: IncrementalSettings, instance: DagsterInstance) -> list:
    return run_until_caught_up(settings, report=lambda line: None, instance=instance,
                               now=(STREAM_START + timedelta(days=4)).isoformat())


def bot_capped_and_quarantined(spark, warehouse) -> tuple[bool, list[str]]:
    [bot] = read_table(spark, f"{warehouse}/sessions_lifecycle_manifest").collect()
    quarantined = read_table(spark, f"{warehouse}/quarantined_sessions").collect()
    return bot.end_tstamp == bot.start_tstamp + timedelta(days=1), [row.session_identifier for row in quarantined]


def test_a_late_event_that_caps_a_session_older_than_the_window_quarantines_it(spark, warehouse, monkeypatch, tmp_path):
    # BOT starts 01-01 10:00; its late event loads 01-03 12:00, in a window whose sessions start
    # from 01-02 on. That run caps BOT's lifecycle row at 01-02 10:00, so it must quarantine BOT,
    # as one run over all would. (Found by the batching property, tests/test_batching_invariance.py.)
    runs = bot_runs(bot_stream(spark, tmp_path, monkeypatch), DagsterInstance.ephemeral())
    assert all(run.success for run in runs)
    assert bot_capped_and_quarantined(spark, warehouse) == (True, ["BOT"])


def test_a_session_capped_by_a_run_killed_before_its_quarantine_is_quarantined_by_the_next(
    spark, warehouse, monkeypatch, tmp_path
):
    # The run holding BOT's late event caps its lifecycle row, then dies before it writes the
    # quarantine. The next run finds that row already at its cap, nothing to change, and must
    # still quarantine BOT: its lifecycle step reports the row's day all the same.
    settings, instance = bot_stream(spark, tmp_path, monkeypatch), DagsterInstance.ephemeral()
    def killed(*args, **kwargs):
        raise RuntimeError("killed between the lifecycle's write and the quarantine's")
    with monkeypatch.context() as patch:
        patch.setattr(sessions_transforms, "capped_before_window", killed)
        runs = bot_runs(settings, instance)
    assert not runs[-1].success
    assert bot_capped_and_quarantined(spark, warehouse) == (True, [])
    runs = bot_runs(settings, instance)
    assert all(run.success for run in runs)
    assert bot_capped_and_quarantined(spark, warehouse) == (True, ["BOT"])
