"""Rows that arrive in the source, and whether a window will ever read them.

Incremental runs read the source by cursor windows. A row whose cursor lies behind the next window
(an archive loaded after go-live, a restored backup, another loader's old rows) is never read by
one, nor is a row before start_date; a row stamped after `now` waits for its time. Each row that
arrives is classified once, by the first run (or load) that sees it, so that none of them is lost
without a count. The rule is stated once, as data (`ArrivalBounds.rule`), and evaluated on plain
values, on Arrow arrays (a run, without a JVM) and on Spark columns (a load, before it writes).

Only rows new to the table arrive. The source's owner rewriting it (a compaction, a DELETE for an
erasure, an UPDATE, a MERGE) commits files that copy rows it already held: `Origin` says, file by
file, whether its rows are new, held, or a mix that event ids tell apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc


class Arrival(str, Enum):
    NULL_CURSOR = "null_cursor"  # no window holds it (each run that reads its load day counts it too)
    BEFORE_START = "cursor_before_start_date"  # never processed: before the deployment's first day
    IN_FUTURE = "cursor_in_future"  # stamped after now: processed once its time comes
    IN_KEYHOLE = "in_keyhole_window"  # inside the explicit window of the keyhole run that sees it
    BEHIND = "behind_cursor"  # behind the next standard window: only a keyhole run reads it
    PENDING = "pending"  # in this run's window or a later one


# What a run counts as read by no standard window (skip reasons of its run-log record).
UNREAD = (Arrival.BEFORE_START, Arrival.IN_FUTURE, Arrival.BEHIND)


@dataclass(frozen=True)
class ArrivalBounds:
    """What decides an arriving row's class: the first day, now, where the next standard window
    starts (None: no position yet, the first run reads from start_date), and a keyhole's window."""

    start: datetime
    now: datetime
    next_lower: datetime | None = None
    keyhole: tuple[datetime, datetime] | None = None

    def rule(self) -> list[tuple[Arrival, str, tuple[datetime, ...]]]:
        """(class, test, bounds) in the order tested; the first that holds wins, and a row that none
        holds is PENDING. Tests: 'null', '<', '>', 'within' (inclusive)."""
        steps = [(Arrival.NULL_CURSOR, "null", ()), (Arrival.BEFORE_START, "<", (self.start,)),
                 (Arrival.IN_FUTURE, ">", (self.now,))]
        if self.keyhole is not None:
            steps.append((Arrival.IN_KEYHOLE, "within", self.keyhole))
        if self.next_lower is not None:
            steps.append((Arrival.BEHIND, "<", (self.next_lower,)))
        return steps

    def reason(self, ts: datetime | None) -> Arrival:
        """One row's class, on a plain value."""
        for arrival, test, bounds in self.rule():
            if PYTHON_TESTS[test](ts, *bounds):
                return arrival
        return Arrival.PENDING

    def reason_of_range(self, low: datetime, high: datetime) -> Arrival | None:
        """The class of every non-null value in [low, high] when they all share one (a file's rows
        judged from its statistics, without reading it), else None."""
        for arrival, test, bounds in self.rule():
            if test == "null":
                continue
            inside, outside = RANGE_TESTS[test](low, high, *bounds)
            if inside:
                return arrival
            if not outside:
                return None
        return Arrival.PENDING


PYTHON_TESTS = {
    "null": lambda ts: ts is None,
    "<": lambda ts, bound: ts is not None and ts < bound,
    ">": lambda ts, bound: ts is not None and ts > bound,
    "within": lambda ts, low, high: ts is not None and low <= ts <= high,
}
# For a range [low, high]: (every value passes the test, none does).
RANGE_TESTS = {
    "<": lambda low, high, bound: (high < bound, low >= bound),
    ">": lambda low, high, bound: (low > bound, high <= bound),
    "within": lambda low, high, a, b: (a <= low and high <= b, high < a or low > b),
}
ARROW_TESTS = {
    "null": pc.is_null,
    "<": pc.less,
    ">": pc.greater,
    "within": lambda ts, low, high: pc.and_(pc.greater_equal(ts, low), pc.less_equal(ts, high)),
}


@dataclass(frozen=True)
class Arrivals:
    """Rows that arrived, by class, with the cursor range of those behind the cursor."""

    counts: Mapping[Arrival, int] = field(default_factory=dict)
    behind_from: datetime | None = None
    behind_to: datetime | None = None

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    def __getitem__(self, arrival: Arrival) -> int:
        return self.counts.get(arrival, 0)

    def __add__(self, other: "Arrivals") -> "Arrivals":
        counts = {a: self[a] + other[a] for a in Arrival if self[a] + other[a]}
        return Arrivals(counts, _least(self.behind_from, other.behind_from), _greatest(self.behind_to, other.behind_to))

    def skipped(self) -> dict[str, int]:
        """What no standard window reads, under the run log's reason names."""
        return {arrival.value: self[arrival] for arrival in UNREAD if self[arrival]}


NOTHING_ARRIVED = Arrivals()


def all_of(rows: int, arrival: Arrival) -> Arrivals:
    """A whole file's rows in one class (decided from its statistics, without reading it)."""
    return Arrivals({arrival: rows} if rows else {})


