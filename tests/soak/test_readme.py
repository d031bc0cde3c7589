"""The README followed word for word on a fresh clone: every ```sh block in order, each block's
`export`s carried on to the next (as in a reader's terminal). The `make ui` block is started in the
background and the step the README describes after it (materialize `incremental_job`) is done
through the webserver's GraphQL API, as its button does; the UI is stopped before the next block.
`make test` is CI's own command and is not repeated here."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UI = "http://127.0.0.1:3000"
LAUNCH = """mutation($job: String!) { launchRun(executionParams: {selector: {repositoryLocationName: "incremental_assets",
  repositoryName: "__repository__", jobName: $job}}) { __typename ... on LaunchRunSuccess { run { runId } }
  ... on PythonError { message } ... on InvalidSubsetError { message } } }"""
STATUS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""


def sh_blocks(readme: str) -> list[str]:
    return [block.strip() for block in re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M)]


def graphql(query: str, **variables) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{UI}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["data"]


def materialize_from_the_ui(job: str) -> str:
    """Wait for the webserver, launch `job` as the UI's button does, and wait for the run's end."""
    for _ in range(180):
        try:
            urllib.request.urlopen(f"{UI}/server_info", timeout=5)
            break
        except OSError:
            time.sleep(2)
    launched = graphql(LAUNCH, job=job)["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    for _ in range(600):
        status = graphql(STATUS, id=run_id)["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(2)
    return "TIMEOUT"


@pytest.mark.soak
def test_the_readme_works_word_for_word_on_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    blocks = sh_blocks((clone / "README.md").read_text())
    assert any(b == "make ui" for b in blocks) and any("backfill" in b for b in blocks)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INCREMENTAL_ASSETS_", "DAGSTER_HOME", "PYTEST"))}
    exported = tmp_path / "exported.sh"  # a block's exports, for the blocks after it
    exported.write_text("")
    shown = {}
    for block in blocks:
        script = f"set -euo pipefail\nsource {exported}\n{block}\nexport -p > {exported}\n"
        if block == "make ui":
            ui = subprocess.Popen(["bash", "-c", script], cwd=clone, env=env, start_new_session=True,
                                  stdout=(tmp_path / "ui.log").open("w"), stderr=subprocess.STDOUT)
            try:
                assert materialize_from_the_ui("incremental_job") == "SUCCESS", (tmp_path / "ui.log").read_text()[-3000:]
            finally:
                os.killpg(ui.pid, signal.SIGTERM)
                ui.wait(timeout=120)
            continue
        script = "\n".join(line for line in script.splitlines() if not line.startswith("make test"))
        result = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=3600)
        assert result.returncode == 0, f"block failed:\n{block}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        shown[block] = result.stdout
    [own] = [out for block, out in shown.items() if "show sessions" in block]
    assert "s1" in own and "s2" in own, "the reader's own events are loaded, processed and shown as sessions"
