"""The state of the warehouse: manifests, run log and lease, table fingerprints and plans, refresh and maintenance."""
