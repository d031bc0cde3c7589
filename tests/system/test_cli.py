"""The command line: bad settings fail fast, with a message naming the variable, before Spark starts."""

import os
import subprocess
import sys
from datetime import date, timedelta

import pytest
from deltalake import DeltaTable

from incremental_assets.lib.settings import SettingsError, load_settings


def cli(*args, env=None):
    environ = {**os.environ, "SPARK_MASTER": "no-such-master://spark-must-not-start", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "incremental_assets", *args], capture_output=True, text=True, timeout=120, env=environ
    )


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("backfill_limit_days=0", "backfill_limit_days must be an integer >= 1 (got 0)"),
        ("session_timestamp=derived_tstamp", "session_timestamp must be one of load_tstamp, collector_tstamp"),
        ("start_date=2999-01-01", "start_date must not be in the future"),
        ("source_load_date_column=", "source_load_date_column must name a column of the source table"),
        ("max_session_days=many", "max_session_days must be of type"),
        ("no_such_variable=1", "Unknown variable(s) ['no_such_variable']"),
    ],
)
def test_invalid_settings_fail_before_spark_starts(assignment, message, warehouse):
    result = cli("run", "--set", assignment)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Spark" not in result.stderr and "Traceback" not in result.stderr


def test_an_object_store_over_plain_http_is_refused_before_anything_starts_until_accepted(tmp_path):
    """deltalake refuses an http:// endpoint deep in its first read ("URL scheme is not allowed")."""
    env = {"INCREMENTAL_ASSETS_WAREHOUSE": "s3://bucket/warehouse", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_ALLOW_HTTP": "", "DAGSTER_HOME": str(tmp_path)}
    for command in (["run"], ["show", "run_log"]):
        result = cli(*command, env=env)
        assert result.returncode == 2 and "error: The S3 endpoint http://127.0.0.1:9 is plain HTTP: set AWS_ALLOW_HTTP=true" in result.stderr


def test_settings_layers_environment_file_and_overrides(tmp_path):
    config = tmp_path / "vars.yaml"
    config.write_text("backfill_limit_days: 7\nlookback_window_hours: 2\napp_ids: [website]\n")
    environ = {"INCREMENTAL_ASSETS_BACKFILL_LIMIT_DAYS": "3", "INCREMENTAL_ASSETS_MAX_SESSION_DAYS": "5"}
    settings = load_settings(config, {"lookback_window_hours": "1"}, environ=environ)
    assert (settings.backfill_limit_days, settings.lookback_window_hours, settings.max_session_days) == (7, 1.0, 5)
    assert settings.app_ids == ["website"]
    with pytest.raises(SettingsError, match="days_late_allowed must be an integer >= 0"):
        load_settings(overrides={"days_late_allowed": "-1"}, environ={})


def test_show_names_a_missing_table(warehouse):
    result = cli("show", "no_such_table")
    assert result.returncode == 2 and "No Delta table at" in result.stderr


def test_the_command_line_exits_with_its_own_status_whatever_python_teardown_does(tmp_path):
    """A native thread pool aborting during interpreter teardown must not turn success into failure."""
    DeltaTable.create(str(tmp_path / "t"), schema=_tiny_schema())
    script = (
        "import atexit, os, sys\n"
        "atexit.register(os.abort)  # stands in for a native pool that aborts at teardown\n"
        "from incremental_assets.cli import entry\n"
        "sys.argv = ['incremental-assets', 'show', sys.argv[1]]\n"
        "entry()\n"
    )
    env = {**os.environ, "INCREMENTAL_ASSETS_WAREHOUSE": str(tmp_path)}
    ok = subprocess.run([sys.executable, "-c", script, "t"], env=env, capture_output=True, text=True, timeout=120)
    missing = subprocess.run([sys.executable, "-c", script, "nope"], env=env, capture_output=True, text=True, timeout=120)
    assert (ok.returncode, missing.returncode) == (0, 2), ok.stderr + missing.stderr


def _tiny_schema():
    import pyarrow as pa

    return pa.schema([("id", pa.int64())])


def test_an_operators_own_dagster_yaml_is_left_as_it_was_by_every_command(tmp_path, warehouse):
    """The instance an operator configured (another run queue here; PostgreSQL storage in production)
    is the one in force: no command writes the project's template over it."""
    from incremental_assets.lib.environment import PROJECT_ROOT

    home = tmp_path / "home"
    home.mkdir()
    operators = (PROJECT_ROOT / "dagster.yaml").read_text().replace("max_concurrent_runs: 2", "max_concurrent_runs: 3") + "# mine\n"
    (home / "dagster.yaml").write_text(operators)
    env = {"DAGSTER_HOME": str(home)}
    setup = cli("setup", env=env)
    assert setup.returncode == 0 and f"{home / 'dagster.yaml'} (its own, left as it is; storage: sqlite)" in setup.stdout
    # Its tables made: the webserver, the daemon and the worker that `make ui` starts together would
    # each try to make them, and one failed ("alembic_version has more than one head").
    for database in ("history/runs.db", "history/runs/index.db", "schedules/schedules.db"):
        assert (home / database).exists(), database
    for command in (["plan"], ["apply"], ["preview"], ["run"], ["backfill", "--start", "2024-01-01", "--end", "2024-01-01"],
                    ["show", "incremental_manifest"], ["resolve", "no-such-run"]):
        cli(*command, env=env)  # most fail fast here (no source, no tables, no JVM): what matters is the file
        assert (home / "dagster.yaml").read_text() == operators, command


def test_a_worker_for_a_home_no_one_set_up_is_refused_with_the_way_to_fix_it(tmp_path):
    """Finding: a worker started with another DAGSTER_HOME silently got a SQLite dagster.yaml and
    served a home no daemon launches into."""
    home = tmp_path / "another-home"
    served = cli("serve", env={"DAGSTER_HOME": str(home)})
    assert served.returncode == 1, served.stderr
    assert f"DAGSTER_HOME={home} has no dagster.yaml, so no daemon launches runs into it" in served.stderr
    assert "start the worker with the daemon's DAGSTER_HOME" in served.stderr
    assert not (home / "dagster.yaml").exists(), "nothing written into it"


def test_a_postgresql_instance_that_refuses_the_command_is_named_at_once(tmp_path, warehouse):
    """Finding: a wrong PostgreSQL password gave six retry warnings over 44 s, then 'too many retries
    for DB connection'. Here the server (its auth is trust) refuses an unknown user the same way."""
    import shutil

    from incremental_assets.lib.environment import PROJECT_ROOT
    from tests.postgres_server import postgres_instance_env

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.postgres.yaml", home / "dagster.yaml")
    with postgres_instance_env() as postgres:
        refused = cli("run", env={**postgres, "DAGSTER_PG_USERNAME": "nobody", "DAGSTER_HOME": str(home)})
    assert refused.returncode == 2, refused.stderr
    assert (f"The Dagster instance's PostgreSQL at 127.0.0.1:{postgres['DAGSTER_PG_PORT']} (database "
            f"{postgres['DAGSTER_PG_DB']}, user nobody) refused this process") in refused.stderr, refused.stderr
    assert 'role "nobody" does not exist' in refused.stderr and "Check the DAGSTER_PG_* variables" in refused.stderr


def interpreter_that_exits(path, records=None):
    """An executable `python3` that is not the project's interpreter: it exits with an error, after
    writing its arguments to `records` when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = f"echo \"$@\" >> '{records}'\n" if records else ""
    path.write_text(f"#!/bin/sh\n{record}echo 'not the interpreter the project runs in' >&2\nexit 3\n")
    path.chmod(0o755)
    return path


def test_runs_start_no_python_worker(tmp_path):
    """Finding: every run's first Spark step made a DataFrame from Python rows, which Spark evaluates
    in a Python worker it starts beside the JVM (about 0.6 s of a cold run, benchmarks/comparisons.md).
    A run's frames are made from Arrow: with Spark's workers an interpreter that exits, a first run
    (empty manifests, tables created) passes and started none. A later run's changed keys are
    held the same way in the session (tests/pipeline/test_attributes_history.py)."""
    started = tmp_path / "python-worker-started"
    refusing = interpreter_that_exits(tmp_path / "bin" / "python3", records=started)
    (tmp_path / "home").mkdir()
    (tmp_path / "settings.yaml").write_text(f"start_date: '{date.today() - timedelta(days=3)}'\n")
    env = {**os.environ, "INCREMENTAL_ASSETS_WAREHOUSE": str(tmp_path / "warehouse"),
           "INCREMENTAL_ASSETS_CONFIG": str(tmp_path / "settings.yaml"), "DAGSTER_HOME": str(tmp_path / "home")}
    env.pop("SPARK_MASTER", None)
    command = [sys.executable, "-m", "incremental_assets"]
    generated = subprocess.run([*command, "generate", "--users", "20", "--days", "2", "--events-per-day", "200"],
                               capture_output=True, text=True, timeout=600, env=env)
    assert generated.returncode == 0, generated.stderr[-3000:]
    ran = subprocess.run([*command, "run"], capture_output=True, text=True, timeout=600, env={**env, "PYSPARK_PYTHON": str(refusing)})
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert not started.exists(), started.read_text()
    assert DeltaTable(str(tmp_path / "warehouse" / "filtered_events")).to_pyarrow_table().num_rows > 0


def test_a_sessions_python_workers_are_this_interpreter_whatever_python3_the_path_finds(tmp_path):
    """Finding: Spark started its Python workers with the `python3` the PATH found. Another
    interpreter (another minor version, one without pyspark) failed every run there (its first
    step made a frame from Python rows); a user's asset with a Python function still needs them."""
    other = interpreter_that_exits(tmp_path / "bin" / "python3")
    env = {name: value for name, value in os.environ.items() if name not in ("PYSPARK_PYTHON", "SPARK_MASTER")}
    env["PATH"] = f"{other.parent}{os.pathsep}{env['PATH']}"
    script = ("from incremental_assets.lib.spark import build_spark_session\n"
              "spark = build_spark_session(master='local[1]')\n"
              "print(spark.createDataFrame([(1,), (2,)], 'n int').selectExpr('sum(n)').first()[0])\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert ran.returncode == 0 and ran.stdout.split()[-1] == "3", ran.stdout[-3000:] + ran.stderr[-3000:]
