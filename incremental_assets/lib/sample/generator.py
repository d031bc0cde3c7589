"""A deterministic, seeded stream of Snowplow-shaped atomic events, generated column by column.

The stream is written in hourly load batches and continued later, so `generate_table` is a pure
function of (params, load window) that is consistent across windows: generating [a, c) equals
generating [a, b) + [b, c). Each event day draws from its own random streams, seeded by (seed,
day); a window regenerates every event day that can still have rows loaded in it and keeps the
rows whose load_tstamp falls inside.

A day is built in whole pyarrow columns (its sessions, then their pages, then the pages' events,
then the rows each event becomes on its way to the warehouse), so it costs a few hundred array
operations whatever its volume rather than Python work per row. Times are int64 microseconds
since the epoch (UTC) until the table is typed at the end.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc

from incremental_assets.lib.source.contract import LOAD_DATE, SAMPLE_SCHEMA
from incremental_assets.lib.utc import naive

COLUMNS = tuple(SAMPLE_SCHEMA.fieldNames())
_ARROW_TYPES = {"string": pa.string(), "integer": pa.int32(), "timestamp": pa.timestamp("us", tz="UTC")}
# The generated table: SAMPLE_SCHEMA and load_date, as pyspark maps STREAM_SCHEMA to Arrow.
ARROW_SCHEMA = pa.schema(
    [pa.field(field.name, _ARROW_TYPES[field.dataType.typeName()]) for field in SAMPLE_SCHEMA.fields]
    + [pa.field(LOAD_DATE, pa.date32())]
)

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

# An event's anomaly is an index into this: the drawn ones, the placed one, and none.
_ANOMALIES = (LATE_LOAD, OFFLINE_DEVICE, NULL_DVCE_TSTAMPS, DUPLICATE_SAME_HOUR, DUPLICATE_RELOADED, LATE_SENT, None)
_code = _ANOMALIES.index

# Delivery delays, by anomaly; None: a well-behaved event's.
_SEND_DELAY = {
    None: (timedelta(milliseconds=5), timedelta(seconds=3)),
    OFFLINE_DEVICE: (LATE_AFTER, OFFLINE_SEND_MAX),
    LATE_SENT: (LATE_SENT_MIN, LATE_SENT_MAX),
}
_COLLECT_DELAY = {None: (timedelta(milliseconds=10), timedelta(milliseconds=500))}
_LOAD_DELAY = {None: (timedelta(seconds=2), timedelta(minutes=5)), LATE_LOAD: (LATE_AFTER, LATE_LOAD_MAX)}

# Human behaviour: sessions in slots between 06:00 and 23:00, so that two sessions of a user are
# always more than SESSION_TIMEOUT apart, also across midnight.
_ACTIVE_FROM = time(6)
_ACTIVE_SPAN = timedelta(hours=17)
_SESSIONS_WEIGHTS = (2, 3, 3, 2, 1)  # of 0, 1, 2, 3 and 4 sessions a day
# A human session keeps its first page whole whatever its budget (the view, a web page's pings while
# it is open, now and then a custom event): budgets drawn around fewer events than this hold more on
# average (measured on the generator's own streams). Below it, a day's volume is met by users coming
# back on fewer days, not by shorter sessions.
_SESSION_BUDGET_AT_LEAST = 6.5
_DWELL = (timedelta(seconds=5), timedelta(minutes=3))
_SESSION_END_MARGIN = timedelta(minutes=5)  # > the longest dwell: the last page ends in time
_PING_EVERY = (timedelta(seconds=10), timedelta(seconds=30))
_NAVIGATION = (timedelta(seconds=1), timedelta(seconds=5))
_CUSTOM_EVENT_SHARE = 0.15
_MAIN_APP_SHARE = 0.8
_APP_WEIGHTS = (6, 2, 2)  # of APP_IDS as a user's main app
_LOGIN_SHARE = 0.6
_LOGIN_LATER_SHARE = 0.3  # of users who log in: only from their second session on
_BOT_CYCLE = timedelta(days=6)  # a bot starts a new endless session every cycle
_BOT_START_SPREAD = timedelta(hours=12)
_BOT_EVENTS_PER_DAY = timedelta(days=1) / ((BOT_EVENT_GAP_MIN + BOT_EVENT_GAP_MAX) / 2)
_BOT_PAGES_PER_DAY = timedelta(days=1) // BOT_EVENT_GAP_MIN + 1  # the most that fit a day

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
_EXTERNAL_REFERRERS = pa.array([None, "https://www.google.com/", "https://duckduckgo.com/", "https://news.ycombinator.com/"])

# The site as flat columns, the options of each app (in APP_IDS order) one after another.
_APPS = pa.array(APP_IDS)
_PAGE_URLS = pa.array([host and host + path for host, pages in map(_SITE.get, APP_IDS) for path, _ in pages])
_PAGE_TITLES = pa.array([title for _, pages in map(_SITE.get, APP_IDS) for _, title in pages])
_PAGES_PER_APP = [len(_SITE[app][1]) for app in APP_IDS]
_CUSTOM_NAMES = pa.array([name for app in APP_IDS for name in _CUSTOM_EVENTS_BY_APP[app]])
_CUSTOM_NAMES_PER_APP = [len(_CUSTOM_EVENTS_BY_APP[app]) for app in APP_IDS]

_SESSION_COLUMNS = (
    "domain_userid", "user_id", "app_id", "domain_sessionid", "domain_sessionidx", "platform", "event_vendor"
)
_NULL_TEXT = pa.scalar(None, pa.string())
_EPOCH = datetime(1970, 1, 1)
_DAY = timedelta(days=1)
# A UUID's text: where its 32 hex digits go among the dashes, and the digits that say version 4.
_UUID_DIGITS = [at for at in range(36) if at not in (8, 13, 18, 23)]
_UUID_VERSION, _UUID_VARIANT = 14, 19
_UUID_VARIANT_DIGITS = bytes.maketrans(b"0123456789abcdef", b"89ab" * 4)
# A session, human or bot: its output columns, then start (its first page), ends_by (no page starts
# at or after it), budget (the events it aims at), referrer (of its first page), opens_day (the
# user's first session of the day).
_SESSION_SCHEMA = pa.schema(
    [*((name, ARROW_SCHEMA.field(name).type) for name in _SESSION_COLUMNS), ("start", pa.int64()),
     ("ends_by", pa.int64()), ("budget", pa.int64()), ("referrer", pa.string()), ("opens_day", pa.bool_()),
     ("bot", pa.bool_())]
)


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
        if self.human_rows <= 0:
            raise ValueError(
                f"events_per_day must be more than the bots send ({len(self.bot_users)} bots of bot_share "
                f"{self.bot_share}, about {round(_BOT_EVENTS_PER_DAY)} events a day each): lower bot_share or raise "
                f"events_per_day, got {self.events_per_day}"
            )
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
    def human_rows(self) -> float:
        """The rows a day holds from humans: the day's volume less the duplicates' and the bots'."""
        return self.events_per_day / (1 + self.duplicate_share) - len(self.bot_users) * _BOT_EVENTS_PER_DAY

    @property
    def coming_back(self) -> float:
        """The share of a human user's days with sessions kept: below 1 when a session's budget on
        every day drawn would fall under the least it can hold (many users, few events each)."""
        sessions = len(self.human_users) * sum(n * w for n, w in enumerate(_SESSIONS_WEIGHTS)) / sum(_SESSIONS_WEIGHTS)
        return min(1.0, self.human_rows / max(sessions * _SESSION_BUDGET_AT_LEAST, 1.0))

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


