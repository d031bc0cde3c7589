"""The one timestamp rule of every load, on plain values.

Exports carry times in every encoding: ISO text with or without an offset (naive = UTC),
timestamp types of any unit, and integer (or fractional) epochs. An epoch's unit is inferred from
its magnitude: within the plausible window (1990 to some time after today), epochs in seconds,
milliseconds, microseconds and nanoseconds lie in ranges that do not overlap, so one unit at most
puts a column's values there. A wrong unit (milliseconds taken as seconds) lands a thousand years
or more off, far outside the window: values outside it refuse the load, before anything is
written, with the column, how many, an example and the unit they look like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Mapping

EARLIEST = date(1990, 1, 1)
# Beyond today + days_late_allowed: clocks run ahead, a loader runs in another zone. A wrong unit
# is a factor of 1,000 off, so a year of margin still catches every one.
MARGIN = timedelta(days=365)
EPOCH = datetime(1970, 1, 1)
SECONDS_PER_DAY = 86_400


class EpochUnit(str, Enum):
    SECONDS = "s"
    MILLIS = "ms"
    MICROS = "us"
    NANOS = "ns"

    @property
    def per_second(self) -> int:
        return {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[self.value]

    @property
    def micros(self) -> Decimal:
        """Microseconds in one count of this unit."""
        return Decimal(1_000_000) / Decimal(self.per_second)

    @property
    def noun(self) -> str:
        return {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}[self.value]


@dataclass(frozen=True)
class Plausible:
    """The window every loaded time must lie in: [earliest, latest) (both days, UTC)."""

    earliest: date
    latest: date

    @classmethod
    def around(cls, today: date, days_late_allowed: int, earliest: date | None = None, latest: date | None = None):
        """The default window, 1990 to today + days_late_allowed + a year; either end may be set."""
        return cls(earliest or EARLIEST, latest or today + timedelta(days=days_late_allowed) + MARGIN)

    def __post_init__(self) -> None:
        if self.earliest >= self.latest:
            raise ValueError(f"the plausible window is empty: {self.earliest} is not before {self.latest}")

    def __str__(self) -> str:
        return f"{self.earliest} .. {self.latest}"

    def seconds(self) -> tuple[Decimal, Decimal]:
        """The window in seconds since the epoch, [low, high)."""
        return tuple(Decimal((day - EPOCH.date()).days * SECONDS_PER_DAY) for day in (self.earliest, self.latest))

    def bounds(self, unit: EpochUnit) -> tuple[Decimal, Decimal]:
        """The window as epoch counts of `unit`, [low, high)."""
        return tuple(second * unit.per_second for second in self.seconds())

    def holds(self, value: Decimal | int | float, unit: EpochUnit) -> bool:
        low, high = self.bounds(unit)
        return low <= Decimal(str(value)) < high


def infer_unit(low: Decimal | int | float, high: Decimal | int | float, window: Plausible) -> EpochUnit | None:
    """The one unit in which every epoch from `low` to `high` lies in the window, or None."""
    fitting = [unit for unit in EpochUnit if window.holds(low, unit) and window.holds(high, unit)]
    return fitting[0] if fitting else None


def unit_of(value: Decimal | int | float, window: Plausible) -> EpochUnit | None:
    """The unit that puts this one epoch in the window, or None."""
    return infer_unit(value, value, window)


def number(value: Decimal | int | float) -> str:
    """An epoch as written, without the trailing zeros of its exact form."""
    text = format(Decimal(str(value)).normalize(), "f")
    return text


def when(value: Decimal | int | float, unit: EpochUnit) -> str:
    """An epoch as a reader sees it: the moment, or only its year where a datetime cannot hold it."""
    seconds = Decimal(str(value)) / unit.per_second
    try:
        return str(EPOCH + timedelta(seconds=float(seconds)))
    except OverflowError:
        return f"the year {1970 + int(seconds / Decimal(SECONDS_PER_DAY * 365.2425))}"


def scale_off(seconds: Decimal, window: Plausible) -> int:
    """For a time outside the window, as seconds since the epoch: the power of 1,000 it is off by
    (3: a thousand times too large, as milliseconds read as seconds; -3: too small), or 0."""
    low, high = window.seconds()
    for power in (3, 6, 9):
        factor = Decimal(10) ** power
        if low <= seconds / factor < high:
            return power
        if low <= seconds * factor < high:
            return -power
    return 0


def scale_hint(seconds: Decimal | None, window: Plausible) -> str:
    """Why a timestamp may lie outside the window, for the refusal's message ('' when no scale explains it)."""
    power = 0 if seconds is None else scale_off(seconds, window)
    if not power:
        return ""
    finer = {3: EpochUnit.MILLIS, 6: EpochUnit.MICROS, 9: EpochUnit.NANOS}[abs(power)].noun
    if power > 0:
        return f"; they look {10 ** power:,} times too large, as if epoch {finer} were read as seconds"
    return f"; they look {10 ** -power:,} times too small, as if epoch seconds were read as {finer}"


