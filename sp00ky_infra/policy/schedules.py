"""Schedules' cadences and fire decisions (the Jobs docs, "Scheduled and multi-step work"). Pure.

A cadence is a 5-field cron expression (``0 3 * * *``) or an interval (``every: 1m``); both
are read in UTC (the docs name no time zone). Fire times are whole instants that every
controller computes alike from the cadence alone: a cron expression's matching minutes, an
interval's multiples since the Unix epoch (``every: 1m`` fires on every minute boundary,
``every: 90s`` at 00:00:00, 00:01:30, ...). So two controllers of one store agree on a fire's
time, and the store's key on (schedule, fire time) makes each fire happen once.

Catch-up: when fire times were missed (the controller was down, or no leader ticked), the
schedule fires once, for the latest missed time, and the earlier ones are skipped
(``Due.missed_since`` says from when). A schedule seen for the first time fires first at its
next fire time after that moment, never for times before it existed.

Pausing: a paused schedule makes no fire; on resume the fire times it missed while paused
are not made (not even one catch-up fire): it fires next at its first fire time after the
resume (``resumed_cursor``). A deploy never un-pauses a schedule, as it never un-pauses a pool.

Fan-out (``forEach``): a fire's items are its query's rows, each named by its key column's
value (``fan_out_items``); the fire fails whole (``FanOutRefused``) when the rows are more than
``maxRows``, lack the key column, or a key is missing or on two rows. An item's job payload
is the schedule's with the key added (``item_payload``). Concurrency applies per item.

Concurrency (the docs' policies): ``skip`` (the default) records a fire that finds the
schedule's previous run still pending or processing as ``skipped`` and creates no job;
``replace`` kills the previous run, recorded ``replaced``, and starts the new one; ``allow``
starts the new one beside it.

Cron syntax: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or JAN-DEC), day
of week (0-7 or SUN-SAT; 0 and 7 are Sunday); each field ``*``, a value, a range ``a-b``, a
step ``*/n``, ``a-b/n`` or ``a/n``, or a comma-separated list of those; the macros
``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and
``@hourly``. When both day of month and day of week are restricted, a day matching either
fires (as cron has always done).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

ConcurrencyPolicy = Literal["skip", "replace", "allow"]
POLICIES: tuple[ConcurrencyPolicy, ...] = ("skip", "replace", "allow")
DEFAULT_POLICY: ConcurrencyPolicy = "skip"  # Jobs docs, Retention: "the default concurrency: skip"
FireAction = Literal["fire", "skip", "replace"]

FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A cron expression that matches no real date (``0 0 31 2 *``) is found by looking this far
# ahead: the Gregorian calendar repeats every 400 years, Feb 29 on a given weekday within 28.
_HORIZON_YEARS = 29
EXAMPLE = '"0 3 * * *" (03:00 UTC every day) or "*/15 * * * *" (every 15 minutes)'


class CronError(ValueError):
    """A cron expression that cannot be read; ``field`` names the part that is wrong."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed 5-field cron expression, read in UTC."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    days_restricted: bool  # the day-of-month field is not "*"
    weekdays_restricted: bool

    def _day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def next_after(self, after: float) -> float | None:
        """The first fire time strictly after ``after`` (unix seconds), or None if the
        expression matches no date (``0 0 31 2 *``)."""
        start = datetime.fromtimestamp(after // 60 * 60, UTC) + timedelta(minutes=1)
        at = start
        horizon = start.year + _HORIZON_YEARS
        while at.year <= horizon:
            if at.month not in self.months:
                at = _first_of_next_month(at)
                continue
            if not self._day_matches(at):
                at = (at + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if at.hour not in self.hours:
                at = (at + timedelta(hours=1)).replace(minute=0)
                continue
            if at.minute not in self.minutes:
                at += timedelta(minutes=1)
                continue
            return at.timestamp()
        return None


@dataclass(frozen=True, slots=True)
class Interval:
    """``every: DURATION``: the multiples of ``seconds`` since the Unix epoch."""

    seconds: float

    def next_after(self, after: float) -> float:
        return (after // self.seconds + 1) * self.seconds


Cadence = Cron | Interval


def _first_of_next_month(at: datetime) -> datetime:
    year, month = (at.year + 1, 1) if at.month == 12 else (at.year, at.month + 1)
    return at.replace(year=year, month=month, day=1, hour=0, minute=0)


def _value(text: str, index: int) -> int:
    upper = text.upper()
    if index == 3 and upper in _MONTHS:
        return _MONTHS.index(upper) + 1
    if index == 4 and upper in _DAYS:
        return _DAYS.index(upper)
    if not text.isdigit():
        names = {3: " or a month name (JAN-DEC)", 4: " or a day name (SUN-SAT)"}.get(index, "")
        raise CronError(f"{text!r} is not a number{names}", FIELD_NAMES[index])
    return int(text)


def _field(text: str, index: int) -> frozenset[int]:
    name = FIELD_NAMES[index]
    low, high = _BOUNDS[index]
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{text!r} has an empty item in its list", name)
        spread, _, step_text = part.partition("/")
        step = 1
        if step_text or part.endswith("/"):
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"step {step_text!r} in {part!r} must be a whole number >= 1", name)
            step = int(step_text)
        if spread == "*":
            first, last = low, high
        elif "-" in spread:
            left, _, right = spread.partition("-")
            first, last = _value(left, index), _value(right, index)
            if first > last:
                raise CronError(f"range {spread!r} runs backwards; write {right}-{left}", name)
        else:
            first = _value(spread, index)
            last = high if step_text else first
        for bound in (first, last):
            if not low <= bound <= high:
                raise CronError(f"{bound} is out of range {low}-{high}", name)
        values.update(range(first, last + 1, step))
    if index == 4 and 7 in values:  # 7 is Sunday too
        values = (values - {7}) | {0}
    return frozenset(values)


def parse_cron(text: str) -> Cron:
    """Read a 5-field cron expression (or a macro); CronError names the field that is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise CronError(f"{text!r} is not a cron expression; write one like {EXAMPLE}")
    expression = MACROS.get(text.strip().lower(), text)
    if expression.strip().startswith("@"):
        raise CronError(
            f"{text.strip()!r} is not a cron macro; use one of {', '.join(sorted(MACROS))}"
        )
    parts = expression.split()
    if len(parts) != 5:
        extra = " (seconds and years are not supported)" if len(parts) in (6, 7) else ""
        raise CronError(
            f"{text!r} has {len(parts)} fields; a cron expression has 5: minute hour "
            f"day-of-month month day-of-week{extra}, like {EXAMPLE}"
        )
    fields = [_field(part, index) for index, part in enumerate(parts)]
    cron = Cron(
        text=text,
        minutes=fields[0],
        hours=fields[1],
        days=fields[2],
        months=fields[3],
        weekdays=fields[4],
        days_restricted=not parts[2].startswith("*"),
        weekdays_restricted=not parts[4].startswith("*"),
    )
    if cron.next_after(0.0) is None:  # 29 years from 1970 hold every date there is
        raise CronError(
            f"{text!r} matches no date (day {parts[2]} of month {parts[3]} never exists)",
            FIELD_NAMES[2],
        )
    return cron


@dataclass(frozen=True, slots=True)
class Due:
    """A fire to make now: for ``fire_at``; ``missed_since`` is the first of the earlier fire
    times that were missed and are not fired (None when none was)."""

    fire_at: float
    missed_since: float | None = None


def next_fire(cadence: Cadence, last_fire: float | None, since: float) -> float | None:
    """The next fire time: the first after the last fire, or after ``since`` (when the
    schedule was first seen) if it never fired."""
    return cadence.next_after(last_fire if last_fire is not None else since)


def due(cadence: Cadence, last_fire: float | None, since: float, now: float) -> Due | None:
    """The fire to make at ``now``, if any: the latest fire time not after ``now`` that comes
    after the last fire (the catch-up rule: one fire, for the latest missed time)."""
    first = next_fire(cadence, last_fire, since)
    if first is None or first > now:
        return None
    latest = _latest_at_or_before(cadence, first, now)
    return Due(latest, first if latest > first else None)


def _latest_at_or_before(cadence: Cadence, first: float, now: float) -> float:
    """The last fire time in [first, now] (``first`` is one): a look back over a window that
    doubles, so that a long outage costs a few windows, not one step per missed time."""
    if isinstance(cadence, Interval):
        return max(first, now // cadence.seconds * cadence.seconds)
    window = 86400.0
    while True:
        start = max(first, now - window)
        at = first if start == first else cadence.next_after(start - 1)
        latest = None
        while at is not None and at <= now:
            latest = at
            at = cadence.next_after(at)
        if latest is not None:
            return latest
        window *= 2


def on_fire(policy: ConcurrencyPolicy, previous_running: bool) -> FireAction:
    """What a fire does given whether the schedule's previous run is still pending or
    processing: start a job (``fire``), record ``skipped``, or kill the previous run
    (recorded ``replaced``) and start a job."""
    if not previous_running or policy == "allow":
        return "fire"
    return "skip" if policy == "skip" else "replace"


# --- pausing -----------------------------------------------------------------------------------


def resumed_cursor(last_fire: float | None, resumed_at: float | None) -> float | None:
    """The fire cursor of a schedule that may have been paused: the fire times missed while it
    was paused are never made, so its next fire is the first after the later of its last fire
    and its resume (a schedule never paused: its last fire)."""
    if resumed_at is None:
        return last_fire
    return resumed_at if last_fire is None else max(last_fire, resumed_at)


# --- fan-out (``forEach``) -------------------------------------------------------------------

DEFAULT_FOR_EACH_MAX_ROWS = 10_000  # Jobs docs: "a fan-out can create 10,000 rows in one fire"
DEFAULT_FOR_EACH_TIMEOUT = 10.0  # seconds the query may run: a tick is not held longer
FAN_OUT_BATCH = 500  # items made a transaction: a standby finishes the rest of a fan-out
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_STARTS = ("select", "with")


def query_problem(query: Any) -> str | None:
    """Why ``query`` is not a single SELECT (what can be told without a database), or None.
    The store still runs it read-only: this only names the mistake before a fire does."""
    if not isinstance(query, str) or not query.strip():
        return "the query is empty; write one SELECT, like `SELECT id FROM tenant`"
    text = query.strip().rstrip(";").strip()
    if ";" in _outside_quotes(text):
        return "the query holds more than one statement; write a single SELECT"
    first = text.split(None, 1)[0].lower()
    if first not in _STARTS:
        return f"the query starts with {first.upper()}, not SELECT; it may only read rows"
    return None


def _outside_quotes(text: str) -> str:
    """``text`` without its quoted parts ('...', "..."), so a ; inside a string is no split."""
    out, quote = [], ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        else:
            out.append(char)
    return "".join(out)


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot name a column of the query's rows, or None."""
    if not isinstance(key, str) or not _IDENTIFIER.match(key):
        return f"key {key!r} is not a column name; name the column that identifies a row, like id"
    return None


def selected_columns(query: str) -> tuple[str, ...] | None:
    """The column names a plain ``SELECT a, b AS c FROM ...`` gives, or None when they cannot
    be told without the database (``*``, a WITH, expressions without a name)."""
    match = re.match(r"\s*select\s+(?:distinct\s+)?(.*?)\s+from\s", query, re.I | re.S)
    if match is None:
        return None
    names = []
    for part in _top_level(match.group(1)):
        words = part.split()
        if len(words) == 1 and "*" not in part:
            name = words[0].split(".")[-1].strip('"')
        elif len(words) >= 3 and words[-2].lower() == "as":
            name = words[-1].strip('"')
        else:  # a star, or an expression named by the database
            return None
        if not _IDENTIFIER.match(name):
            return None
        names.append(name)
    return tuple(names)


def _top_level(select_list: str) -> list[str]:
    """The select list's items: split at the commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in select_list:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


@dataclass(frozen=True, slots=True)
class FanOutRefused:
    """A fire whose query's rows cannot be fanned out: the whole fire fails, nothing is made."""

    reason: str


def fan_out_items(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], key: str, max_rows: int
) -> tuple[str, ...] | FanOutRefused:
    """The items of one fire: each row's key value as JSON text (its identity in the store,
    and what its job's payload carries), in the query's order; refused when the rows exceed
    ``max_rows``, lack the key column, or a key is missing or given twice."""
    if len(rows) > max_rows:
        return FanOutRefused(
            f"the query returned more than maxRows ({max_rows}) rows; narrow it or raise "
            "forEach.maxRows"
        )
    if key not in columns:
        return FanOutRefused(
            f"the query's rows have no column {key!r} (columns: {', '.join(columns) or 'none'}); "
            "select it or change forEach.key"
        )
    index = list(columns).index(key)
    items: list[str] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, 1):
        value = row[index]
        if value is None or value == "":
            return FanOutRefused(f"row {number} has no {key} (null or empty): every row needs one")
        item = json.dumps(value if isinstance(value, (int, float, str, bool)) else str(value))
        if item in seen:
            return FanOutRefused(
                f"{key} {item} is on more than one row; the key must identify one row"
            )
        seen.add(item)
        items.append(item)
    return tuple(items)


def item_payload(payload: Any, key: str, item: str) -> dict[str, Any]:
    """An item's job payload: the schedule's payload (an object, or none) with the row's key
    under the key's column name (``{"id": 42}`` for ``key: id``)."""
    base = dict(payload) if isinstance(payload, Mapping) else {}
    return {**base, key: json.loads(item)}
