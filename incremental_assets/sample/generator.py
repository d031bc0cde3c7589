"""A deterministic, seeded stream of Snowplow-shaped atomic events (pure Python).

The stream is written in hourly load batches and continued later, so `generate_events` is a pure
function of (params, load window) that is consistent across windows: generating [a, c) equals
generating [a, b) + [b, c). Each event day, and each user within it, draws from its own
`random.Random` seeded by (seed, day, user); a window regenerates every event day that can still
have rows loaded in it and keeps the rows whose load_tstamp falls inside.

Timestamps are naive datetimes meaning UTC.
"""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache

from incremental_assets.atomic_events import SAMPLE_SCHEMA
from incremental_assets.utc import naive

COLUMNS = tuple(SAMPLE_SCHEMA.fieldNames())
_EVENT_ID, _COLLECTOR, _LOAD = (COLUMNS.index(name) for name in ("event_id", "collector_tstamp", "load_tstamp"))

EVENT_VENDOR = "com.snowplowanalytics.snowplow"
APP_IDS = ("website", "docs", "mobile_app")
CUSTOM_EVENTS = ("add_to_cart", "link_click", "submit_form")
SESSION_TIMEOUT = timedelta(minutes=30)

# Anomaly classes. Each one is present in the default 5-day stream, so that every rule of the
# pipeline that handles one has data to act on.
LATE_LOAD = "late_load"  # load_tstamp LATE_AFTER..LATE_LOAD_MAX after collector_tstamp
OFFLINE_DEVICE = "offline_device"  # dvce_sent_tstamp LATE_AFTER..OFFLINE_SEND_MAX after dvce_created_tstamp
LATE_SENT = "late_sent"  # dvce_sent_tstamp > dvce_created_tstamp + 4 days: beyond days_late_allowed
NULL_DVCE_TSTAMPS = "null_dvce_tstamps"  # dvce_created_tstamp and dvce_sent_tstamp are null
NULL_EVENT_ID = "null_event_id"  # at least one per event day
DUPLICATE_SAME_HOUR = "duplicate_same_hour"  # an identical copy in the same load batch
DUPLICATE_RELOADED = "duplicate_reloaded"  # a copy loaded again LATE_AFTER..DUPLICATE_RELOAD_MAX later

LATE_AFTER = timedelta(hours=1)
LATE_LOAD_MAX = timedelta(days=3)
OFFLINE_SEND_MAX = timedelta(hours=12)
LATE_SENT_MIN = timedelta(days=4, hours=1)
LATE_SENT_MAX = timedelta(days=4, hours=6)
LATE_SENT_PER_DAY = 2
DUPLICATE_RELOAD_MAX = timedelta(hours=30)
NULL_DVCE_SHARE = 0.005
NULL_EVENT_ID_SHARE = 0.001
# Bots keep ONE session id alive for longer than max_session_days (3), so they get quarantined.
BOT_SESSION_MIN = timedelta(days=4)
BOT_SESSION_MAX = timedelta(days=5)
BOT_EVENT_GAP_MIN = timedelta(minutes=20)
BOT_EVENT_GAP_MAX = timedelta(minutes=40)

# The longest an event's load_tstamp trails its dvce_created_tstamp (anomalies never combine).
MAX_LATENESS = LATE_SENT_MAX + timedelta(hours=1)

MAX_USERS = 100_000
MAX_DAYS = 3650
MAX_EVENTS_PER_USER_DAY = 500  # beyond it sessions would outgrow their slots: add users instead
MAX_LATE_SHARE = 0.5
MAX_DUPLICATE_SHARE = 0.4
MAX_BOT_SHARE = 0.5

# Delivery delays of a well-behaved event.
_SEND_DELAY = (timedelta(milliseconds=5), timedelta(seconds=3))
_COLLECT_DELAY = (timedelta(milliseconds=10), timedelta(milliseconds=500))
_LOAD_DELAY = (timedelta(seconds=2), timedelta(minutes=5))

