"""Operations on the whole warehouse, each under the run log's lease: a full refresh, table
maintenance, and carrying out the plan of a settings change."""
