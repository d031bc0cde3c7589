"""The Dagster UI end to end, as a person uses it, in a real headless Chromium (Playwright).

A fresh warehouse holds a small sample stream (three days), a fresh DAGSTER_HOME holds the
project's dagster.yaml, and `make ui` serves the project on a free port of 127.0.0.1 as a reader
of the README starts it: `dagster dev` (webserver and daemon: the run queue and partition backfills
need the daemon) with the warm worker beside it, which executes the runs launched once it serves
(each tagged with it). The test then, in the
browser: dismisses the first-visit dialog, opens the global asset lineage, launches
incremental_job from its job page and waits for the run to succeed, reads the run's state, limits
and row counts in the latest materialization of events_this_run and the event_id_unique check of
filtered_events, and backfills two daily partitions of daily_aggregates until both show as
materialized. A screenshot of each stage goes to tests/screenshots/ (git-ignored).

What the UI says must be true, each stage read from the page and from the UI's own GraphQL: the
first run, terminated in the UI during its session layer, reads "terminated" and ends Canceled;
the source sensor, turned on in the UI, requests that window again with no new load, and its run
succeeds with no WARNING in its log; the freshness check reads Passed right after the run;
Materialize on each single asset of the incremental run ends Canceled with the line that names
what to click instead, and leaves no asset and no check red.

The sensors that would start runs by themselves (source_events_sensor, daily_partitions_sensor)
are stopped in the instance before the UI starts, so that every run is the one the test launched
(or, once turned on in the UI, the source sensor's).

Chromium is Debian's (/usr/bin/chromium; `make test` installs it): Playwright's own browser
downloads are not used.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from incremental_assets.cli.demo import ensure_start_date
from incremental_assets.cli.runner import instance_or_default
from incremental_assets.lib.state.hooks import record_source_version
from incremental_assets.definitions import build_definitions
from incremental_assets.lib import environment
from incremental_assets.lib.catalog import RETRY_TAG, WORKER_TAG
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.sample.stream import generate_stream
from incremental_assets.lib.worker import serving
from tests.dagster_processes import WORKER_START_S



PROJECT_ROOT = environment.PROJECT_ROOT
DAGSTER = PROJECT_ROOT / ".venv" / "bin" / "dagster"
CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps calling home, and a closed network refuses it.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = Path(__file__).parents[1] / "screenshots"  # tests/screenshots/, git-ignored
VIEWPORT = {"width": 1600, "height": 1000}

DAYS = 3
# Materialize on each of these alone is refused (the incremental run is one unit).
SINGLE_ASSETS = ("sessions", "filtered_events", "daily_aggregation_manifest", "new_event_limits")
SOURCE_SENSOR = {"repositoryLocationName": "incremental_assets", "repositoryName": "__repository__",
                 "sensorName": "source_events_sensor"}
ASSETS_SHOWN = (*SINGLE_ASSETS, "sessions_lifecycle_manifest", "quarantined_sessions", "events_this_run")
# Started by the daemon, they would launch incremental and daily runs of their own.
RUN_STARTING_SENSORS = ("source_events_sensor", "daily_partitions_sensor")

SERVER_START_S = 120
UI_MS = 30_000  # a page, a dialog, a toast
# Every run starts a Spark JVM (10-30 s on 2 cores) before its steps; a backfill also waits for
# the daemon to pick it up.
RUN_MS = 5 * 60_000
STOP_S = 30


def _run_tail(log: Path, lines: int = 60) -> str:
    if not log.exists():
        return "(no log)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members


def _stop_group(process: subprocess.Popen, timeout: float = STOP_S) -> None:
    """SIGTERM to the whole process group (dagster dev, webserver, daemon, code servers, run
    workers and their JVMs), SIGKILL to whatever is left after `timeout` seconds."""
    pgid = process.pid  # start_new_session: the leader's pid is the group's id
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    _wait_gone(pgid, deadline)  # children outliving the leader
    if _group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_gone(pgid, time.monotonic() + 10)  # a killed JVM of many threads takes a moment to be gone
    process.wait(timeout=10)


def _wait_gone(pgid: int, deadline: float) -> None:
    """Until the group has no live member, or the deadline."""
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)


def _require_browser() -> Path:
    """Debian's Chromium and the playwright package, checked before anything heavy starts: their
    absence fails the test (it never skips)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser test drives Debian's Chromium. Install it with "
            "`apt-get update && apt-get install -y --no-install-recommends chromium` (make test does this)."
        )
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("The playwright package is missing: pip install -e '.[test]' (make setup does this)")
    return CHROMIUM


