"""The Dagster instance's SQLite storage (dagster.yaml's `storage` block), keeping its engines.

Dagster's SQLite storages build a SQLAlchemy engine for every connection and drop it after, so every
statement is compiled again: a run stores about a hundred events, each over several connections, and
that cost about 0.4 s of Python per run (benchmarks/comparisons.md). These keep one engine per
database file for the process's life. An engine keeps no connection here (NullPool, as Dagster's):
only the dialect and the compiled statements, so the files, their locking and what is stored are
Dagster's, unchanged. Dagster's version is pinned (pyproject.toml): the methods replaced are its
internal `connect`s, and tests/components/test_instance_storage.py holds them equal to its own.
"""

from contextlib import contextmanager
from functools import lru_cache

from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

# One per run's event file the process touches; the webserver browses many runs, so it is bounded.
KEPT_ENGINES = 64


@lru_cache(maxsize=KEPT_ENGINES)
def kept_engine(url: str, busy_timeout: float | None = None):
    """The process's engine for one SQLite file, with the arguments Dagster's storage gives it."""
    connect_args = {} if busy_timeout is None else {"timeout": busy_timeout}
    return create_engine(url, poolclass=NullPool, connect_args=connect_args)


@contextmanager
def _transaction(engine):
    with engine.connect() as conn, conn.begin():
        yield conn


class EventLogKeepingEngines(SqliteEventLogStorage):
    @contextmanager
    def _connect(self, shard: str):
        with self._db_lock:
            engine = kept_engine(self.conn_string_for_shard(shard), SQLITE_BUSY_TIMEOUT_SECONDS)
            if shard not in self._initialized_dbs:  # a run's file is created on its first event
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with _transaction(engine) as conn:
                yield conn


class _KeptEngineConnect:
    """The `connect` of Dagster's run and schedule storages (one file each), through its kept engine."""

    @contextmanager
    def connect(self):
        with _transaction(kept_engine(self._conn_string)) as conn:
            yield conn


class RunStorageKeepingEngines(_KeptEngineConnect, SqliteRunStorage):
    pass


class ScheduleStorageKeepingEngines(_KeptEngineConnect, SqliteScheduleStorage):
    pass


class SqliteStorageKeepingEngines(DagsterSqliteStorage):
    """Dagster's SQLite storage under `base_dir` (the same files, laid out the same way), whose three
    stores keep their engines."""

    def __init__(self, base_dir: str, inst_data=None):
        self.base_dir = base_dir
        self._run_storage = RunStorageKeepingEngines.from_local(_runs_directory(base_dir))
        self._event_log_storage = EventLogKeepingEngines(_event_logs_directory(base_dir))
        self._schedule_storage = ScheduleStorageKeepingEngines.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        DagsterStorage.__init__(self)

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls.from_local(inst_data=inst_data, **config_value)  # Dagster's names its own class
