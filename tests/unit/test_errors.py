"""What went wrong, in one line (lib/errors.py): the causes of deltalake, the JVM and the project,
and a step's failure found under Dagster's wrapping, live or serialized."""

from __future__ import annotations

from dagster._utils.error import serializable_error_info_from_exc_info

from incremental_assets.lib.errors import StepFailure, TableWriteError, one_line, step_failure

PANIC = (
    "Generic DeltaTable error: Join Error\ncaused by\n"
    'External error: task 44 panicked with message "range start index 18446744073520397944 out of range for slice of length 0"\n'
    "stack backtrace:\n   0: rust_begin_unwind\n   1: core::panicking::panic_fmt"
)
JAVA = (
    "An error occurred while calling o123.save.\n: org.apache.hadoop.fs.ParentNotDirectoryException: "
    "/w/daily_aggregates/event_date=2024-03-01 (is not a directory)\n\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs"
)


def test_deltalakes_chained_causes_make_one_line_without_the_backtrace():
    assert one_line(RuntimeError(PANIC)) == (
        "Generic DeltaTable error: Join Error; caused by: External error: task 44 panicked with message "
        '"range start index 18446744073520397944 out of range for slice of length 0"'
    )


def test_a_java_error_is_named_by_its_exception_line():
    assert one_line(RuntimeError(JAVA)) == (
        "org.apache.hadoop.fs.ParentNotDirectoryException: /w/daily_aggregates/event_date=2024-03-01 (is not a directory)"
    )


def test_a_python_error_without_a_message_is_named_by_its_type_and_a_long_one_is_cut():
    assert one_line(KeyError()) == "KeyError"
    assert one_line(ValueError("x" * 3000)) == "x" * 2000 + "..."
    assert one_line("first\nsecond") == "first"


def wrapped(error: BaseException) -> BaseException:
    """`error` as a step raises it: under the IO manager's TableWriteError, under Dagster's own."""
    try:
        try:
            try:
                raise error
            except Exception as cause:
                raise TableWriteError("/w/daily_aggregates", cause) from cause
        except TableWriteError as named:
            raise RuntimeError('Error occurred while handling output "result" of step "daily_aggregates"') from named
    except RuntimeError as outer:
        return outer


def test_a_step_failure_names_the_table_it_was_writing_live_or_serialized():
    outer = wrapped(OSError(PANIC))
    expected = StepFailure("daily_aggregates", one_line(PANIC), "/w/daily_aggregates")
    assert step_failure("daily_aggregates", outer) == expected
    serialized = serializable_error_info_from_exc_info((type(outer), outer, outer.__traceback__))
    assert step_failure("daily_aggregates", serialized) == expected
    assert str(expected) == f"daily_aggregates (writing /w/daily_aggregates): {one_line(PANIC)}"


def test_a_failure_elsewhere_keeps_its_whole_message_and_shows_its_first_line():
    try:
        try:
            raise ValueError("refused: the settings differ. Run: incremental-assets apply")
        except ValueError as cause:
            raise RuntimeError("Error occurred while executing op") from cause
    except RuntimeError as outer:
        failure = step_failure("new_event_limits", serializable_error_info_from_exc_info((type(outer), outer, outer.__traceback__)))
    assert failure == StepFailure("new_event_limits", "refused: the settings differ. Run: incremental-assets apply")
    assert str(failure) == "new_event_limits: refused: the settings differ. Run: incremental-assets apply"
