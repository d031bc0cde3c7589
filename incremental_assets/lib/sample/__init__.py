"""The embedded sample source: a seeded stream of Snowplow-shaped atomic events."""
