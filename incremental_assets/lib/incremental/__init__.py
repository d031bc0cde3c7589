"""The cursor contract: run limits and states, a run's plan and batch, the day rule, and the @incremental_asset extension point."""