def generate_table(params: SampleParams, load_from: datetime, load_until: datetime) -> pa.Table:
    """Every row with `load_from <= load_tstamp < load_until`, ordered by load_tstamp (ARROW_SCHEMA)."""
    load_from, load_until = naive(load_from), naive(load_until)
    if load_until < load_from:
        raise ValueError(f"load_until ({load_until}) is before load_from ({load_from})")
    # The event days that can have rows loaded in the window (an event day's events happen within it).
    first_day = max(params.start_date, (load_from - MAX_LATENESS).date() - _DAY)
    profiles = _profiles(params.seed, params.users)
    # Every day from the start counts its sessions (a draw per user): domain_sessionidx needs them.
    loaded, day, sessions_before = [], params.start_date, pa.repeat(0, len(params.human_users))
    while day <= load_until.date():
        session_counts = _session_counts(params, day)
        if day >= first_day:
            rows = _day_rows(params, day, profiles, session_counts, sessions_before)
            load = rows["load_tstamp"]
            in_window = pc.and_(pc.greater_equal(load, _us(load_from)), pc.less(load, _us(load_until)))
            loaded.append(rows.filter(in_window))
        sessions_before = pc.add(sessions_before, session_counts)
        day += _DAY
    if not loaded:
        return ARROW_SCHEMA.empty_table()
    table = pa.Table.from_batches(loaded)
    return table.sort_by([("load_tstamp", "ascending"), ("collector_tstamp", "ascending")]).cast(ARROW_SCHEMA)


