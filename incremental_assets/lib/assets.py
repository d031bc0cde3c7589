"""What every asset that writes the warehouse shares, whoever launches its run: the kinds and
owners the UI shows, the run-log hooks that close its records, the one-writer pool the run queue
limits, a Terminate that reads as one, and a write of nothing that keeps the table's data version.
The project's jobs, Dagster's own asset job (a UI materialization or backfill, `dagster asset
materialize`), sensors and declarative automation all run the same definitions, so they obey the
same contract (the lease itself is taken by a run's first writer:
lib/state/settings_plan.py::start_writing)."""

import functools
import inspect
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

from dagster import BetaWarning, Output, asset, asset_check, multi_asset
from dagster._core.definitions.data_version import extract_data_version_from_entry
from dagster._core.execution.context.compute import current_execution_context

from incremental_assets.lib.delta.spec import Rows

from incremental_assets.lib.catalog import WAREHOUSE_POOL
from incremental_assets.lib.errors import INTERRUPTED, terminated
from incremental_assets.lib.state.hooks import RUN_LOG_HOOKS
from incremental_assets.lib.state.store import run_of

OWNERS = ["team:data-engineering"]
SPARK_DELTA = {"spark", "delta"}
WRITER = {"owners": OWNERS, "hooks": RUN_LOG_HOOKS, "pool": WAREHOUSE_POOL}


def spark_delta_asset(**kwargs):
    """@asset for a Spark job on a Delta table of the warehouse."""
    return lambda compute: asset(kinds=SPARK_DELTA, **WRITER, **kwargs)(warehouse_step(compute, _as_its_version))


def spark_delta_multi_asset(**kwargs):
    """@multi_asset whose outputs are Delta tables of the warehouse (each out says its kinds)."""
    return lambda compute: multi_asset(hooks=RUN_LOG_HOOKS, pool=WAREHOUSE_POOL, **kwargs)(
        warehouse_step(compute, _as_its_version))


def warehouse_check(**kwargs):
    """@asset_check on a table of the warehouse: a check step can be the one a Terminate lands in."""
    return lambda compute: asset_check(**kwargs)(warehouse_step(compute))


def warehouse_step(compute: Callable, each_result: Callable = lambda result: result) -> Callable:
    """The step `compute`, whose error while its run is being canceled (a Terminate in the UI) says
    so (lib/errors.terminated; the IO manager does the same for the write), and whose every result
    (each one it yields, or the one it returns) is passed through `each_result`."""
    if inspect.isgeneratorfunction(compute):
        @functools.wraps(compute)
        def steps(*args, **kwargs):
            with _terminate_named():
                for result in compute(*args, **kwargs):
                    yield each_result(result)
        return steps

    @functools.wraps(compute)
    def step(*args, **kwargs):
        with _terminate_named():
            return each_result(compute(*args, **kwargs))
    return step


def _as_its_version(result):
    """`result`, with its table's latest data version when it writes nothing (Rows(None): the table
    stays as it is) to an unpartitioned table that has one. Dagster gives every materialization a
    new one, so the UI marked what reads the table stale ("has a new dependency materialization")
    after a run that changed no row of it: attributes, after attributes_history alone over unchanged
    daily_aggregates. A partition's write is each partition's own: left to Dagster."""
    value = result.value if isinstance(result, Output) else result
    if not (value is None or isinstance(value, Rows) and value.frame is None):
        return result
    context = current_execution_context.get()  # None outside a run (a direct call)
    if context is None or context.assets_def.partitions_def is not None:
        return result
    name = result.output_name if isinstance(result, Output) else "result"
    record = context.instance.get_latest_data_version_record(context.asset_key_for_output(name))
    version = extract_data_version_from_entry(record.event_log_entry) if record else None
    if version is None:
        return result
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)  # Output's data_version is beta in Dagster 1.13
        if isinstance(result, Output):
            return Output(value, name, metadata=result.metadata, data_version=version, tags=result.tags)
        return Output(value, data_version=version)


@contextmanager
def _terminate_named() -> Iterator[None]:
    try:
        yield
    except INTERRUPTED as error:
        context = current_execution_context.get()  # an asset's or a check's; None outside a run (a direct call)
        told = terminated(error, context.instance, run_of(context), context.op_execution_context.op.name) if context else None
        if told is None:
            raise
        raise told from None