def _prepare(spark, tmp_path: Path, monkeypatch) -> dict:
    """A fresh warehouse with a small sample stream, its settings file, and a fresh DAGSTER_HOME in
    which the run-starting sensors are stopped."""
    warehouse, home, settings = tmp_path / "warehouse", tmp_path / "dagster_home", tmp_path / "settings.yaml"
    warehouse.mkdir()
    monkeypatch.setenv("INCREMENTAL_ASSETS_WAREHOUSE", str(warehouse))
    monkeypatch.delenv("INCREMENTAL_ASSETS_SOURCE", raising=False)
    monkeypatch.setenv("INCREMENTAL_ASSETS_CONFIG", str(settings))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    environment.dagster_home()  # what `incremental-assets setup` does: the project's dagster.yaml in DAGSTER_HOME
    assert (home / "dagster.yaml").read_text() == (PROJECT_ROOT / "dagster.yaml").read_text()

    # Three whole days up to last midnight (UTC): the first daily partitions are those days.
    start = datetime.now(timezone.utc).date() - timedelta(days=DAYS)
    params = SampleParams(users=8, days=DAYS, events_per_day=200, start_date=start, seed=11)
    rows = generate_stream(spark, environment.table_uri(environment.ATOMIC_EVENTS, str(warehouse)), params)
    assert rows > 0
    record_source_version(instance_or_default(None), "sample stream", rows)  # as `incremental-assets generate` does
    ensure_start_date(start)  # start_date: the stream's first day, as `make demo` writes it
    assert f"start_date: '{start.isoformat()}'" in settings.read_text()

    env = {
        **os.environ,
        "INCREMENTAL_ASSETS_WAREHOUSE": str(warehouse),
        "INCREMENTAL_ASSETS_CONFIG": str(settings),
        "DAGSTER_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("INCREMENTAL_ASSETS_SOURCE", None)
    for sensor in RUN_STARTING_SENSORS:
        stopped = subprocess.run(
            [str(DAGSTER), "sensor", "stop", sensor, "-w", "workspace.yaml"],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=180,
        )
        assert stopped.returncode == 0, f"dagster sensor stop {sensor} failed:\n{stopped.stdout}\n{stopped.stderr}"
    return {"env": env, "days": [start + timedelta(days=i) for i in range(DAYS)], "log": tmp_path / "make-ui.log"}


@contextmanager
def _make_ui(env: dict, log: Path) -> Iterator[str]:
    """`make ui` on a free port of 127.0.0.1, in its own process group, stopped whole on exit; once
    the webserver answers and the warm worker serves the home."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {name: value for name, value in env.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not make test's
    with log.open("w") as out:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "ui", f"UI_PORT={port}"],
            cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{base}/server_info", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"make ui did not answer on {base} within {SERVER_START_S}s:\n{_run_tail(log)}")
            try:  # the poll interval, and a dead server ends the wait at once
                code = process.wait(timeout=0.5)
                pytest.fail(f"make ui exited with {code} before serving:\n{_run_tail(log)}")
            except subprocess.TimeoutExpired:
                pass
        while serving(Path(env["DAGSTER_HOME"])) is None:  # its rehearsal started with the webserver
            if time.monotonic() > deadline + WORKER_START_S:
                pytest.fail(f"make ui started no warm worker within {WORKER_START_S}s more:\n{_run_tail(log)}")
            time.sleep(0.5)
        yield base
    finally:
        _stop_group(process)
    assert not _group_members(process.pid), "processes of make ui (dagster dev, the worker) were left running"


@contextmanager
def _browser_page(chromium: Path, base_url: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport=VIEWPORT, timezone_id="UTC", base_url=base_url)
            context.set_default_timeout(UI_MS)
            yield context.new_page()
        finally:
            browser.close()


def test_ui_end_to_end(request, tmp_path, monkeypatch):
    chromium = _require_browser()
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_MS)  # Playwright's own 5 s is short for a loaded 2-core machine
    prepared = _prepare(request.getfixturevalue("spark"), tmp_path, monkeypatch)
    SCREENSHOTS.mkdir(exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    first_day, second_day = prepared["days"][:2]
    with _make_ui(prepared["env"], prepared["log"]) as base_url, _browser_page(chromium, base_url) as page:
        try:
            _dismiss_first_visit_dialog(page)
            _asset_graph(page, expect)
            terminated = _launch_incremental_run(page, expect, terminate_in="sessions_lifecycle_manifest")
            run_id = _sensor_requests_the_window_again(page, expect, terminated)
            _no_warning_in(page, run_id)
            _events_this_run_metadata(page, expect, run_id, first_day)
            _filtered_events_checks(page, expect)
            _single_asset_materialize_is_refused(page, expect)
            _backfill_two_partitions(page, expect, first_day.isoformat(), second_day.isoformat())
        except BaseException:
            page.screenshot(path=SCREENSHOTS / "failure.png")
            print(f"make ui log (last lines):\n{_run_tail(prepared['log'])}")
            print(f"the page at {page.url} (a CI log keeps no screenshot):\n{_page_text(page)}")
            raise


def _page_text(page) -> str:
    try:
        return page.inner_text("body", timeout=5_000)[:3000]
    except Exception as error:  # the page itself may be what broke
        return f"(not readable: {error})"


def _shot(page, name: str) -> None:
    page.screenshot(path=SCREENSHOTS / f"{name}.png")


def _toasts(page):
    """The notifications region: 'Launched run …', 'Created backfill …', each with a View link."""
    return page.get_by_role("region", name=re.compile(r"^Notifications"))


def _nav(page, label: str):
    """A link of the main navigation; its accessible name starts with its icon's name."""
    return page.get_by_role("link", name=re.compile(rf"(^|\s){label}$"))


def _dismiss_first_visit_dialog(page) -> None:
    """Dagster 1.13 shows a 'Join the Dagster community' dialog on an instance's first visit
    (DAGSTER_HOME/.nux marks it seen); Skip closes it, whenever it shows up."""
    skip = page.get_by_role("dialog").filter(has_text="Join the Dagster community").get_by_role("button", name="Skip")

    def dismiss():
        print("first-visit dialog shown: Skip")
        skip.click()

    page.add_locator_handler(skip, dismiss)
    page.goto("/")
    _nav(page, "Lineage").wait_for()


def _asset_graph(page, expect) -> None:
    _nav(page, "Lineage").click()
    expect(page.get_by_text("Global asset lineage", exact=True)).to_be_visible()
    # Groups start collapsed: unfold each (the icon on its node), reloading after each so that the
    # graph fits the whole lineage again (a node can end up under the side panel otherwise). Each
    # count waits for the graph to draw every group's icon: the side panel names the groups before
    # the graph is drawn, and a count taken then finds no folded group.
    groups = len({spec.group_name for spec in build_definitions().resolve_all_asset_specs()})  # a node each
    folds = page.get_by_role("img", name=re.compile(r"^unfold_(more|less)$"))
    unfold = page.get_by_role("img", name="unfold_more", exact=True)
    for _ in range(groups + 1):
        expect(folds).to_have_count(groups)
        if unfold.count() == 0:
            break
        unfold.first.click()
        page.reload()
    expect(unfold).to_have_count(0)
    for asset in ("new_event_limits", "events_this_run", "filtered_events", "daily_aggregates"):
        expect(page.get_by_text(asset, exact=True).first).to_be_visible()
    _shot(page, "01_asset_graph")


def _launch_incremental_run(page, expect, terminate_in: str) -> str:
    """Materialize all on incremental_job's page, then Terminate once the step `terminate_in` has
    started: the run ends Canceled and its step reads as terminated."""
    _nav(page, "Jobs").click()
    page.get_by_role("link", name=re.compile(r"(^|\s)incremental_job$")).click()
    run_id = _materialize(page, expect, page.get_by_role("button", name=re.compile(r"Materialize all$")))
    _toasts(page).get_by_role("link", name="View", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/runs/{run_id}"))
    _wait_for(lambda: terminate_in in _started_steps(page, run_id), RUN_MS, f"step {terminate_in} of run {run_id} to start")
    page.get_by_role("button", name=re.compile(r"Terminate$")).click()
    page.get_by_role("dialog").get_by_role("button", name=re.compile(r"Terminate")).click()
    expect(page.get_by_text("Canceled", exact=True).first).to_be_visible(timeout=RUN_MS)
    assert _run(page, run_id)["status"] == "CANCELED"
    # In its own process the step under way fails "terminated: run ...". In the warm worker the interrupt
    # can land in Dagster's own code between two of a step's events (the step then fails with Dagster's
    # bare interrupt) or between steps, and the worker's line says "terminated" for the run.
    events = _events(page, run_id)
    failures = [e["error"]["message"] for e in events if e["__typename"] == "ExecutionStepFailureEvent"]
    worker_line = [e for e in events if (e.get("message") or "").startswith(f"terminated: run {run_id} was canceled")]
    if worker_line:
        assert all(m.startswith(("terminated: run ", "dagster._core.errors.DagsterExecutionInterruptedError")) for m in failures), failures
    else:
        assert failures and all("terminated: run " in message for message in failures), failures
    expect(page.get_by_text(re.compile(r"terminated: run ")).first).to_be_visible()
    _shot(page, "02_run_terminated")
    return run_id


def _sensor_requests_the_window_again(page, expect, canceled: str) -> str:
    """Turn source_events_sensor on (the mutation the UI's switch sends; the Automation page then
    shows it on): with no new load, its next tick requests the canceled run's window again (a run
    tagged as its retry), which succeeds. Then off again."""
    started = _graphql(page, "mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename "
                             "... on Sensor { id sensorState { status } } ... on PythonError { message } } }", s=SOURCE_SENSOR)
    assert (started["startSensor"].get("sensorState") or {}).get("status") == "RUNNING", started
    _nav(page, "Automation").click()
    row = page.locator('a[href$="/sensors/source_events_sensor"]').locator("xpath=ancestor::*[.//input[@type='checkbox']][1]")
    expect(row.locator("input[type=checkbox]").last).to_be_checked()  # the UI shows it on
    _shot(page, "03_source_sensor_turned_on")
    retry = _wait_for(lambda: _runs_tagged(page, RETRY_TAG, canceled), RUN_MS, f"a run retrying {canceled}")[-1]
    _wait_for(lambda: _run(page, retry["id"])["status"] in ("SUCCESS", "FAILURE", "CANCELED"), RUN_MS, f"run {retry['id']}")
    stopped = _graphql(page, "mutation($id: String) { stopSensor(id: $id) { __typename ... on StopSensorMutationResult "
                             "{ instigationState { status } } ... on PythonError { message } } }", id=started["startSensor"]["id"])
    assert stopped["stopSensor"]["instigationState"]["status"] == "STOPPED", stopped  # the runs after are the test's
    assert _run(page, retry["id"])["status"] == "SUCCESS", _events(page, retry["id"])[-5:]
    page.goto(f"/runs/{retry['id']}")
    expect(page.get_by_text("Success", exact=True).first).to_be_visible()
    expect(page.get_by_text(re.compile(r"^Run of"))).to_contain_text("incremental_job")
    _shot(page, "04_retry_by_the_sensor")
    return retry["id"]


def _no_warning_in(page, run_id: str) -> None:
    """A run that did its work is green: no WARNING (or ERROR) line in its log."""
    levels = [(e.get("level"), e.get("message")) for e in _events(page, run_id)]
    assert not [line for line in levels if line[0] in ("WARNING", "ERROR", "CRITICAL")], levels


def _single_asset_materialize_is_refused(page, expect) -> None:
    """Materialize on each asset of the incremental run alone: Canceled, with the line that names
    what to click instead; no asset and no check is left red."""
    for name in SINGLE_ASSETS:
        _open_asset(page, expect, name)
        run_id = _materialize(page, expect, page.get_by_role("button", name=re.compile(r"(^|\s)Materialize$")).first)
        _wait_for(lambda: _run(page, run_id)["status"] in ("SUCCESS", "FAILURE", "CANCELED"), RUN_MS, f"run {run_id}")
        assert _run(page, run_id)["status"] == "CANCELED", _events(page, run_id)[-5:]
        page.goto(f"/runs/{run_id}")
        expect(page.get_by_text(re.compile(rf"refused: {name} alone is part of an incremental run")).first).to_be_visible()
        _shot(page, f"08_materialize_{name}_refused")
    keys = [{"path": [name]} for name in ASSETS_SHOWN]
    latest = _graphql(page, "query($keys: [AssetKeyInput!]!) { assetsLatestInfo(assetKeys: $keys) "
                            "{ assetKey { path } latestRun { id status } } }", keys=keys)["assetsLatestInfo"]
    assert not [info for info in latest if (info["latestRun"] or {}).get("status") == "FAILURE"], latest
    checks = _graphql(page, "query($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) { assetKey { path } "
                            "assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization "
                            "{ status } } } } } }", keys=keys)["assetNodes"]
    statuses = {(node["assetKey"]["path"][-1], check["name"]): (check["executionForLatestMaterialization"] or {}).get("status")
                for node in checks for check in node["assetChecksOrError"].get("checks", [])}
    assert not {check: status for check, status in statuses.items() if status in ("FAILED", "EXECUTION_FAILED")}, statuses
    _open_asset(page, expect, "filtered_events", tab="Checks")
    for check in ("event_id_unique", "events_within_session_cap", "freshness_check"):
        expect(page.get_by_text(check, exact=True).first).to_be_visible()  # the list is drawn before it is read
    # Planned in the refused filtered_events run, and resolved as the lease refusal leaves them: skipped
    # (each of the four in the list, and the selected one's latest execution beside it).
    expect(page.get_by_text("Skipped", exact=True)).to_have_count(5)
    expect(page.get_by_text(re.compile(r"^(Failed|Execution failed)$"))).to_have_count(0)
    _shot(page, "09_filtered_events_checks_after_single_materializations")


def _materialize(page, expect, button) -> str:
    """Click a Materialize button; launch from the launchpad if one opens (its default config): the run id."""
    button.click()
    toasts = _toasts(page)
    launched = toasts.get_by_text(re.compile(r"^Launched run \w+"))
    launchpad = page.get_by_role("button", name=re.compile(r"Launch run$"))
    expect(launched.or_(launchpad).first).to_be_visible()
    if not launched.is_visible():
        launchpad.click()
    expect(launched).to_be_visible()
    run_id = launched.inner_text().split()[-1]
    return _run(page, run_id)["id"]  # the toast shows the id's first 8 characters


def _graphql(page, query: str, **variables) -> dict:
    """The UI's own GraphQL endpoint, from the browser's context. Within a run's time, not a page's:
    on a machine busy with runs (SQLite's lock held by a run's events) one answer took over 30 s."""
    response = page.request.post("/graphql", data={"query": query, "variables": variables}, timeout=RUN_MS)
    body = response.json()
    assert response.ok and "errors" not in body, body
    return body["data"]


def _run(page, run_id: str) -> dict:
    """A run by its id or the id's first characters (as a toast shows it)."""
    runs = _graphql(page, "{ runsOrError(limit: 200) { ... on Runs { results { id status } } } }")["runsOrError"]["results"]
    [run] = [run for run in runs if run["id"].startswith(run_id)]
    return run


def _runs_with_tags(page) -> list[dict]:
    """Every run, its tags as a dict."""
    query = "{ runsOrError(limit: 200) { ... on Runs { results { id status tags { key value } } } } }"
    runs = _graphql(page, query)["runsOrError"]["results"]
    return [{**run, "tags": {tag["key"]: tag["value"] for tag in run["tags"]}} for run in runs]


def _runs_tagged(page, key: str, value: str) -> list[dict]:
    query = "query($tags: [ExecutionTag!]) { runsOrError(filter: {tags: $tags}) { ... on Runs { results { id status } } } }"
    return _graphql(page, query, tags=[{"key": key, "value": value}])["runsOrError"]["results"]


def _events(page, run_id: str) -> list[dict]:
    query = ("query($id: ID!) { logsForRun(runId: $id, limit: 5000) { ... on EventConnection { events { __typename "
             "... on MessageEvent { level message stepKey } ... on ExecutionStepFailureEvent { error { message } } } } } }")
    return _graphql(page, query, id=run_id)["logsForRun"]["events"]


def _started_steps(page, run_id: str) -> set[str]:
    return {e["stepKey"] for e in _events(page, run_id) if e["__typename"] == "ExecutionStepStartEvent"}


def _wait_for(found, timeout_ms: int, what: str):
    deadline = time.monotonic() + timeout_ms / 1000
    while not (value := found()):
        assert time.monotonic() < deadline, f"waited {timeout_ms // 1000} s for {what}"
        time.sleep(1)
    return value


def _open_asset(page, expect, name: str, tab: str | None = None) -> None:
    _nav(page, "Catalog").click()
    page.get_by_role("link", name=re.compile(rf"(^|\s){name}$")).first.click()
    expect(page).to_have_url(re.compile(rf"/assets/{name}(\?|$)"))
    if tab:
        page.get_by_role("tab", name=tab, exact=True).click()


def _metadata_value(page, key: str):
    """The value cell of the metadata table row whose key cell is `key`."""
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=key, exact=True)).first
    return row.get_by_role("cell").nth(1)