def generate_events(params: SampleParams, load_from: datetime, load_until: datetime) -> list[tuple]:
    """`generate_table` as rows: tuples in SAMPLE_SCHEMA order then load_date, timestamps naive UTC."""
    table = generate_table(params, load_from, load_until)
    columns = (column.cast(pa.timestamp("us")) if pa.types.is_timestamp(column.type) else column for column in table)
    return list(zip(*(column.to_pylist() for column in columns)))


def _day_rows(
    params: SampleParams, day: date, profiles: pa.RecordBatch, session_counts: pa.Array, sessions_before: pa.Array
) -> pa.RecordBatch:
    """Every row of the events that happen on `day`, whenever they are loaded.

    Sessions, pages, events and rows each hold the output columns that belong to them, and every
    level knows its parent's row: each column is gathered once, from its own level.
    """
    draws = _Draws(params.seed, day)
    humans = _human_sessions(params, day, draws, profiles, session_counts, sessions_before)
    sessions = pa.concat_batches([humans, _bot_sessions(params, day, draws, profiles)])
    pages = _pages(sessions, draws)
    events = _events(pages)
    rows = _deliver(params, events, draws)
    page = pc.take(events["page"], rows["event"])
    levels = ((sessions, pc.take(pages["session"], page)), (pages, page), (events, rows["event"]))
    gathered = {
        name: pc.take(level[name], row) for level, row in levels for name in level.schema.names if name in COLUMNS
    }
    return pa.RecordBatch.from_pydict({**gathered, **_columns(rows)}).select(ARROW_SCHEMA.names)


@lru_cache(maxsize=16)
def _profiles(seed: int, users: int) -> pa.RecordBatch:
    """Who each user is, the same every day: device id, login (some only from their second session), main app."""
    draws = _Draws(seed, "users")
    logins = pa.array([f"user_{user:05d}" for user in range(users)])
    return pa.RecordBatch.from_pydict({
        "domain_userid": draws.uuids(users),
        "user_id": pc.if_else(pc.less(draws.uniform(users), _LOGIN_SHARE), logins, _NULL_TEXT),
        "login_from": pc.if_else(pc.less(draws.uniform(users), _LOGIN_LATER_SHARE), 2, 1),
        "app_id": pc.take(_APPS, _pick(draws.uniform(users), _APP_WEIGHTS)),
    })


def _session_counts(params: SampleParams, day: date) -> pa.Int64Array:
    """Sessions of each human user on a day, from the day's own stream so that domain_sessionidx
    (the sessions before) is cheap to know. At a site of many users with a few events each, a user
    has none on the days they do not come back (a stream of its own: the others stay as they were)."""
    counts = _pick(_Draws(params.seed, day, "sessions").uniform(len(params.human_users)), _SESSIONS_WEIGHTS)
    if params.coming_back < 1:
        away = pc.greater_equal(_Draws(params.seed, day, "coming back").uniform(len(counts)), params.coming_back)
        counts = pc.if_else(away, 0, counts)
    return counts