# Human behaviour: sessions in slots between 06:00 and 23:00, so that two sessions of a user are
# always more than SESSION_TIMEOUT apart, also across midnight.
_ACTIVE_FROM = time(6)
_ACTIVE_SPAN = timedelta(hours=17)
_SESSIONS_PER_DAY = (0, 1, 2, 3, 4)
_SESSIONS_WEIGHTS = (2, 3, 3, 2, 1)
_DWELL = (timedelta(seconds=5), timedelta(minutes=3))
_SESSION_END_MARGIN = timedelta(minutes=5)  # > the longest dwell: the last page ends in time
_PING_EVERY = (timedelta(seconds=10), timedelta(seconds=30))
_NAVIGATION = (timedelta(seconds=1), timedelta(seconds=5))
_CUSTOM_EVENT_SHARE = 0.15
_MAIN_APP_SHARE = 0.8
_LOGIN_SHARE = 0.6
_LOGIN_LATER_SHARE = 0.3  # of users who log in: only from their second session on
_BOT_CYCLE = timedelta(days=6)  # a bot starts a new endless session every cycle
_BOT_START_SPREAD = timedelta(hours=12)
_BOT_EVENTS_PER_DAY = timedelta(days=1) / ((BOT_EVENT_GAP_MIN + BOT_EVENT_GAP_MAX) / 2)

_SITE = {
    "website": (
        "https://www.example.com",
        (("/", "Home"), ("/products", "Products"), ("/products/tracker", "Tracker"), ("/pricing", "Pricing"),
         ("/blog/incremental-models", "Incremental models"), ("/contact", "Contact us")),
    ),
    "docs": (
        "https://docs.example.com",
        (("/", "Documentation"), ("/getting-started", "Getting started"), ("/data-models", "Data models"),
         ("/api", "API reference")),
    ),
    "mobile_app": (None, (("home", "Home"), ("search", "Search"), ("product", "Product"), ("basket", "Basket"))),
}
_CUSTOM_EVENTS_BY_APP = {"website": CUSTOM_EVENTS, "docs": ("link_click",), "mobile_app": ("add_to_cart",)}
_EXTERNAL_REFERRERS = (None, "https://www.google.com/", "https://duckduckgo.com/", "https://news.ycombinator.com/")


@dataclasses.dataclass(frozen=True)
class SampleParams:
    """The shape of a sample stream; persisted beside the table so the stream can be continued."""

    users: int = 40
    days: int = 5
    events_per_day: int = 1500
    start_date: date | None = None  # None: today (UTC) minus `days`
    late_share: float = 0.05
    duplicate_share: float = 0.02
    bot_share: float = 0.05  # share of users that are bots
    seed: int = 42

    def __post_init__(self) -> None:
        _check_range("users", self.users, 1, MAX_USERS, integer=True)
        _check_range("days", self.days, 1, MAX_DAYS, integer=True)
        per_user = f"at most {MAX_EVENTS_PER_USER_DAY} per user: add users for more"
        _check_range("events_per_day", self.events_per_day, 1, MAX_EVENTS_PER_USER_DAY * self.users, True, per_user)
        _check_range("late_share", self.late_share, 0, MAX_LATE_SHARE)
        _check_range("duplicate_share", self.duplicate_share, 0, MAX_DUPLICATE_SHARE)
        _check_range("bot_share", self.bot_share, 0, MAX_BOT_SHARE)
        _check_range("seed", self.seed, 0, 2**63 - 1, integer=True)
        if self.start_date is None:
            object.__setattr__(self, "start_date", datetime.now(timezone.utc).date() - timedelta(days=self.days))
        elif isinstance(self.start_date, datetime) or not isinstance(self.start_date, date):
            raise ValueError(f"start_date must be a date (YYYY-MM-DD), got {self.start_date!r}")

    @property
    def bot_users(self) -> range:
        """The users that are bots: the last ones, so the humans keep their identities."""
        return range(self.users - round(self.users * self.bot_share), self.users)

    @property
    def human_users(self) -> range:
        return range(self.bot_users.start)

    @property
    def start(self) -> datetime:
        """The stream's first load batch starts at start_date 00:00 UTC."""
        return datetime.combine(self.start_date, time())

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "start_date": self.start_date.isoformat()}

    @classmethod
    def from_dict(cls, data: dict) -> SampleParams:
        return cls(**{**data, "start_date": date.fromisoformat(data["start_date"])})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SampleParams:
        return cls.from_dict(json.loads(text))


