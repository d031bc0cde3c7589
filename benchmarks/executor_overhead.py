"""How long a Spark start costs, and what the in-process executor saves over the multiprocess one.

Runs a chain of three small Spark assets twice through a real Dagster instance: once with the
in-process executor (one process, one SparkSession for the run) and once with the multiprocess
executor (one process, hence one JVM, per step). Prints the numbers and writes
benchmarks/results/executor_overhead.json.

    .venv/bin/python benchmarks/executor_overhead.py
"""

from __future__ import annotations

import tempfile
import time

from dagster import (
    DagsterInstance,
    Definitions,
    asset,
    define_asset_job,
    execute_job,
    in_process_executor,
    multiprocess_executor,
    reconstructable,
)
from pyspark.sql import functions as F

from incremental_assets.lib.spark import SparkResource

from measure import cold_spark_start_seconds, save_results


@asset
def step_one(spark: SparkResource) -> None:
    spark.spark_session.range(1000).count()


@asset(deps=[step_one])
def step_two(spark: SparkResource) -> None:
    spark.spark_session.range(1000).selectExpr("sum(id)").first()


@asset(deps=[step_two])
def step_three(spark: SparkResource) -> None:
    spark.spark_session.range(1000).groupBy((F.col("id") % 7).alias("k")).count().collect()


def _job(executor):
    defs = Definitions(
        assets=[step_one, step_two, step_three],
        jobs=[define_asset_job("chain", executor_def=executor)],
        resources={"spark": SparkResource(master="local[2]", shuffle_partitions=2)},
    )
    return defs.resolve_job_def("chain")


def in_process_job():
    return _job(in_process_executor)


def multiprocess_job():
    return _job(multiprocess_executor)


def _timed_run(job_fn, instance) -> float:
    started = time.perf_counter()
    with execute_job(reconstructable(job_fn), instance=instance) as result:
        assert result.success
    return time.perf_counter() - started


def main() -> None:
    results = {"spark_session_start_seconds": round(cold_spark_start_seconds("master='local[2]', shuffle_partitions=2"), 1)}
    with tempfile.TemporaryDirectory() as home:
        instance = DagsterInstance.local_temp(home)
        # In-process first, in this fresh process: its time includes the one cold JVM start.
        results["in_process_run_seconds"] = round(_timed_run(in_process_job, instance), 1)
        results["multiprocess_run_seconds"] = round(_timed_run(multiprocess_job, instance), 1)
    save_results("executor_overhead", results)


if __name__ == "__main__":
    main()