def _human_sessions(
    params: SampleParams, day: date, draws: _Draws, profiles: pa.RecordBatch, counts: pa.Array, before: pa.Array
) -> pa.RecordBatch:
    """Each human user's sessions of the day, one per equal slot of the active hours."""
    sessions = _Groups(counts)
    n, user, k = len(sessions), sessions.parent, sessions.position
    profile = profiles.take(user)
    slot = pc.divide(_us(_ACTIVE_SPAN), pc.take(counts, user))
    slot_start = pc.add(_us(datetime.combine(day, _ACTIVE_FROM)), pc.multiply(k, slot))
    index = pc.add(pc.take(before, user), pc.add(k, 1))
    app = pc.if_else(pc.less(draws.uniform(n), _MAIN_APP_SHARE), profile["app_id"], draws.choice(n, _APPS))
    target = _session_events_target(params, n)
    return _session_batch(
        n,
        domain_userid=profile["domain_userid"],
        user_id=pc.if_else(pc.greater_equal(index, profile["login_from"]), profile["user_id"], _NULL_TEXT),
        app_id=app,
        domain_sessionid=draws.uuids(n),
        domain_sessionidx=index,
        start=pc.add(slot_start, draws.between(n, timedelta(0), pc.divide(slot, 2))),
        ends_by=pc.subtract(pc.add(slot_start, slot), _us(SESSION_TIMEOUT + _SESSION_END_MARGIN)),
        budget=pc.round(pc.multiply(pc.add(draws.uniform(n), 0.5), target)),
        referrer=pc.if_else(_is_web(app), draws.choice(n, _EXTERNAL_REFERRERS), _NULL_TEXT),
        opens_day=pc.equal(k, 0),
        bot=False,
    )


def _session_events_target(params: SampleParams, sessions: int) -> float:
    """Events per human session that make the day hold about events_per_day rows (duplicates included).

    Spread over the day's actual sessions, so that busy and quiet days hold about the same volume.
    """
    return max(params.human_rows / max(sessions, 1), 1.0)


def _bot_sessions(params: SampleParams, day: date, draws: _Draws, profiles: pa.RecordBatch) -> pa.RecordBatch:
    """Each bot's session of its current cycle, as far as it falls on `day`: a page view every 20-40 minutes.

    The session (id, start, length) is drawn from the cycle's own stream, so every day of the
    cycle agrees on it without generating the days before.
    """
    n = len(params.bot_users)
    cycle = (day - params.start_date).days // _BOT_CYCLE.days
    cycle_draws = _Draws(params.seed, "bots", cycle)
    begins = pc.add(_us(params.start + cycle * _BOT_CYCLE), cycle_draws.between(n, timedelta(0), _BOT_START_SPREAD))
    ends = pc.add(begins, cycle_draws.between(n, BOT_SESSION_MIN, BOT_SESSION_MAX))
    day_start = _us(datetime.combine(day, time()))
    return _session_batch(
        n,
        domain_userid=profiles["domain_userid"].take(pa.array(params.bot_users, pa.int64())),
        user_id=None,
        app_id="website",
        domain_sessionid=cycle_draws.uuids(n),
        domain_sessionidx=cycle + 1,
        start=pc.if_else(
            pc.greater_equal(begins, day_start),
            begins,
            pc.add(day_start, draws.between(n, timedelta(0), BOT_EVENT_GAP_MIN)),
        ),
        ends_by=pc.min_element_wise(ends, day_start + _us(_DAY)),
        budget=_BOT_PAGES_PER_DAY,  # never binding: the end of the day or of the session stops it
        referrer=None,
        opens_day=False,
        bot=True,
    )


def _session_batch(n: int, **columns) -> pa.RecordBatch:
    """n sessions in _SESSION_SCHEMA; a plain value is every session's."""
    arrays = {name: value if isinstance(value, pa.Array) else pa.repeat(value, n) for name, value in columns.items()}
    arrays.update(platform=pc.if_else(_is_web(arrays["app_id"]), "web", "mob"), event_vendor=pa.repeat(EVENT_VENDOR, n))
    typed = [arrays[field.name].cast(field.type) for field in _SESSION_SCHEMA]
    return pa.RecordBatch.from_arrays(typed, schema=_SESSION_SCHEMA)