def _events_this_run_metadata(page, expect, run_id: str, first_day) -> None:
    _open_asset(page, expect, "events_this_run", tab="Events")
    expect(page.get_by_text(f"Materialized in run {run_id[:8]}")).to_be_visible()
    expect(_metadata_value(page, "run_state")).to_have_text("first_run")
    expect(_metadata_value(page, "lower_limit")).to_have_text(f"{first_day.isoformat()} 00:00:00")
    expect(_metadata_value(page, "upper_limit")).to_have_text(re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}"))
    for key in ("dagster/row_count", "rows_inserted"):
        expect(_metadata_value(page, key)).to_have_text(re.compile(r"^[1-9][\d,]*$"))
    _shot(page, "05_events_this_run_metadata")


def _filtered_events_checks(page, expect) -> None:
    _open_asset(page, expect, "filtered_events", tab="Checks")
    page.get_by_text("event_id_unique", exact=True).first.click()
    expect(page.get_by_text("Evaluation result", exact=True)).to_be_visible()
    expect(page.get_by_text("Passed", exact=True)).to_be_visible()
    _shot(page, "06_filtered_events_checks")
    page.get_by_text("freshness_check", exact=True).first.click()  # evaluated in the run: fresh, not "Not evaluated"
    expect(page.get_by_text("Passed", exact=True)).to_be_visible()
    _shot(page, "07_filtered_events_freshness")


