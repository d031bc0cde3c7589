"""The incremental assets: filtered_events, sessions, and a user's own (one new file here)."""