def _pages(sessions: pa.RecordBatch, draws: _Draws) -> pa.RecordBatch:
    """Each session's pages (web) or screens (mobile) in turn, until its event budget is met (to the
    nearest page) or its time is up.

    A session gets as many candidate pages as it could need (each holds an event at least), and
    keeps them up to the first that runs over.
    """
    pages = _Groups(pc.max_element_wise(sessions["budget"], 1))
    session, first, n = pages.parent, pc.equal(pages.position, 0), len(pages)
    bot, start, ends_by, budget = (pc.take(sessions[name], session) for name in ("bot", "start", "ends_by", "budget"))
    web = pc.take(pc.equal(sessions["platform"], "web"), session)
    app = pc.take(pc.index_in(sessions["app_id"], value_set=_APPS), session)
    human = pc.invert(bot)
    dwell, every = draws.between(n, *_DWELL), draws.between(n, *_PING_EVERY)
    pings = pc.if_else(pc.and_(human, web), pc.divide(pc.subtract(dwell, 1), every), 0)  # while the page is open
    custom = pc.and_(human, pc.less(draws.uniform(n), _CUSTOM_EVENT_SHARE))
    events = pc.add(pc.add(pings, 1), pc.cast(custom, pa.int64()))
    step = pc.if_else(
        bot, draws.between(n, BOT_EVENT_GAP_MIN, BOT_EVENT_GAP_MAX), pc.add(dwell, draws.between(n, *_NAVIGATION))
    )
    at = pc.add(start, pages.sum_before(step))
    # A page runs over when the budget is nearer without it, or when it would start too late.
    nearer_without = pc.greater(pc.add(pc.multiply(pages.sum_before(events), 2), events), pc.multiply(budget, 2))
    over = pc.cast(pc.or_(pc.and_(pc.invert(first), nearer_without), pc.greater_equal(at, ends_by)), pa.int64())
    kept = pa.RecordBatch.from_pydict({
        "session": session,
        "first": first,
        "bot": bot,
        "web": web,
        "site_page": _choose_per_app(draws, app, _PAGES_PER_APP),
        "custom_name": _choose_per_app(draws, app, _CUSTOM_NAMES_PER_APP),
        "at": at,
        "every": every,
        "pings": pings,
        "custom": custom,
        "custom_at": draws.between(n, timedelta(0), dwell),
        "opens_day": pc.and_(pc.take(sessions["opens_day"], session), first),
    }).filter(pc.equal(pc.add(pages.sum_before(over), over), 0))
    url = pc.take(_PAGE_URLS, kept["site_page"])
    internal = pc.if_else(kept["bot"], _NULL_TEXT, _previous(url))  # the page before; bots send none
    return pa.RecordBatch.from_pydict({
        **_columns(kept),
        "page_url": url,
        "page_title": pc.take(_PAGE_TITLES, kept["site_page"]),
        "page_referrer": pc.if_else(kept["first"], pc.take(sessions["referrer"], kept["session"]), internal),
    })


def _events(pages: pa.RecordBatch) -> pa.RecordBatch:
    """Each page's view, its page pings (one `every` apart while it is open), and its custom event if any."""
    events = _Groups(pc.add(pc.add(pages["pings"], 1), pc.cast(pages["custom"], pa.int64())))
    page, j = events.parent, events.position
    every, pings, custom_at = (pc.take(pages[name], page) for name in ("every", "pings", "custom_at"))
    view, ping = pc.equal(j, 0), pc.less_equal(j, pings)
    view_name = pc.if_else(pc.take(pages["web"], page), "page_view", "screen_view")
    custom_name = pc.take(_CUSTOM_NAMES, pc.take(pages["custom_name"], page))
    offset = pc.if_else(view, 0, pc.if_else(ping, pc.multiply(j, every), custom_at))
    return pa.RecordBatch.from_pydict({
        "page": page,
        "event_name": pc.if_else(view, view_name, pc.if_else(ping, "page_ping", custom_name)),
        "created": pc.add(pc.take(pages["at"], page), offset),
        "opens_day": pc.and_(pc.take(pages["opens_day"], page), view),
    })


