"""A user's Terminate reads as terminated: the step that was running when its run was marked
canceling fails with "terminated: ...", not with whatever the Spark call under way raised when
pyspark's SIGINT handler cancelled the JVM's jobs; the same error in a run nobody canceled is
told as it is. (The interrupt itself, in a real worker: tests/system/test_warm_worker.py.)"""

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, materialize

from incremental_assets.lib.assets import spark_delta_asset
from incremental_assets.lib.errors import step_failure
from incremental_assets.lib.state.store import StateStore

SPARK_ERROR = "An error occurred while calling o287.cache"


def _probe(cancel: bool, generator: bool):
    """An asset whose Spark call fails, after the run was marked canceling (cancel) or not."""
    def fail(context):
        if cancel:
            context.instance.report_run_canceling(context.run)  # what the UI's Terminate does first
        raise RuntimeError(SPARK_ERROR)

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