def _backfill_two_partitions(page, expect, first: str, second: str) -> None:
    _open_asset(page, expect, "daily_aggregates", tab="Partitions")
    page.get_by_role("button", name=re.compile(r"Materialize…?$")).click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text("Launch runs to materialize daily_aggregates")).to_be_visible()
    selection = dialog.get_by_role("textbox")
    selection.fill(f"[{first}...{second}]")
    selection.press("Tab")
    expect(dialog.get_by_text("2 partitions", exact=True)).to_be_visible()
    _shot(page, "10_backfill_dialog")
    dialog.get_by_role("button", name="Launch backfill").click()
    expect(_toasts(page).get_by_text(re.compile(r"^Created backfill"))).to_be_visible()
    expect(dialog).to_be_hidden()

    materialized = page.get_by_text("Materialized (2)", exact=True)
    failed = page.get_by_text(re.compile(r"^Failed \([1-9]\d*\)$"))
    expect(materialized.or_(failed).first).to_be_visible(timeout=RUN_MS)
    assert materialized.is_visible(), f"the backfill failed: {failed.first.inner_text()}"
    for day in (first, second):
        entries = page.get_by_title(day, exact=True)  # its row in the partition list, then the detail's heading
        entries.first.click()
        expect(page).to_have_url(re.compile(rf"[?&]partition={day}(&|$)"))
        expect(entries).to_have_count(2)
        expect(page.get_by_text("Materialized", exact=True)).to_be_visible()  # the detail's status tag
        expect(page.get_by_role("link", name=re.compile(r"^[0-9a-f]{8}$")).first).to_be_visible()  # the backfill's run
    _shot(page, "11_backfill_partitions_materialized")
    backfill_runs = [run for run in _runs_with_tags(page) if "dagster/backfill" in run["tags"]]
    assert backfill_runs, "no run of the backfill"
    for run in backfill_runs:  # make ui's worker ran it; else the launcher's line says why not
        assert WORKER_TAG in run["tags"], [e["message"] for e in _events(page, run["id"]) if "worker" in (e.get("message") or "")]
