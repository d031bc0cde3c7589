"""Where things live: warehouse, source table, Dagster home and the Delta jar cache.

Every location comes from an environment variable with a project-local default, so a fresh
clone works without configuration and a deployment points the same code elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from incremental_assets.lib.catalog import ATOMIC_EVENTS

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def warehouse_root() -> str:
    """Warehouse root: a local path (made absolute) or an object-store URI passed through."""
    root = os.environ.get("INCREMENTAL_ASSETS_WAREHOUSE", "./warehouse")
    return root if is_uri(root) else str(Path(root).resolve())


def table_uri(name: str, root: str | None = None) -> str:
    """The location of the Delta table `name` under the warehouse root."""
    base = root or warehouse_root()
    if not is_uri(base):
        base = str(Path(base).resolve())
    return f"{base.rstrip('/')}/{name}"


def source_table_uri() -> str:
    """The source events table: the sample table unless INCREMENTAL_ASSETS_SOURCE says otherwise."""
    source = os.environ.get("INCREMENTAL_ASSETS_SOURCE")
    if not source:
        return table_uri(ATOMIC_EVENTS)
    return source if is_uri(source) else str(Path(source).resolve())


def jar_cache_dir() -> Path:
    """Where the Delta jars are resolved once at set-up and read from on every Spark start."""
    return Path(os.environ.get("INCREMENTAL_ASSETS_JAR_CACHE", PROJECT_ROOT / ".cache" / "spark-jars"))


def is_uri(location: str) -> bool:
    return "://" in location


def dagster_home() -> Path:
    """DAGSTER_HOME (default .dagster_home/ in the project). A home without a dagster.yaml gets the
    project's; an operator's own (PostgreSQL storage, their run queue) is never touched."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home")))
    home.mkdir(parents=True, exist_ok=True)
    template, config = PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml"
    if template.exists() and not config.exists():
        config.write_text(template.read_text())
    return home


def instance_config(home: Path) -> str:
    """Which dagster.yaml is in force in `home`, and where it keeps runs and events: what `setup`
    tells an operator, whose own file is left as it is."""
    config = home / "dagster.yaml"
    if not config.exists():
        return "no dagster.yaml: Dagster's defaults, SQLite"
    text = config.read_text()
    settings = yaml.safe_load(text) or {}
    if "storage" in settings:
        storage = next(iter(settings["storage"]))
    else:  # the older form names each storage's class; runs' stands for the three
        storage = (settings.get("run_storage") or {}).get("class", "sqlite")
    whose = "the project's" if text == (PROJECT_ROOT / "dagster.yaml").read_text() else "its own, left as it is"
    return f"{config} ({whose}; storage: {storage})"