def _deliver(params: SampleParams, events: pa.RecordBatch, draws: _Draws) -> pa.RecordBatch:
    """The rows the events become on their way from the device to the warehouse, each with its anomaly if any.

    Anomalies never combine, which bounds MAX_LATENESS. The rare ones are placed rather than drawn,
    on the first event of the day of a few users, so that every day holds some.
    """
    n = events.num_rows
    anomaly = _pick(draws.uniform(n), [_anomaly_shares(params).get(name, 0.0) for name in _ANOMALIES])
    openers = pc.indices_nonzero(events["opens_day"])
    null_ids = max(1, round(NULL_EVENT_ID_SHARE * params.events_per_day))
    marked = openers.take(pa.array(draws.sample(len(openers), null_ids + LATE_SENT_PER_DAY), pa.int64()))
    null_id, late_sent = (pc.is_in(_arange(n), value_set=part) for part in (marked[:null_ids], marked[null_ids:]))
    anomaly = pc.if_else(null_id, _code(None), pc.if_else(late_sent, _code(LATE_SENT), anomaly))

    created = events["created"]
    sent = pc.add(created, _delay(draws, anomaly, _SEND_DELAY))
    collector = pc.add(sent, _delay(draws, anomaly, _COLLECT_DELAY))
    load = pc.add(collector, _delay(draws, anomaly, _LOAD_DELAY))
    reload_after = draws.between(n, LATE_AFTER, DUPLICATE_RELOAD_MAX)
    null_dvce = pc.equal(anomaly, _code(NULL_DVCE_TSTAMPS))
    event = pa.RecordBatch.from_pydict({
        "event_id": pc.if_else(null_id, _NULL_TEXT, draws.uuids(n)),
        "collector_tstamp": collector,
        "dvce_created_tstamp": pc.if_else(null_dvce, None, created),
        "dvce_sent_tstamp": pc.if_else(null_dvce, None, sent),
        "derived_tstamp": pc.if_else(null_dvce, collector, pc.subtract(collector, pc.subtract(sent, created))),
    })
    duplicated = pc.is_in(anomaly, value_set=pa.array([_code(DUPLICATE_SAME_HOUR), _code(DUPLICATE_RELOADED)]))
    copies = _Groups(pc.add(pc.cast(duplicated, pa.int64()), 1))
    row_event = copies.parent
    reloaded = pc.and_(pc.equal(copies.position, 1), pc.equal(pc.take(anomaly, row_event), _code(DUPLICATE_RELOADED)))
    load = pc.add(pc.take(load, row_event), pc.if_else(reloaded, pc.take(reload_after, row_event), 0))
    return pa.RecordBatch.from_pydict({
        "event": row_event,
        **_columns(event.take(row_event)),
        "load_tstamp": load,
        LOAD_DATE: pc.cast(pc.divide(load, _us(_DAY)), pa.int32()),
    })


def _anomaly_shares(params: SampleParams) -> dict[str | None, float]:
    """The share of events that draw each anomaly; the placed ones are never drawn."""
    shares = {
        LATE_LOAD: params.late_share / 2,
        OFFLINE_DEVICE: params.late_share / 2,
        NULL_DVCE_TSTAMPS: NULL_DVCE_SHARE,
        DUPLICATE_SAME_HOUR: params.duplicate_share / 2,
        DUPLICATE_RELOADED: params.duplicate_share / 2,
    }
    return {**shares, None: 1 - sum(shares.values())}


def _delay(draws: _Draws, anomaly: pa.Array, delays: dict) -> pa.Int64Array:
    """A delay per event, from the range of its anomaly (or a well-behaved event's)."""
    low, high = (pa.array([_us(delays.get(name, delays[None])[end]) for name in _ANOMALIES]) for end in (0, 1))
    return draws.between(len(anomaly), pc.take(low, anomaly), pc.take(high, anomaly))


