"""Where things live: warehouse, source table, Dagster home and the Delta jar cache.

Every location comes from an environment variable with a project-local default, so a fresh
clone works without configuration and a deployment points the same code elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from incremental_assets.lib.catalog import ATOMIC_EVENTS

PROJECT_ROOT = Path(__file__).resolve().parents[2]
OBJECT_STORE_SCHEMES = ("s3", "s3a")


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


def is_object_store(location: str) -> bool:
    """An S3 API URI: `s3://` and `s3a://` name the same object for Spark (S3A serves both) and
    deltalake."""
    return is_uri(location) and location.split("://", 1)[0] in OBJECT_STORE_SCHEMES


def on_object_store() -> bool:
    return is_object_store(warehouse_root()) or is_object_store(source_table_uri())


@dataclass(frozen=True)
class S3Endpoint:
    """Where the S3 API answers, from the standard AWS variables, which deltalake reads itself and
    Spark's S3A is set from (lib/spark.py). Credentials are not here: both take them from the AWS
    chain (environment, profile, instance role) on each machine."""

    url: str | None
    region: str | None
    virtual_hosted: bool  # buckets as host names; deltalake's default, and so S3A's, is by path


def s3_endpoint() -> S3Endpoint:
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if url and url.startswith("http://") and os.environ.get("AWS_ALLOW_HTTP", "").lower() != "true":
        raise ValueError(f"The S3 endpoint {url} is plain HTTP: set AWS_ALLOW_HTTP=true to accept it "
                         "(deltalake refuses it otherwise), or use https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return S3Endpoint(url, region, os.environ.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() == "true")


def home_dir() -> Path:
    """DAGSTER_HOME's path (default .dagster_home/ in the project), as it is: nothing written."""
    return Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home")))


def dagster_home() -> Path:
    """DAGSTER_HOME, ready for an instance: a home without a dagster.yaml gets the project's; an
    operator's own (PostgreSQL storage, their run queue) is never touched."""
    home = home_dir()
    home.mkdir(parents=True, exist_ok=True)
    template, config = PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml"
    if template.exists() and not config.exists():
        config.write_text(template.read_text())
    return home


def run_log_file() -> Path:
    """Where the command line sends Dagster's event stream and what native code prints (the
    terminal gets a line per step)."""
    return home_dir() / "logs" / "incremental-assets.log"


SQLITE_STORAGE_MODULE = "incremental_assets.lib.instance_storage"


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
        if settings["storage"].get("custom", {}).get("module") == SQLITE_STORAGE_MODULE:
            storage = "sqlite"  # Dagster's files, through the project's storages (lib/instance_storage.py)
    else:  # the older form names each storage's class; runs' stands for the three
        storage = (settings.get("run_storage") or {}).get("class", "sqlite")
    whose = "the project's" if text == (PROJECT_ROOT / "dagster.yaml").read_text() else "its own, left as it is"
    return f"{config} ({whose}; storage: {storage})"


WARM_LAUNCHER = {"module": "incremental_assets.lib.worker", "class": "WarmRunLauncher"}


def instance_gaps(settings: Mapping[str, Any]) -> list[str]:
    """What a home's dagster.yaml (parsed) lacks of what the project needs, as the project's own
    dagster.yaml sets it: one writing run at a time (the pool), and runs launched into the warm
    worker; and a limit an earlier release set that no longer limits anything. Empty: nothing."""
    gaps = []
    pools = (settings.get("concurrency") or {}).get("pools") or {}
    if pools.get("granularity") != "run" or pools.get("default_limit") != 1:
        gaps.append("concurrency.pools (granularity: run, default_limit: 1): without it a second writing run "
                    "is refused by the lease instead of waiting in the queue")
    launcher = settings.get("run_launcher") or {}
    if {key: launcher.get(key) for key in WARM_LAUNCHER} != WARM_LAUNCHER:
        gaps.append("run_launcher (incremental_assets.lib.worker.WarmRunLauncher): without it no launched run "
                    "uses the warm worker")
    limits = ((settings.get("run_coordinator") or {}).get("config") or {}).get("tag_concurrency_limits") or []
    if any(str(limit.get("key", "")).startswith("incremental_assets/") for limit in limits):
        gaps.append("run_coordinator's tag_concurrency_limits on incremental_assets/ tags: an earlier release's, "
                    "no run carries them now (the pool above replaces them)")
    return gaps


def instance_advice(home: Path) -> str | None:
    """One line naming what the home's dagster.yaml lacks and how to add it (never rewritten)."""
    config = home / "dagster.yaml"
    gaps = instance_gaps(yaml.safe_load(config.read_text()) or {}) if config.exists() else []
    if not gaps:
        return None
    return (f"{config} lacks what the project needs: {'; '.join(gaps)}. Merge those blocks from "
            f"{PROJECT_ROOT / 'dagster.yaml'} into it (it is yours: never rewritten), then restart the daemon")


class InstanceUnreachable(RuntimeError):
    """The Dagster instance's PostgreSQL refuses this process: named at once, not after Dagster's retries."""


def check_instance_storage(home: Path) -> None:
    """When the home's dagster.yaml keeps the instance in PostgreSQL, one connection to it, within 5 s:
    a refusal (a wrong password, an unknown user or database, no server) raises InstanceUnreachable
    with the server's own reason, where Dagster retries for most of a minute and then says only
    'too many retries for DB connection'."""
    config = home / "dagster.yaml"
    storage = ((yaml.safe_load(config.read_text()) or {}).get("storage") or {}) if config.exists() else {}
    postgres = storage.get("postgres") if isinstance(storage, dict) else None
    if not postgres:
        return
    import psycopg2  # the postgres extra: installed wherever such a dagster.yaml is used

    def value(setting: Any) -> Any:
        return os.environ.get(setting["env"], "") if isinstance(setting, dict) and "env" in setting else setting

    if postgres.get("postgres_url") is not None:
        target, where = {"dsn": value(postgres["postgres_url"])}, "the PostgreSQL of postgres_url"
    else:
        db = {key: value(setting) for key, setting in (postgres.get("postgres_db") or {}).items()}
        target = {"host": db.get("hostname"), "port": db.get("port") or 5432, "dbname": db.get("db_name"),
                  "user": db.get("username"), "password": db.get("password") or None}
        where = f"PostgreSQL at {target['host']}:{target['port']} (database {target['dbname']}, user {target['user']})"
    try:
        psycopg2.connect(connect_timeout=5, **target).close()
    except psycopg2.OperationalError as refused:
        reason = " ".join(str(refused).split()) or type(refused).__name__
        raise InstanceUnreachable(
            f"The Dagster instance's {where} refused this process: {reason}. Check the DAGSTER_PG_* variables (or "
            f"the storage block of {config})"
        ) from None


WRITE_ENGINE_ENV = "INCREMENTAL_ASSETS_WRITE_ENGINE"
WRITE_ENGINES = ("auto", "spark")


def small_writes_by_deltalake() -> bool:
    """Whether a write of few rows goes through deltalake (`auto`, the default) or every write
    through Spark (`spark`): an operator's way around a fault in deltalake's path. Both leave the
    same tables (tests/components/test_write_engines.py)."""
    engine = os.environ.get(WRITE_ENGINE_ENV, "auto").strip().lower() or "auto"
    if engine not in WRITE_ENGINES:
        raise ValueError(f"{WRITE_ENGINE_ENV}={engine!r}: expected one of {', '.join(WRITE_ENGINES)}")
    return engine == "auto"
