"""What a person sees on the terminal: one line per finished step; Dagster's event stream goes to a file."""

from __future__ import annotations

import logging
import sys

from dagster import AssetCheckSeverity, Field, logger
from dagster._core.log_manager import LOG_RECORD_EVENT_ATTR

STEP_ENDS = {"STEP_SUCCESS": "ok", "STEP_FAILURE": "FAILED"}
CHECK_EVALUATION = "ASSET_CHECK_EVALUATION"


class StepProgress(logging.Handler):
    """Prints `asset  seconds  ok|FAILED` when a step ends. A step that succeeded although a check of
    it did not pass (a warning) prints the check's severity, `warn`, and its reason instead of `ok`:
    the reason comes from the step's ASSET_CHECK_EVALUATION event, which precedes its end."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.unpassed: dict[str, list] = {}  # step key -> evaluations of its checks that did not pass

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, LOG_RECORD_EVENT_ATTR, None)
        if event is None:
            return
        data = event.event_specific_data
        if event.event_type_value == CHECK_EVALUATION and not data.passed:
            self.unpassed.setdefault(event.step_key, []).append(data)
        if event.event_type_value not in STEP_ENDS:
            return
        seconds = getattr(data, "duration_ms", None)
        took = f"{seconds / 1000:6.1f}s" if seconds is not None else "      "
        unpassed = self.unpassed.pop(event.step_key, [])
        outcome = STEP_ENDS[event.event_type_value]
        if unpassed and event.is_step_success:
            severity = "error" if any(e.severity == AssetCheckSeverity.ERROR for e in unpassed) else "warn"
            outcome = f"{severity}  " + "; ".join(e.description or f"{e.check_name} did not pass" for e in unpassed)
        print(f"    {event.step_key:<30} {took}  {outcome}", file=sys.stdout, flush=True)


@logger(
    config_schema={"path": Field(str, description="File that receives every Dagster event of the run")},
    description="The command line's logger: the event stream to a file, a progress line per step to stdout.",
)
def cli_logger(init_context):
    log = logging.Logger("incremental_assets", level=logging.DEBUG)
    to_file = logging.FileHandler(init_context.logger_config["path"])
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(to_file)
    log.addHandler(StepProgress(level=logging.DEBUG))
    return log
