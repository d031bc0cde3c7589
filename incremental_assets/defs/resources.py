"""The resources every run shares: Spark (one session per run), the settings (per run from the
launchpad), the state store (manifests, run log, fingerprints), and the warehouse's IO manager."""

from typing import Any

from dagster import Definitions

from incremental_assets.lib.delta.io_manager import DeltaIOManager, TypeHandler
from incremental_assets.lib.incremental.batch import BatchHandler
from incremental_assets.lib.incremental.run_plan import PlanHandler
from incremental_assets.lib.settings import IncrementalSettings
from incremental_assets.lib.spark import SparkResource
from incremental_assets.lib.state.hooks import as_markdown
from incremental_assets.lib.state.store import StateStore


class WarehouseIOManager(DeltaIOManager):
    """The Delta IO manager with the handlers of a run's plan and batch, showing with each table the
    run's records in the run log and the fingerprint the table was built under."""

    state: StateStore

    def type_handlers(self) -> list[TypeHandler]:
        return [*super().type_handlers(), PlanHandler(), BatchHandler()]

    def shown(self, table: str, run_id: str) -> dict[str, Any]:
        shown: dict[str, Any] = {"run_log": as_markdown(self.state.appended_here(run_id))}
        stored = self.state.fingerprints().get(table)
        if stored is not None:
            shown.update(fingerprint=stored.fingerprint.digest, fingerprint_since=str(stored.since))
            if stored.effective_from is not None:
                shown["fingerprint_effective_from"] = str(stored.effective_from)
        return shown


def defs(settings: IncrementalSettings) -> Definitions:
    spark, state = SparkResource(), StateStore()
    return Definitions(
        resources={
            "spark": spark,
            "io_manager": WarehouseIOManager(spark=spark, state=state),
            "state": state,
            "settings": settings,
        }
    )
