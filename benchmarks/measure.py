"""What the benchmark scripts share: a cold Spark start, and where their numbers go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def cold_spark_start_seconds(session_args: str = "") -> float:
    """A cold start in a fresh process: JVM, Delta jars from the cache, session.
    `session_args`: keyword arguments of build_spark_session, as Python source."""
    code = (
        "import time; t = time.perf_counter();"
        "from incremental_assets.lib.spark import build_spark_session;"
        f"build_spark_session({session_args}); print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def save_results(name: str, results: dict) -> None:
    """Print the numbers (a section per nested dict) and write them to benchmarks/results/<name>.json."""
    _print(results)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")


def _print(numbers: dict, indent: str = "") -> None:
    for key, value in numbers.items():
        if isinstance(value, dict):
            print(f"{indent}{key}")
            _print(value, indent + "  ")
        else:
            print(f"{indent}{key:<40}{value if isinstance(value, (int, float, str)) else json.dumps(value):>12}")
