"""The whole code location as one readable snapshot (assets with their group, upstreams and
partitions; checks; jobs with their assets or steps; schedules; sensors), so any change to what
exists shows in review; and the catalog of tables held against the asset graph.

After an intended change: `UPDATE_SNAPSHOT=1 pytest tests/components/test_code_location.py`."""

import os
import re
from pathlib import Path

from dagster import AssetKey

from incremental_assets.definitions import build_definitions
from incremental_assets.lib.catalog import ATOMIC_EVENTS, NEW_EVENT_LIMITS, TABLES
from incremental_assets.lib.settings import IncrementalSettings

SNAPSHOT = Path(__file__).parent / "snapshots" / "code_location.txt"


def describe(defs) -> list[str]:
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    lines = []
    for node in sorted(graph.asset_nodes, key=lambda n: n.key.to_user_string()):
        upstream = ", ".join(sorted(k.to_user_string() for k in node.parent_keys)) or "-"
        partitions = type(node.partitions_def).__name__ if node.partitions_def else "unpartitioned"
        lines.append(f"asset {node.key.to_user_string()}  group={node.group_name}  {partitions}  upstream: {upstream}")
    lines += [f"check {key.to_user_string()}" for key in sorted(graph.asset_check_keys, key=lambda k: k.to_user_string())]
    for job in sorted(repo.get_all_jobs(), key=lambda j: j.name):
        if job.name.startswith("__"):
            continue  # Dagster's implicit job of all assets
        assets = sorted(k.to_user_string() for k in job.asset_layer.selected_asset_keys)
        what = f"assets: {', '.join(assets)}" if assets else f"steps: {', '.join(sorted(n.name for n in job.graph.nodes))}"
        lines.append(f"job {job.name}  {what}")
    for schedule in sorted(repo.schedule_defs, key=lambda s: s.name):
        lines.append(f"schedule {schedule.name}  '{schedule.cron_schedule}' -> {schedule.job_name}  {schedule.default_status.value}")
    for sensor in sorted(repo.sensor_defs, key=lambda s: s.name):
        assets = sensor.asset_selection.resolve(repo.asset_graph) if sensor.asset_selection is not None else ()
        if assets:
            jobs = "assets " + ", ".join(sorted(k.to_user_string() for k in assets))
        else:
            jobs = ", ".join(t.job_name for t in sensor.targets) or "checks"
        lines.append(f"sensor {sensor.name} -> {jobs}  {sensor.default_status.value}")
    return lines


def test_the_code_location_matches_its_snapshot():
    lines = describe(build_definitions(IncrementalSettings()))
    if os.environ.get("UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text("\n".join(lines) + "\n")
    assert lines == SNAPSHOT.read_text().splitlines(), "definitions changed: review, then UPDATE_SNAPSHOT=1"


def test_every_name_an_operator_sees_is_readable():
    """No generated names (Dagster's `freshness_check_4cd31737` style) among checks, jobs, sensors, schedules or steps."""
    generated = re.compile(r"_[0-9a-f]{8,}\b")
    assert not [line for line in describe(build_definitions(IncrementalSettings())) if generated.search(line)]


def test_the_catalog_lists_exactly_the_asset_graphs_tables_in_their_groups():
    graph = build_definitions(IncrementalSettings()).get_repository_def().asset_graph
    in_graph = {node.key.to_user_string(): node.group_name for node in graph.asset_nodes}
    in_catalog = {table.name: table.group for table in TABLES if table.group is not None}
    assert in_catalog == in_graph
    # the state store's tables are not assets
    assert not {table.name for table in TABLES if table.group is None} & set(in_graph)


def test_the_source_is_drawn_upstream_of_the_runs_first_asset():
    graph = build_definitions(IncrementalSettings()).get_repository_def().asset_graph
    assert AssetKey(ATOMIC_EVENTS) in graph.get(AssetKey(NEW_EVENT_LIMITS)).parent_keys