def _check_range(name: str, value, low, high, integer: bool = False, note: str = "") -> None:
    kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not kind_ok or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind} between {low} and {high}{f' ({note})' if note else ''}, got {value!r}")


def generate_events(params: SampleParams, load_from: datetime, load_until: datetime) -> list[tuple]:
    """Every row with `load_from <= load_tstamp < load_until`, ordered by load_tstamp.

    A row is a tuple in SAMPLE_SCHEMA order followed by its load_date.
    """
    load_from, load_until = naive(load_from), naive(load_until)
    if load_until < load_from:
        raise ValueError(f"load_until ({load_until}) is before load_from ({load_from})")
    rows = [
        row
        for day in _event_days(params, load_from, load_until)
        for row in _day_rows(params, day)
        if load_from <= row[_LOAD] < load_until
    ]
    rows.sort(key=lambda row: (row[_LOAD], row[_COLLECTOR], row[_EVENT_ID] or ""))
    return rows



def _event_days(params: SampleParams, load_from: datetime, load_until: datetime) -> Iterator[date]:
    """The event days that can have rows loaded in the window (an event day's events happen within it)."""
    day = max(params.start_date, (load_from - MAX_LATENESS).date() - timedelta(days=1))
    while day <= load_until.date():
        yield day
        day += timedelta(days=1)


def _day_rows(params: SampleParams, day: date) -> list[tuple]:
    """Every row of the events that happen on `day`, whenever they are loaded."""
    marks = _day_marks(params, day)
    target = _session_events_target(params, day)
    rows = []
    for user in range(params.users):
        rng = random.Random(f"{params.seed}:{day.isoformat()}:{user}")
        if user in params.bot_users:
            hits = _bot_hits(params, day, user, rng)
        else:
            hits = _human_hits(params, day, user, rng, target)
        user_marks = marks.get(user, set())
        for i, (created, fields) in enumerate(hits):
            late_sent = LATE_SENT in user_marks and i == 0
            null_event_id = NULL_EVENT_ID in user_marks and i == len(hits) - 1
            rows.extend(_deliver(params, rng, created, fields, late_sent, null_event_id))
    return rows


def _day_marks(params: SampleParams, day: date) -> dict[int, set[str]]:
    """The users whose first (late-sent) or last (null event_id) event of the day carries a rare anomaly.

    Chosen per day rather than drawn per event, so that every day holds at least one.
    """
    rng = random.Random(f"{params.seed}:{day.isoformat()}:marks")
    active = [user for user in params.human_users if _session_count(params.seed, day, user)]
    null_ids = max(1, round(NULL_EVENT_ID_SHARE * params.events_per_day))
    marks: dict[int, set[str]] = {}
    for anomaly, count in ((LATE_SENT, LATE_SENT_PER_DAY), (NULL_EVENT_ID, null_ids)):
        for user in rng.sample(active, min(count, len(active))):
            marks.setdefault(user, set()).add(anomaly)
    return marks


@dataclasses.dataclass(frozen=True)
class _Profile:
    domain_userid: str
    user_id: str | None
    login_from: int  # the first session (domain_sessionidx) with user_id set
    app: str


@lru_cache(maxsize=4096)
def _profile(seed: int, user: int) -> _Profile:
    rng = random.Random(f"{seed}:user:{user}")
    return _Profile(
        domain_userid=_uuid(rng),
        user_id=f"user_{user:05d}" if rng.random() < _LOGIN_SHARE else None,
        login_from=2 if rng.random() < _LOGIN_LATER_SHARE else 1,
        app=rng.choices(APP_IDS, weights=(6, 2, 2))[0],
    )


@lru_cache(maxsize=1 << 17)
def _session_count(seed: int, day: date, user: int) -> int:
    """Sessions of a user on a day, from its own tiny seed so that domain_sessionidx is cheap to know."""
    rng = random.Random(f"{seed}:{day.isoformat()}:{user}:sessions")
    return rng.choices(_SESSIONS_PER_DAY, weights=_SESSIONS_WEIGHTS)[0]


