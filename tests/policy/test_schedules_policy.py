"""Cadences and fire decisions (policy/schedules.py): the docs' examples, cron's corners, and
next_after checked against a plain scan of the calendar."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sp00ky_infra.policy.schedules import (
    CronError,
    Due,
    Interval,
    due,
    next_fire,
    on_fire,
    parse_cron,
)
from tests.helpers import examples


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S %a")


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("0 3 * * *", "2026-11-30 02:59:59", "2026-11-30 03:00:00 Mon"),  # the docs' nightly
        ("0 3 * * *", "2026-11-30 03:00:00", "2026-12-01 03:00:00 Tue"),  # strictly after
        ("*/15 * * * *", "2026-11-30 10:07:00", "2026-11-30 10:15:00 Mon"),
        ("*/15 * * * *", "2026-11-30 23:50:00", "2026-12-01 00:00:00 Tue"),
        ("5-10/2 * * * *", "2026-11-30 10:07:30", "2026-11-30 10:09:00 Mon"),
        ("30 8 * * MON-FRI", "2026-12-04 09:00:00", "2026-12-07 08:30:00 Mon"),
        ("0 0 * * 7", "2026-11-30 00:00:00", "2026-12-06 00:00:00 Sun"),  # 7 is Sunday
        ("0 0 1 JAN *", "2026-06-01 00:00:00", "2027-01-01 00:00:00 Fri"),
        ("0 12 31 * *", "2026-11-01 00:00:00", "2026-12-31 12:00:00 Thu"),  # November has 30
        ("0 0 29 2 *", "2026-03-01 00:00:00", "2028-02-29 00:00:00 Tue"),
        ("0 0 13 * FRI", "2026-11-30 00:00:00", "2026-12-04 00:00:00 Fri"),  # day OR weekday
        ("@hourly", "2026-11-30 10:00:00", "2026-11-30 11:00:00 Mon"),
        ("@daily", "2026-12-31 23:59:00", "2027-01-01 00:00:00 Fri"),
        ("@weekly", "2026-11-30 00:00:00", "2026-12-06 00:00:00 Sun"),
        ("0 0 1,15 * *", "2026-11-02 00:00:00", "2026-11-15 00:00:00 Sun"),
    ],
)
def test_next_fire_times(expression: str, after: str, expected: str) -> None:
    assert iso(parse_cron(expression).next_after(at(after))) == expected


@pytest.mark.parametrize(
    ("expression", "field", "words"),
    [
        ("60 * * * *", "minute", "60 is out of range 0-59"),
        ("0 24 * * *", "hour", "24 is out of range 0-23"),
        ("0 0 0 * *", "day of month", "0 is out of range 1-31"),
        ("0 0 * 13 *", "month", "13 is out of range 1-12"),
        ("0 0 * * 8", "day of week", "8 is out of range 0-7"),
        ("*/0 * * * *", "minute", "step '0'"),
        ("0 5-1 * * *", "hour", "runs backwards"),
        ("0 0 * * FUNDAY", "day of week", "day name (SUN-SAT)"),
        ("1,,2 * * * *", "minute", "empty item"),
        ("0 0 31 2 *", "day of month", "matches no date"),
    ],
)
def test_a_bad_expression_names_its_field(expression: str, field: str, words: str) -> None:
    with pytest.raises(CronError) as caught:
        parse_cron(expression)
    assert caught.value.field == field
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("0 3 * *", "has 4 fields; a cron expression has 5"),
        ("0 0 3 * * *", "seconds and years are not supported"),
        ("@sometimes", "not a cron macro"),
        ("", "not a cron expression"),
    ],
)
def test_a_bad_shape_says_what_a_cron_expression_is(expression: str, words: str) -> None:
    with pytest.raises(CronError, match=words):
        parse_cron(expression)


def test_intervals_are_multiples_since_the_epoch() -> None:
    every = Interval(90.0)
    assert every.next_after(0.0) == 90.0
    assert every.next_after(89.9) == 90.0
    assert every.next_after(90.0) == 180.0
    assert Interval(60.0).next_after(at("2026-11-30 10:00:30")) == at("2026-11-30 10:01:00")


def test_a_new_schedule_fires_first_at_its_next_time_after_it_was_seen() -> None:
    nightly = parse_cron("0 3 * * *")
    seen = at("2026-11-30 12:00:00")
    assert next_fire(nightly, None, seen) == at("2026-12-01 03:00:00")
    assert due(nightly, None, seen, at("2026-12-01 02:59:59")) is None
    assert due(nightly, None, seen, at("2026-12-01 03:00:01")) == Due(at("2026-12-01 03:00:00"))


def test_catch_up_fires_once_for_the_latest_missed_time() -> None:
    nightly = parse_cron("0 3 * * *")
    last = at("2026-11-27 03:00:00")
    now = at("2026-11-30 09:00:00")  # down for the 28th, 29th and 30th
    assert due(nightly, last, 0.0, now) == Due(
        at("2026-11-30 03:00:00"), missed_since=at("2026-11-28 03:00:00")
    )
    # Once fired, nothing more is due until the next time.
    assert due(nightly, at("2026-11-30 03:00:00"), 0.0, now) is None


def test_catch_up_after_a_long_outage_looks_back_in_windows() -> None:
    monthly = parse_cron("0 0 1 * *")
    found = due(monthly, at("2020-01-01 00:00:00"), 0.0, at("2026-11-30 00:00:00"))
    assert found == Due(at("2026-11-01 00:00:00"), missed_since=at("2020-02-01 00:00:00"))
    every = Interval(60.0)
    assert due(every, 600.0, 0.0, 6_000.5) == Due(6_000.0, missed_since=660.0)
    assert due(every, 600.0, 0.0, 660.0) == Due(660.0)  # exactly on time: nothing missed


@pytest.mark.parametrize(
    ("policy", "running", "action"),
    [
        ("skip", False, "fire"),
        ("skip", True, "skip"),
        ("replace", False, "fire"),
        ("replace", True, "replace"),
        ("allow", True, "fire"),
        ("allow", False, "fire"),
    ],
)
def test_concurrency_policies(policy: str, running: bool, action: str) -> None:
    assert on_fire(policy, running) == action  # type: ignore[arg-type]


# --- next_after against a plain scan ---------------------------------------------------------


def _scan(expression: str, after: float) -> float | None:
    """The first matching minute after ``after``, found day by day then minute by minute."""
    cron = parse_cron(expression)
    start = datetime.fromtimestamp(after // 60 * 60, UTC) + timedelta(minutes=1)
    day = start.replace(hour=0, minute=0)
    for _ in range(366 * 9):
        in_month = day.day in cron.days
        in_week = day.isoweekday() % 7 in cron.weekdays
        both = cron.days_restricted and cron.weekdays_restricted
        if day.month in cron.months and ((in_month or in_week) if both else in_month and in_week):
            for minute in range(24 * 60):
                moment = day + timedelta(minutes=minute)
                if moment >= start and moment.hour in cron.hours and moment.minute in cron.minutes:
                    return moment.timestamp()
        day += timedelta(days=1)
    return None


def _item(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    return st.one_of(
        value.map(str),
        st.tuples(value, value).map(lambda pair: f"{min(pair)}-{max(pair)}"),
        st.integers(1, high - low + 1).map(lambda step: f"*/{step}"),
        st.tuples(value, st.integers(1, 9)).map(lambda pair: f"{pair[0]}/{pair[1]}"),
    )


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), st.lists(_item(low, high), min_size=1, max_size=3).map(",".join))


expressions = st.tuples(
    _field(0, 59), _field(0, 23), _field(1, 28), _field(1, 12), _field(0, 7)
).map(" ".join)


@settings(max_examples=examples(150), deadline=None)
@given(expressions, st.integers(0, 4_000_000_000))
def test_next_after_agrees_with_a_scan(expression: str, after: int) -> None:
    expected = _scan(expression, float(after))
    found = parse_cron(expression).next_after(float(after))
    assert found == expected, (expression, iso(after), iso(found), iso(expected))


@settings(max_examples=examples(100), deadline=None)
@given(
    st.integers(1, 7200),
    st.one_of(st.none(), st.integers(0, 10**6)),
    st.integers(0, 10**6),
    st.integers(0, 10**7),
)
def test_an_interval_fires_at_most_once_per_decision_and_never_early(
    every: int, last: int | None, since: int, now: int
) -> None:
    cadence = Interval(float(every))
    decision = due(cadence, None if last is None else float(last), float(since), float(now))
    anchor = last if last is not None else since
    if decision is None:
        assert cadence.next_after(anchor) > now
        return
    assert anchor < decision.fire_at <= now
    assert decision.fire_at % every == 0
    assert cadence.next_after(decision.fire_at) > now  # the latest: nothing later is due