@dataclass(frozen=True)
class Findings:
    """What one pass over a file found in one timestamp column."""

    column: str
    numbers: int = 0  # epoch values (a numeric column, or text of digits)
    low: Decimal | None = None
    high: Decimal | None = None
    outside: Mapping[EpochUnit, tuple[int, Decimal | None]] = field(default_factory=dict)  # per unit: how many, e.g.
    stamps: int = 0  # timestamps (a timestamp column, or ISO text)
    stamps_outside: int = 0
    stamp_example: Decimal | None = None  # as seconds since the epoch: a datetime cannot hold every year
    unreadable: int = 0  # text that is neither
    unreadable_example: str | None = None


@dataclass(frozen=True)
class Decision:
    """How a column's epochs are read (`unit`, None when it holds none), or why the load is refused."""

    column: str
    unit: EpochUnit | None
    problems: tuple[str, ...] = ()


def decide(found: Findings, window: Plausible, unit: EpochUnit | None = None) -> Decision:
    """The column's epoch unit (the one given, or the one its values fit), and every reason to refuse."""
    problems = []
    if found.unreadable:
        problems.append(
            f"{found.unreadable} value(s) are neither a timestamp nor an epoch number (e.g. {found.unreadable_example!r})"
        )
    if found.stamps_outside:
        example = when(found.stamp_example, EpochUnit.SECONDS)
        hint = scale_hint(found.stamp_example, window)
        problems.append(f"{found.stamps_outside} timestamp(s) outside {window} (e.g. {example}){hint}")
    chosen = unit
    if found.numbers:
        chosen = unit or infer_unit(found.low, found.high, window)
        if chosen is None:
            problems.append(_no_unit_fits(found, window))
        elif found.outside.get(chosen, (0, None))[0]:
            count, example = found.outside[chosen]
            likely = unit_of(example, window)
            hint = f"; they look like epoch {likely.noun} (--epoch-unit {likely.value})" if likely else ""
            problems.append(
                f"{count} epoch value(s) outside {window} as {chosen.noun} (e.g. {number(example)}: "
                f"{when(example, chosen)}){hint}"
            )
    return Decision(found.column, chosen if found.numbers else None, tuple(problems))


def summarise(decisions: list[Decision]) -> list[str]:
    """Each problem once, naming every column it holds for (the example of the first): a wrong unit
    is usually the same in every time column of an export."""
    grouped: dict[str, list[tuple[str, str]]] = {}
    for decision in decisions:
        for problem in decision.problems:
            grouped.setdefault(re.sub(r"\(e\.g\. [^)]*\)", "", problem), []).append((decision.column, problem))
    return [f"{', '.join(column for column, _ in group)}: {group[0][1]}" for group in grouped.values()]


def _no_unit_fits(found: Findings, window: Plausible) -> str:
    low_unit, high_unit = unit_of(found.low, window), unit_of(found.high, window)
    if low_unit and high_unit:
        return (
            f"its epoch values mix units (e.g. {number(found.low)} looks like {low_unit.noun}, {number(found.high)} "
            f"like {high_unit.noun}): export them in one unit"
        )
    best = min(EpochUnit, key=lambda u: found.outside.get(u, (found.numbers, None))[0])
    count, example = found.outside.get(best, (found.numbers, found.low))
    likely = unit_of(example, window) if example is not None else None
    reading = f"{number(example)}: as {best.noun} {when(example, best)}" if example is not None else ""
    hint = f", it looks like epoch {likely.noun}" if likely else ", no epoch unit puts it there"
    return f"{count} epoch value(s) fit no unit in {window} (e.g. {reading}{hint})"