def count_arrow(ts: pa.Array, bounds: ArrivalBounds) -> Arrivals:
    """The rule over an Arrow array of the cursor."""
    unclassified = pa.array([True] * len(ts), pa.bool_())
    counts, behind = {}, None
    for arrival, test, moments in bounds.rule():
        condition = ARROW_TESTS[test](ts, *(as_scalar(moment, ts.type) for moment in moments))
        chosen = pc.and_(unclassified, pc.fill_null(condition, False))
        counts[arrival] = pc.sum(chosen).as_py() or 0
        if arrival is Arrival.BEHIND:
            behind = pc.min_max(pc.filter(ts, chosen))
        unclassified = pc.and_(unclassified, pc.invert(chosen))
    counts[Arrival.PENDING] = pc.sum(unclassified).as_py() or 0
    span = (None, None) if behind is None else (_naive(behind["min"].as_py()), _naive(behind["max"].as_py()))
    return Arrivals({a: n for a, n in counts.items() if n}, *span)


def total(parts: Iterable[Arrivals]) -> Arrivals:
    result = NOTHING_ARRIVED
    for part in parts:
        result = result + part
    return result


def as_scalar(moment: datetime, kind: pa.DataType) -> pa.Scalar:
    """A naive UTC datetime as a scalar of the array's timestamp type (zoned or not)."""
    return pa.scalar(moment, pa.timestamp("us")).cast(pa.timestamp(kind.unit)).cast(kind)


def _naive(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=None) if moment is not None and moment.tzinfo else moment


def _least(*moments):
    return min((m for m in moments if m is not None), default=None)


def _greatest(*moments):
    return max((m for m in moments if m is not None), default=None)


class Origin(str, Enum):
    """Whether the rows of a data file arrived after the version a run last assessed."""

    HELD = "held"  # none did: a file of that version, or one that only rearranged such rows (a compaction)
    NEW = "new"  # every one did: an append, or a rewrite of appended rows only
    MIXED = "mixed"  # a rewrite that copied held rows and may have added new ones: told apart by event_id


def origin_of_added(removed: Iterable[Origin], data_change: bool) -> Origin:
    """The origin of the rows of the files one commit added, from the origins of the files it
    removed. A commit that changes no data (a compaction) rearranges the rows it removed; one that
    does and removes files (DELETE, UPDATE, MERGE, an overwrite) copies rows of them and may insert
    new ones; one that removes nothing appends (or, changing no data, adds nothing new)."""
    origins = set(removed) or {Origin.NEW if data_change else Origin.HELD}
    if origins == {Origin.NEW}:
        return Origin.NEW
    return Origin.HELD if origins == {Origin.HELD} and not data_change else Origin.MIXED


def origin_by_metrics(removed: Iterable[Origin], metrics: Mapping[str, Any]) -> Origin:
    """The origin of a rewrite's files when held files it removed are gone (VACUUM), so that their
    event ids cannot be read: copies only when it removed held rows only and its operation metrics
    say it inserted none; otherwise new, every row counted (more than arrived rather than fewer)."""
    return Origin.HELD if set(removed) == {Origin.HELD} and inserted_rows(metrics) == 0 else Origin.NEW


def inserted_rows(metrics: Mapping[str, Any]) -> int | None:
    """The rows a commit inserted, from its operation metrics as Spark (numTargetRowsInserted) and
    delta-rs (num_target_rows_inserted) name them: a MERGE says; a DELETE or an UPDATE reports the
    rows it copied and inserts none; None when the metrics do not say."""
    named = {name.replace("_", "").lower(): value for name, value in metrics.items()}
    if "numtargetrowsinserted" in named:
        return int(named["numtargetrowsinserted"])
    return 0 if "numcopiedrows" in named else None


@dataclass(frozen=True)
class Stranded:
    """Rows that arrived behind the cursor (or in the window of a keyhole run that did not finish)
    and that no keyhole run which saw them has processed since."""

    run_id: str  # the run that counted them
    rows: int
    start: datetime
    end: datetime

    @property
    def command(self) -> str:
        return f"incremental-assets run --lower {self.start.isoformat()} --upper {self.end.isoformat()}"


@dataclass(frozen=True)
class CountedArrivals:
    """What one run's plan counted: its window (a keyhole's, or None), the source version it saw."""

    run_id: str
    version: int
    arrivals: Arrivals
    keyhole: tuple[datetime, datetime] | None = None


def stranded(counted: Iterable[CountedArrivals], succeeded: set[str]) -> list[Stranded]:
    """Rows a run counted behind the cursor, and rows in the window of a keyhole run that did not
    succeed, unless successful keyhole runs that saw the same source version or a later one cover
    their range."""
    counted = list(counted)
    keyholes = [(c.version, c.keyhole) for c in counted if c.keyhole is not None and c.run_id in succeeded]
    found = []
    for c in counted:
        waiting = []
        if c.arrivals[Arrival.BEHIND]:
            waiting.append((c.arrivals[Arrival.BEHIND], c.arrivals.behind_from, c.arrivals.behind_to))
        if c.keyhole is not None and c.run_id not in succeeded and c.arrivals[Arrival.IN_KEYHOLE]:
            waiting.append((c.arrivals[Arrival.IN_KEYHOLE], *c.keyhole))
        covering = [window for version, window in keyholes if version >= c.version]
        found += [Stranded(c.run_id, rows, start, end) for rows, start, end in waiting if not _covers(covering, start, end)]
    return found


def _covers(windows: list[tuple[datetime, datetime]], start: datetime, end: datetime) -> bool:
    """Whether the union of the (inclusive) windows holds every moment of [start, end]: a window
    wholly before `start` (another keyhole's, earlier) leaves no gap in it."""
    reached = start  # every moment of [start, reached] is held (none yet)
    for low, high in sorted(windows):
        if high < reached:
            continue
        if low > reached:
            return False
        reached = high
        if reached >= end:
            return True
    return False