def _sessions_before(params: SampleParams, day: date, user: int) -> int:
    days = (day - params.start_date).days
    return sum(_session_count(params.seed, params.start_date + timedelta(days=i), user) for i in range(days))


def _human_hits(
    params: SampleParams, day: date, user: int, rng: random.Random, target: float
) -> list[tuple[datetime, dict]]:
    """A user's sessions of the day, one per equal slot of the active hours, in time order."""
    count = _session_count(params.seed, day, user)
    if not count:
        return []
    profile = _profile(params.seed, user)
    first_index = _sessions_before(params, day, user) + 1
    slot = _ACTIVE_SPAN / count
    hits = []
    for k in range(count):
        slot_start = datetime.combine(day, _ACTIVE_FROM) + k * slot
        start = slot_start + slot / 2 * rng.random()
        ends_by = slot_start + slot - SESSION_TIMEOUT - _SESSION_END_MARGIN
        app = profile.app if rng.random() < _MAIN_APP_SHARE else rng.choice(APP_IDS)
        index = first_index + k
        user_id = profile.user_id if index >= profile.login_from else None
        session = _session_fields(profile, app, _uuid(rng), index, user_id)
        hits += _session_hits(rng, session, start, ends_by, round(target * rng.uniform(0.5, 1.5)))
    hits.sort(key=lambda hit: hit[0])
    return hits


def _session_events_target(params: SampleParams, day: date) -> float:
    """Events per human session that make the day hold about events_per_day rows (duplicates included).

    Spread over the day's actual sessions, so that busy and quiet days hold about the same volume.
    """
    human_rows = params.events_per_day / (1 + params.duplicate_share) - len(params.bot_users) * _BOT_EVENTS_PER_DAY
    sessions = sum(_session_count(params.seed, day, user) for user in params.human_users)
    return max(human_rows / max(sessions, 1), 1.0)



def _session_fields(profile: _Profile, app: str, session_id: str, index: int, user_id: str | None) -> dict:
    return {
        "app_id": app,
        "platform": "mob" if app == "mobile_app" else "web",
        "event_vendor": EVENT_VENDOR,
        "domain_sessionid": session_id,
        "domain_sessionidx": index,
        "domain_userid": profile.domain_userid,
        "user_id": user_id,
    }


def _session_hits(
    rng: random.Random, session: dict, start: datetime, ends_by: datetime, budget: int
) -> list[tuple[datetime, dict]]:
    """Pages of a session until its event budget is met (to the nearest page) or its slot runs out."""
    host = _SITE[session["app_id"]][0]
    referrer = rng.choice(_EXTERNAL_REFERRERS) if host else None
    hits: list[tuple[datetime, dict]] = []
    t = start
    while t < ends_by:
        page, dwell = _page_hits(rng, session, referrer, t)
        if hits and len(hits) + len(page) / 2 > budget:
            break
        hits += page
        referrer = page[0][1]["page_url"]
        t += dwell + _between(rng, *_NAVIGATION)
    return hits


def _page_hits(
    rng: random.Random, session: dict, referrer: str | None, t: datetime
) -> tuple[list[tuple[datetime, dict]], timedelta]:
    """A page (web) or screen (mobile) view, page pings while a web page stays open, now and then a custom event."""
    app = session["app_id"]
    host, pages = _SITE[app]
    path, title = rng.choice(pages)
    page = {**session, "page_url": host + path if host else None, "page_title": title, "page_referrer": referrer}
    hits = [(t, {**page, "event_name": "page_view" if host else "screen_view"})]
    dwell = _between(rng, *_DWELL)
    ping = t + _between(rng, *_PING_EVERY)
    while host and ping < t + dwell:
        hits.append((ping, {**page, "event_name": "page_ping"}))
        ping += _between(rng, *_PING_EVERY)
    if rng.random() < _CUSTOM_EVENT_SHARE:
        hits.append((t + dwell * rng.random(), {**page, "event_name": rng.choice(_CUSTOM_EVENTS_BY_APP[app])}))
    return hits, dwell


