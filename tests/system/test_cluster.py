"""The pipeline on a real Spark cluster and over Spark Connect (issue 10): a standalone master and
worker, then a Connect server, started from the pyspark distribution on 127.0.0.1. The incremental
job and a daily backfill run there, in one `incremental-assets` process (one driver or client) with
SPARK_MASTER or SPARK_REMOTE set, and leave exactly the tables that this process's local Spark leaves. The test
stops what it started, by process group, and shows that nothing of it is left."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.utc import utcnow
from tests.spark_processes import CHILD_ENV, connect_server, master_state, standalone_cluster
from tests.warehouse_tables import comparable_tables, reference_run, scenario_environment

PARAMS = SampleParams(users=6, days=2, events_per_day=80, start_date=(utcnow() - timedelta(days=10)).date(), seed=11, bot_share=0.2)
SETTINGS = {"start_date": PARAMS.start_date.isoformat(), "max_session_days": 1}
FIRST_DAY, LAST_DAY = PARAMS.start_date, PARAMS.start_date + timedelta(days=PARAMS.days - 1)
COMMANDS = (["run", "--until-caught-up"], ["backfill", "--start", FIRST_DAY.isoformat(), "--end", LAST_DAY.isoformat()])
# Both commands in one process (one driver's start, not two), which leaves as `incremental-assets` does.
CHILD = "from incremental_assets import cli; cli.leave(next((code for code in map(cli.main, {commands}) if code), 0))"
ENGINES = {"standalone": standalone_cluster, "connect": connect_server}


@pytest.fixture(scope="module")
def stream(spark, tmp_path_factory):
    """The source, and the tables that the same commands leave on this process's local[2] Spark."""
    source, reference = reference_run(spark, PARAMS, SETTINGS, tmp_path_factory.mktemp("cluster-reference"), (FIRST_DAY, LAST_DAY))
    assert reference["quarantined_sessions"] and reference["daily_aggregates"], "every layer has rows to compare"
    return source, reference



@pytest.mark.parametrize("engine", ENGINES)
def test_the_job_and_a_daily_backfill_leave_the_tables_of_local_spark(spark, stream, tmp_path, engine):
    source, reference = stream
    warehouse = tmp_path / "warehouse"
    with ENGINES[engine](tmp_path) as cluster, scenario_environment(warehouse, source, SETTINGS, home=tmp_path / "home"):
        env = {**os.environ, **CHILD_ENV, cluster.variable: cluster.url, "PYSPARK_PYTHON": sys.executable}
        child = [sys.executable, "-c", CHILD.format(commands=[list(c) for c in COMMANDS])]
        done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if engine == "standalone":  # the commands ran as an application of this master...
            state = master_state(cluster.ui_port)
            assert len(state["activeapps"] or state["completedapps"]) == 1
        else:  # ... or in a session of this server
            assert "sessionId: " in (tmp_path / "connect.log").read_text()
    assert not cluster.alive(), "every process the test started has stopped"
    assert comparable_tables(spark, warehouse) == reference
