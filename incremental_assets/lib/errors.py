"""What went wrong, in one line, wherever it is told: the terminal, the run log, the UI.

A step's failure is named by the step, the table it was writing (when an engine failed under the
write: deltalake's Rust, Spark's JVM) and the cause's one line; the whole error, with any Java
frames or Rust backtrace, goes to the log file only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NoReturn

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Failure
from dagster._core.errors import DagsterExecutionInterruptedError

# What a step may raise once its run is canceled: Dagster's interrupt (no message), or, once a
# Spark session exists, whatever the Spark call under way raised when pyspark's SIGINT handler
# cancelled the JVM's jobs ("Py4JError ... o287.cache").
INTERRUPTED = (Exception, KeyboardInterrupt, DagsterExecutionInterruptedError)

MAX_LINE = 2000


class TableWriteError(RuntimeError):
    """A write of the table at `uri` that failed below the project, in an engine. Its cause stays
    chained (`raise ... from`), for the log."""

    PREFIX = "writing "

    def __init__(self, uri: str, cause: BaseException):
        super().__init__(f"{self.PREFIX}{uri}: {one_line(cause)}")


class RunRefused(Failure):
    """A run ended as canceled before it wrote (refuse_run)."""


def refuse_run(instance: DagsterInstance, run: DagsterRun, why: str, cause: BaseException | None = None) -> NoReturn:
    """End a run that must not write as canceled, before it writes: RunRefused saying `why`. Not a
    failure of the data: Dagster then resolves the run's planned checks as skipped and leaves its
    assets as they were, where a failed run paints both red. The RUN_CANCELING line says why (its
    first sentence)."""
    instance.report_run_canceling(run, message=why.split(". ")[0])
    raise RunRefused(description=why, allow_retries=False) from cause


def terminated(error: BaseException, instance: DagsterInstance | None, run_id: str | None, step: str) -> BaseException | None:
    """What a step's `error` becomes when its run is being canceled (a Terminate in the UI): it
    says so. An interrupt stays one (the run stops there); an error becomes a Failure (the step's
    hooks close its records). None: the run is not being canceled, and the error is told as it is."""
    if instance is None or run_id is None or isinstance(error, RunRefused):
        return None
    run = instance.get_run_by_id(run_id)
    if run is None or run.status not in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED):
        return None
    told = f"terminated: run {run_id} was canceled while {step} ran"
    if isinstance(error, Exception):
        return Failure(description=f"{told} (the Spark call under way ended with: {one_line(error)})", allow_retries=False)
    return DagsterExecutionInterruptedError(told)


def one_line(error: BaseException | str) -> str:
    """The message a user can act on, in one line. Spark's errors carry their class and message on
    the first line, Java frames after; deltalake's chain its causes over several lines ("caused
    by"), a Rust backtrace after them when RUST_BACKTRACE is set; a Python error without a message
    is named by its type."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines()]
    if not lines:
        return type(error).__name__
    first = lines[0]
    if "JVM stacktrace" in first or first.startswith("An error occurred while calling"):
        first = next((line for line in lines if "Exception:" in line or "[" in line), first).removeprefix(": ")
    elif "caused by" in lines:  # deltalake's: "A", "caused by", "B", then any backtrace
        shown = lines[:lines.index("stack backtrace:")] if "stack backtrace:" in lines else lines
        first = "; caused by: ".join(line for line in shown if line and line != "caused by")
    return first if len(first) <= MAX_LINE else first[:MAX_LINE] + "..."


@dataclass(frozen=True)
class StepFailure:
    """A failed step: which, the table it was writing (None: it failed elsewhere), and why (the
    whole message; its line is `str`'s)."""

    step: str
    cause: str
    table: str | None = None

    def __str__(self) -> str:
        where = f" (writing {self.table})" if self.table else ""
        return f"{self.step}{where}: {one_line(self.cause)}"


def step_failure(step: str, error: Any) -> StepFailure:
    """The failure of `step` from its error: a live exception (a failure hook's) or Dagster's
    serialized one (a run's step failure event), under Dagster's wrapping ("Error occurred while
    handling output...")."""
    chain = list(_chain(error))
    for name, message in chain:
        if name == TableWriteError.__name__:
            table, cause = message.removeprefix(TableWriteError.PREFIX).split(": ", 1)
            return StepFailure(step, cause, table)
    return StepFailure(step, chain[-1][1])


def _chain(error: Any) -> Iterator[tuple[str, str]]:
    """(class name, message without its class) of `error` and each error it was raised from."""
    while error is not None:
        if isinstance(error, BaseException):
            yield type(error).__name__, str(error)
            error = error.__cause__
        else:  # dagster's SerializableErrorInfo: "module.Class: message" on the first line
            message, prefix = error.message.strip(), f"{error.cls_name}: "
            first, _, rest = message.partition("\n")
            yield error.cls_name, (first.split(prefix, 1)[1] if prefix in first else first) + (f"\n{rest}" if rest else "")
            error = error.cause
