"""The base chain of every incremental run: its plan (limits), the session layer, this run's batch."""
