"""What exists: one module per domain, each with its definitions (a defs(settings) function, or assets and checks at module level)."""
