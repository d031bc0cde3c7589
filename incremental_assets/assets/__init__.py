"""Assets by domain: limits, sessions, events, sample source, source summary."""

from dagster import asset

OWNERS = ["team:data-engineering"]


def spark_delta_asset(**kwargs):
    """@asset for a Spark job that writes a Delta table: the kinds and owners every such asset shares."""
    return asset(kinds={"spark", "delta"}, owners=OWNERS, **kwargs)