class _Draws:
    """Draws in bulk from one random stream, named by its key.

    The bits come from `random.Random`, seeded by the key's text (so not by hash randomisation), in
    bytes that pyarrow reads as arrays: no dependency beyond pyarrow.
    """

    def __init__(self, *key: object) -> None:
        self._random = random.Random(":".join(map(str, key)))

    def uniform(self, n: int) -> pa.DoubleArray:
        """n draws in [0, 1), from 53 random bits each."""
        words = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(self._random.randbytes(8 * n))])
        return pc.multiply(pc.cast(pc.shift_right(words, pa.scalar(11, pa.uint64())), pa.float64()), 2.0**-53)

    def between(self, n: int, low: timedelta | pa.Array, high: timedelta | pa.Array) -> pa.Int64Array:
        """n spans in [low, high), in microseconds; the bounds are timedeltas or microseconds per draw."""
        low, high = (_us(bound) if isinstance(bound, timedelta) else bound for bound in (low, high))
        return pc.add(low, _floor(pc.multiply(pc.subtract(high, low), self.uniform(n))))

    def index(self, n: int, size: int | pa.Array) -> pa.Int64Array:
        """n indices in [0, size), size given once or per draw."""
        return _floor(pc.multiply(self.uniform(n), size))

    def choice(self, n: int, options: pa.Array) -> pa.Array:
        return pc.take(options, self.index(n, len(options)))

    def sample(self, population: int, k: int) -> list[int]:
        """Up to k distinct indices in [0, population)."""
        return self._random.sample(range(population), min(k, population))

    def uuids(self, n: int) -> pa.StringArray:
        """n random (version 4) UUIDs as text, laid out by strided byte copies."""
        digits = self._random.randbytes(16 * n).hex().encode()
        text = bytearray(b"-" * (36 * n))
        for digit, at in enumerate(_UUID_DIGITS):
            text[at::36] = digits[digit::32]
        text[_UUID_VERSION::36] = b"4" * n
        text[_UUID_VARIANT::36] = text[_UUID_VARIANT::36].translate(_UUID_VARIANT_DIGITS)
        return pa.Array.from_buffers(pa.binary(36), n, [None, pa.py_buffer(text)]).cast(pa.string())


class _Groups:
    """Rows made counts[i] at a time for each parent row i (numpy's repeat, in pyarrow)."""

    def __init__(self, counts: pa.Array) -> None:
        offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(pc.cast(counts, pa.int64()))])
        rows = offsets[-1].as_py()
        self.parent = pc.list_parent_indices(pa.LargeListArray.from_arrays(offsets, pa.nulls(rows, pa.int8())))
        self.first = pc.take(offsets, self.parent)  # the first row of each row's group
        self.position = pc.subtract(_arange(rows), self.first)

    def __len__(self) -> int:
        return len(self.parent)

    def sum_before(self, values: pa.Array) -> pa.Int64Array:
        """Per row, the sum of `values` over the earlier rows of its group."""
        before = pc.subtract(pc.cumulative_sum(values), values)
        return pc.subtract(before, pc.take(before, self.first))


def _pick(draws: pa.DoubleArray, weights: Sequence[float]) -> pa.Int64Array:
    """The index each uniform draw picks among options of the given weights."""
    picked, bound, total = pa.repeat(0, len(draws)), 0.0, sum(weights)
    for weight in weights[:-1]:
        bound += weight
        picked = pc.add(picked, pc.cast(pc.greater_equal(draws, bound / total), pa.int64()))
    return picked


def _choose_per_app(draws: _Draws, app: pa.Array, options_per_app: list[int]) -> pa.Int64Array:
    """For each row, a uniform choice among its app's options in a flat column (apps in APP_IDS order)."""
    firsts = pa.array([sum(options_per_app[:i]) for i in range(len(options_per_app))])
    return pc.add(pc.take(firsts, app), draws.index(len(app), pc.take(pa.array(options_per_app), app)))


def _columns(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    return dict(zip(batch.schema.names, batch.columns))


def _is_web(app: pa.Array) -> pa.BooleanArray:
    return pc.not_equal(app, "mobile_app")


def _previous(values: pa.Array) -> pa.Array:
    """Each row's predecessor's value (null for the first row)."""
    return pa.concat_arrays([pa.nulls(1, values.type), values[:-1]])[: len(values)]


def _arange(n: int) -> pa.Int64Array:
    return pc.subtract(pc.cumulative_sum(pa.repeat(1, n)), 1)


def _floor(values: pa.Array) -> pa.Int64Array:
    return pc.cast(pc.floor(values), pa.int64())


def _us(value: timedelta | datetime) -> int:
    """Microseconds: of a span, or of a (naive UTC) moment since the epoch."""
    return ((value - _EPOCH) if isinstance(value, datetime) else value) // timedelta(microseconds=1)
