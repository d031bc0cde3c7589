"""What every asset that writes the warehouse shares, whoever launches its run: the kinds and
owners the UI shows, the run-log hooks that close its records, and the one-writer pool the run
queue limits. The project's jobs, Dagster's own asset job (a UI materialization or backfill,
`dagster asset materialize`), sensors and declarative automation all run the same definitions, so
they obey the same contract (the lease itself is taken by a run's first writer:
lib/state/settings_plan.py::start_writing)."""

from dagster import asset, multi_asset

from incremental_assets.lib.catalog import WAREHOUSE_POOL
from incremental_assets.lib.state.hooks import RUN_LOG_HOOKS

OWNERS = ["team:data-engineering"]
SPARK_DELTA = {"spark", "delta"}
WRITER = {"owners": OWNERS, "hooks": RUN_LOG_HOOKS, "pool": WAREHOUSE_POOL}


def spark_delta_asset(**kwargs):
    """@asset for a Spark job on a Delta table of the warehouse."""
    return asset(kinds=SPARK_DELTA, **WRITER, **kwargs)


def spark_delta_multi_asset(**kwargs):
    """@multi_asset whose outputs are Delta tables of the warehouse (each out says its kinds)."""
    return multi_asset(hooks=RUN_LOG_HOOKS, pool=WAREHOUSE_POOL, **kwargs)
