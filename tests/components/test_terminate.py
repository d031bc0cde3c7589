"""A user's Terminate reads as terminated: the step that was running when its run was marked
canceling fails with "terminated: ...", not with whatever the Spark call under way raised when
pyspark's SIGINT handler cancelled the JVM's jobs, in the step's code or in its write; the same
error in a run nobody canceled is told as it is. (The interrupt itself, in a real worker: tests/system/test_warm_worker.py.)"""

import dagster as dg
import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, materialize
from dagster._core.execution.plan.objects import ErrorSource

from incremental_assets.lib.assets import spark_delta_asset, warehouse_check
from incremental_assets.lib.delta.io_manager import DeltaIOManager
from incremental_assets.lib.delta.spec import delta_table
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.errors import step_failure
from incremental_assets.lib.state.store import StateStore

SPARK_ERROR = "An error occurred while calling o287.cache"


def _probe(cancel: bool, generator: bool, error: BaseException = RuntimeError(SPARK_ERROR)):
    """An asset whose Spark call fails (or is interrupted), after the run was marked canceling (cancel) or not."""
    def fail(context):
        if cancel:
            context.instance.report_run_canceling(context.run)  # what the UI's Terminate does first
        raise error

    if generator:
        @spark_delta_asset(name="probe")
        def probe(context):
            yield from ()
            fail(context)
    else:
        @spark_delta_asset(name="probe")
        def probe(context):
            fail(context)
    return probe


def _step_error(instance: DagsterInstance, run_id: str) -> str:
    """The step's failure as the terminal and the run log tell it."""
    [failure] = instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
    return str(step_failure("probe", failure.dagster_event.step_failure_data.error))


@pytest.mark.parametrize("generator", [False, True], ids=["returns", "yields"])
def test_a_step_failing_in_a_canceled_run_says_terminated(warehouse, generator):
    instance = DagsterInstance.ephemeral()
    result = materialize([_probe(cancel=True, generator=generator)], resources={"state": StateStore()},
                         instance=instance, raise_on_error=False)
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    error = _step_error(instance, result.run_id)
    assert error.startswith(f"probe: terminated: run {result.run_id} was canceled while probe ran")
    assert SPARK_ERROR in error  # what ended the call, for whoever looks further


def test_the_same_error_in_a_run_nobody_canceled_is_told_as_it_is(warehouse):
    instance = DagsterInstance.ephemeral()
    result = materialize([_probe(cancel=False, generator=False)], resources={"state": StateStore()},
                         instance=instance, raise_on_error=False)
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.FAILURE
    error = _step_error(instance, result.run_id)
    assert error == f"probe: {SPARK_ERROR}"


def test_an_interrupt_in_a_canceled_run_says_terminated_and_stays_an_interrupt(warehouse):
    """Before a Spark session exists, Dagster's own interrupt lands, without a message."""
    instance = DagsterInstance.ephemeral()
    result = materialize([_probe(cancel=True, generator=False, error=KeyboardInterrupt())], resources={"state": StateStore()},
                         instance=instance, raise_on_error=False)
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    [failure] = instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_FAILURE)
    assert failure.dagster_event.step_failure_data.error_source == ErrorSource.INTERRUPT
    assert _step_error(instance, result.run_id) == f"probe: terminated: run {result.run_id} was canceled while probe ran"


def test_an_interrupt_in_a_check_of_a_canceled_run_says_terminated(warehouse):
    """A warm run's step can end before the Terminate lands: the check step after it says so too."""
    @spark_delta_asset(name="probe")
    def probe():
        return None

    @warehouse_check(asset="probe")
    def probe_holds(context):
        context.instance.report_run_canceling(context.run)
        raise KeyboardInterrupt

    instance = DagsterInstance.ephemeral()
    result = materialize([probe, probe_holds], resources={"state": StateStore(), "io_manager": _NoStore()},
                         instance=instance, raise_on_error=False)
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    [failure] = instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_FAILURE)
    assert str(failure.dagster_event.step_failure_data.error.message).startswith(
        f"dagster._core.errors.DagsterExecutionInterruptedError: terminated: run {result.run_id} was canceled while probe_probe_holds ran")


class _NoStore(dg.IOManager):
    def handle_output(self, context, obj):
        pass

    def load_input(self, context):
        return None


class _Stalled:
    """A value whose write the run's Terminate interrupts (in the IO manager, after the step's code)."""


class _StalledWrite:
    stores = loads = (_Stalled,)

    def store(self, context, table, value, spark):
        context.step_context.instance.report_run_canceling(context.step_context.dagster_run)
        raise RuntimeError(SPARK_ERROR)


class _IOManager(DeltaIOManager):
    def type_handlers(self):
        return [_StalledWrite()]


def test_a_write_failing_in_a_canceled_run_says_terminated(warehouse):
    @spark_delta_asset(name="probe", metadata=delta_table("append"))
    def probe():
        return _Stalled()

    instance = DagsterInstance.ephemeral()
    result = materialize([probe], resources={"state": StateStore(), "io_manager": _IOManager(spark=SparkResource())},
                         instance=instance, raise_on_error=False)
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    assert _step_error(instance, result.run_id).startswith(f"probe: terminated: run {result.run_id} was canceled while probe ran")