def _bot_hits(params: SampleParams, day: date, user: int, rng: random.Random) -> list[tuple[datetime, dict]]:
    """A bot's page views of the day, all in the one session of its current cycle.

    The session (id, start, length) is drawn from the cycle's own seed, so every day of the cycle
    agrees on it without generating the days before.
    """
    cycle = (day - params.start_date).days // _BOT_CYCLE.days
    cycle_rng = random.Random(f"{params.seed}:bot:{user}:{cycle}")
    begins = params.start + cycle * _BOT_CYCLE + _between(cycle_rng, timedelta(0), _BOT_START_SPREAD)
    ends = begins + _between(cycle_rng, BOT_SESSION_MIN, BOT_SESSION_MAX)
    session = _session_fields(_profile(params.seed, user), "website", _uuid(cycle_rng), cycle + 1, None)
    host, pages = _SITE["website"]
    day_start = datetime.combine(day, time())
    t = begins if begins >= day_start else day_start + _between(rng, timedelta(0), BOT_EVENT_GAP_MIN)
    hits = []
    while t < min(ends, day_start + timedelta(days=1)):
        path, title = rng.choice(pages)
        page = {"page_url": host + path, "page_title": title, "page_referrer": None}
        hits.append((t, {**session, **page, "event_name": "page_view"}))
        t += _between(rng, BOT_EVENT_GAP_MIN, BOT_EVENT_GAP_MAX)
    return hits


def _deliver(
    params: SampleParams, rng: random.Random, created: datetime, fields: dict, late_sent: bool, null_event_id: bool
) -> list[tuple]:
    """The rows one event becomes on its way from the device to the warehouse, with its anomaly if any."""
    event_id = None if null_event_id else _uuid(rng)
    anomaly = _draw_anomaly(params, rng.random())
    if late_sent:
        anomaly = LATE_SENT
    send_delay = {LATE_SENT: (LATE_SENT_MIN, LATE_SENT_MAX), OFFLINE_DEVICE: (LATE_AFTER, OFFLINE_SEND_MAX)}
    sent = created + _between(rng, *send_delay.get(anomaly, _SEND_DELAY))
    collector = sent + _between(rng, *_COLLECT_DELAY)
    load = collector + _between(rng, *((LATE_AFTER, LATE_LOAD_MAX) if anomaly == LATE_LOAD else _LOAD_DELAY))
    row = {
        **fields,
        "event_id": event_id,
        "dvce_created_tstamp": created,
        "dvce_sent_tstamp": sent,
        "collector_tstamp": collector,
        "derived_tstamp": collector - (sent - created),
        "load_tstamp": load,
    }
    if anomaly == NULL_DVCE_TSTAMPS:
        row.update(dvce_created_tstamp=None, dvce_sent_tstamp=None, derived_tstamp=collector)
    copies = [row]
    if anomaly == DUPLICATE_SAME_HOUR:
        copies.append(row)
    elif anomaly == DUPLICATE_RELOADED:
        copies.append({**row, "load_tstamp": load + _between(rng, LATE_AFTER, DUPLICATE_RELOAD_MAX)})
    return [(*(copy.get(column) for column in COLUMNS), copy["load_tstamp"].date()) for copy in copies]


def _draw_anomaly(params: SampleParams, draw: float) -> str | None:
    """Map a uniform draw to at most one anomaly (they never combine, which bounds MAX_LATENESS)."""
    shares = (
        (LATE_LOAD, params.late_share / 2),
        (OFFLINE_DEVICE, params.late_share / 2),
        (NULL_DVCE_TSTAMPS, NULL_DVCE_SHARE),
        (DUPLICATE_SAME_HOUR, params.duplicate_share / 2),
        (DUPLICATE_RELOADED, params.duplicate_share / 2),
    )
    for anomaly, share in shares:
        if draw < share:
            return anomaly
        draw -= share
    return None


def _between(rng: random.Random, low: timedelta, high: timedelta) -> timedelta:
    return low + (high - low) * rng.random()


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
