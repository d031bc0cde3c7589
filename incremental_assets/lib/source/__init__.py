"""The source events table: its contract, the loader, the one timestamp rule, and rows as they arrive."""
