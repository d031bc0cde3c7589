"""The daily layer: the daily aggregation manifest, daily_aggregates (day partitions) and attributes."""
