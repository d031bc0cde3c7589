"""What a person sees on the terminal: one line per finished step; Dagster's event stream goes to a file."""

from __future__ import annotations

import logging
import sys

from dagster import Field, logger
from dagster._core.log_manager import LOG_RECORD_EVENT_ATTR

STEP_ENDS = {"STEP_SUCCESS": "ok", "STEP_FAILURE": "FAILED"}


class StepProgress(logging.Handler):
    """Prints `asset  seconds  ok|FAILED` when a step ends."""

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, LOG_RECORD_EVENT_ATTR, None)
        if event is None or event.event_type_value not in STEP_ENDS:
            return
        data = event.event_specific_data
        seconds = getattr(data, "duration_ms", None)
        took = f"{seconds / 1000:6.1f}s" if seconds is not None else "      "
        print(f"    {event.step_key:<30} {took}  {STEP_ENDS[event.event_type_value]}", file=sys.stdout, flush=True)


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
