"""The pipeline on a real Spark cluster and over Spark Connect (issues 10, 34): a standalone master and
worker, then a Connect server, started from the pyspark distribution on 127.0.0.1, with the source
and the warehouse in a bucket of a real S3 API server. The worker cannot see the driver's disk (a
mount namespace of its own): what its executors need reaches them the way Spark ships it. The
incremental job and a daily backfill run there, in one `incremental-assets` process (one driver or
client) with SPARK_MASTER or SPARK_REMOTE set, and leave exactly the tables that this process's
local Spark leaves on local disk. The test stops what it started, by process group, and shows that
nothing of it is left."""

import os
import subprocess
import sys
from datetime import timedelta
from functools import partial

import pytest
from deltalake import DeltaTable, write_deltalake

from incremental_assets.lib.environment import PROJECT_ROOT, jar_cache_dir
from incremental_assets.lib.sample.generator import SampleParams
from incremental_assets.lib.utc import utcnow
from tests.s3_server import BUCKET
from tests.spark_processes import CHILD_ENV, connect_server, master_state, standalone_cluster, without_the_drivers_disk
from tests.warehouse_tables import REFERENCE_DAY, comparable_tables, reference_run, scenario_environment

PARAMS = SampleParams(users=6, days=2, events_per_day=80, start_date=(utcnow() - timedelta(days=10)).date(), seed=11, bot_share=0.2)
SETTINGS = {"start_date": PARAMS.start_date.isoformat(), "max_session_days": 1, "attributes_reference_date": REFERENCE_DAY}
FIRST_DAY, LAST_DAY = PARAMS.start_date, PARAMS.start_date + timedelta(days=PARAMS.days - 1)
COMMANDS = (["run", "--until-caught-up"], ["backfill", "--start", FIRST_DAY.isoformat(), "--end", LAST_DAY.isoformat()])
# Both commands in one process (one driver's start, not two), which leaves as `incremental-assets` does.
CHILD = "from incremental_assets import cli; cli.leave(next((code for code in map(cli.main, {commands}) if code), 0))"
ENGINES = {"standalone": partial(standalone_cluster, shares_no_disk=True), "connect": connect_server}


@pytest.fixture(scope="module")
def stream(spark, s3_server_env, tmp_path_factory):
    """The source, in the bucket, and the tables that the same commands leave on this process's
    local[2] Spark over a local copy of it."""
    local, reference = reference_run(spark, PARAMS, SETTINGS, tmp_path_factory.mktemp("cluster-reference"), (FIRST_DAY, LAST_DAY))
    assert reference["quarantined_sessions"] and reference["daily_aggregates"], "every layer has rows to compare"
    source = f"s3://{BUCKET}/source"
    write_deltalake(source, DeltaTable(local).to_pyarrow_table(), storage_options=s3_server_env)
    return source, reference



@pytest.mark.parametrize("engine", ENGINES)
def test_the_job_and_a_daily_backfill_leave_the_tables_of_local_spark(s3, stream, tmp_path, engine):
    source, reference = stream
    # The s3 fixture put the server's variables in this environment: the worker started below, and so its
    # executors, take the credentials from their own environment, as a cluster machine does.
    warehouse = f"s3a://{BUCKET}/{engine}/warehouse"
    with scenario_environment(warehouse, source, SETTINGS, home=tmp_path / "home"), ENGINES[engine](tmp_path) as cluster:
        env = {**os.environ, **CHILD_ENV, cluster.variable: cluster.url, "PYSPARK_PYTHON": sys.executable}
        child = [sys.executable, "-c", CHILD.format(commands=[list(c) for c in COMMANDS])]
        done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if engine == "standalone":  # the commands ran as an application of this master...
            hidden = [tmp_path, jar_cache_dir(), PROJECT_ROOT / "incremental_assets"]  # ... whose worker saw none of these
            assert [subprocess.run(without_the_drivers_disk(["test", "-e", str(path)])).returncode for path in hidden] == [1, 1, 1]
            assert subprocess.run(without_the_drivers_disk([sys.executable, "-c", "import pyspark"])).returncode == 0
            state = master_state(cluster.ui_port)
            assert len(state["activeapps"] or state["completedapps"]) == 1
        else:  # ... or in a session of this server
            assert "sessionId: " in (tmp_path / "connect.log").read_text()
    assert not cluster.alive(), "every process the test started has stopped"
    assert comparable_tables(warehouse) == reference
