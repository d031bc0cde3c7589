"""Names that several modules share: tables (= asset names), groups and jobs (SPEC §10)."""

NEW_EVENT_LIMITS = "new_event_limits"
LIFECYCLE = "sessions_lifecycle_manifest"
QUARANTINE = "quarantined_sessions"
EVENTS_THIS_RUN = "events_this_run"
FILTERED_EVENTS = "filtered_events"
DAILY_AGGREGATES = "daily_aggregates"
ATTRIBUTES = "attributes"
SESSIONS = "sessions"

BASE_GROUP = "incremental_base"
INCREMENTAL_GROUP = "incremental"
DAILY_GROUP = "daily"

INCREMENTAL_JOB = "incremental_job"
DAILY_JOB = "daily_job"

# Asset tag of the incremental assets: the ones the incremental manifest tracks.
INCREMENTAL_TAG = "incremental_assets/incremental"
