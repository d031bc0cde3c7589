"""`preview` names the source rows behind the cursor that wait for a keyhole run (how many, their
cursor range, the run that processes them): those the next run will count, and those a run counted
that no keyhole run has processed since, by the rule of the warn check. Rows the source's owner
rewrote are not among them."""

from datetime import datetime, timedelta

from dagster import DagsterInstance
from delta.tables import DeltaTable

from incremental_assets.cli.preview import preview
from incremental_assets.cli.runner import run_incremental
from incremental_assets.lib.sample.stream import events_frame
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.source.arrivals import Stranded
from incremental_assets.lib.source.contract import SAMPLE_SCHEMA
from incremental_assets.lib.source.loader import write_events

SETTINGS = IncrementalSettings(start_date="2024-03-01")
NOW = datetime(2024, 3, 2)
LOWER, UPPER = datetime(2024, 3, 1, 1), datetime(2024, 3, 1, 1, 2)
COMMAND = "incremental-assets run --lower 2024-03-01T01:00:00 --upper 2024-03-01T01:02:00"


def session(name: str, loaded: datetime, n: int = 3) -> list[tuple]:
    """`n` page views of one session, loaded a minute apart from `loaded`."""
    rows = []
    for i in range(n):
        at = loaded + timedelta(minutes=i)
        values = {"event_id": f"{name}-{i}", "app_id": "website", "event_name": "page_view", "collector_tstamp": at,
                  "dvce_created_tstamp": at, "dvce_sent_tstamp": at, "derived_tstamp": at, "load_tstamp": at,
                  "domain_sessionid": name, "domain_userid": f"u-{name}"}
        rows.append(tuple(values.get(column) for column in SAMPLE_SCHEMA.fieldNames()) + (at.date(),))
    return rows


def test_preview_names_rows_behind_the_cursor_until_a_keyhole_run_has_processed_them(spark, warehouse, tmp_path, monkeypatch):
    source = str(tmp_path / "source")
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", source)
    instance = DagsterInstance.ephemeral()
    loaded = session("early", datetime(2024, 3, 1)) + session("live", datetime(2024, 3, 1, 9))  # one behind, one not
    write_events(spark, events_frame(spark, loaded), source)
    assert run_incremental(SETTINGS, now=NOW.isoformat(), instance=instance).success
    assert preview(SETTINGS, now=NOW).behind == []

    # Another loader appends three rows behind the cursor (the next window starts at 03:02), and the
    # owner rewrites a stored row behind it too: the rows copied with it are no arrival.
    write_events(spark, events_frame(spark, session("archive", LOWER)), source)
    DeltaTable.forPath(spark, source).update("event_id = 'early-1'", {"page_title": "'erased'"})
    peek = preview(SETTINGS, now=NOW)
    assert peek.window_events == 3, "the window holds the live session only"
    assert peek.behind == [Stranded("preview", 3, LOWER, UPPER)]
    assert peek.describe().splitlines()[-2:] == [
        "Source rows behind the cursor: 3 (cursor 2024-03-01 01:00:00 .. 2024-03-01 01:02:00) wait for a keyhole run "
        "over that range; the source sensor requests it once a run has counted them, or run:",
        f"  {COMMAND}",
    ]

    counted = run_incremental(SETTINGS, now=NOW.isoformat(), instance=instance)
    assert counted.success and counted.value("new_event_limits", "arrived_behind_cursor") == 3
    assert preview(SETTINGS, now=NOW).behind == [Stranded(counted.run_id, 3, LOWER, UPPER)], "counted, still waiting"

    assert run_incremental(SETTINGS, lower=LOWER.isoformat(), upper=UPPER.isoformat(), instance=instance).success
    peek = preview(SETTINGS, now=NOW)
    assert peek.behind == [] and "behind the cursor" not in peek.describe()
