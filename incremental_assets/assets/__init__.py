"""Assets by domain: limits, sessions, events, daily layer, sample source, source summary."""

from dagster import asset

OWNERS = ["team:data-engineering"]
SPARK_DELTA = {"spark", "delta"}


def spark_delta_asset(**kwargs):
    """@asset for a Spark job on a Delta table: the kinds and owners every such asset shares."""
    return asset(kinds=SPARK_DELTA, owners=OWNERS, **kwargs)
