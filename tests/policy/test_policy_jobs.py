"""Pure job decisions: backoff tables, deadlines, and admission invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.policy.jobs import (
    BACKOFF_CAP_SECONDS,
    Queued,
    admit,
    backoff,
    job_deadline_seconds,
    retry_or_fail,
)


def test_linear_and_exponential_tables() -> None:
    assert [backoff("linear", n) for n in range(1, 6)] == [5, 10, 15, 20, 25]
    assert [backoff("exponential", n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 320, 600]
    assert backoff("linear", 1000) == BACKOFF_CAP_SECONDS
    assert backoff("exponential", 10**6) == BACKOFF_CAP_SECONDS


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="retry_number starts at 1, got 0"):
        backoff("linear", 0)
    with pytest.raises(ValueError, match="must be linear or exponential, not 'fast'"):
        backoff("fast", 1)  # type: ignore[arg-type]


@given(st.sampled_from(["linear", "exponential"]), st.integers(1, 500))
def test_backoff_grows_and_stays_under_the_cap(strategy: str, n: int) -> None:
    assert 0 < backoff(strategy, n) <= backoff(strategy, n + 1) <= BACKOFF_CAP_SECONDS  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("timeout", "maximum", "expected"),
    [
        (60, 28800, 60),
        (None, 28800, 28800),
        (99999, 28800, 28800),
        (30, None, 30),
        (None, None, None),
    ],
)
def test_a_timeout_shortens_never_extends(
    timeout: float | None, maximum: float | None, expected: float | None
) -> None:
    assert job_deadline_seconds(timeout, maximum) == expected


def test_retry_while_retries_remain() -> None:
    assert [retry_or_fail(n, 3) for n in range(5)] == [True, True, True, False, False]
    assert retry_or_fail(0, 0) is False


jobs = st.lists(st.integers(1, 4), max_size=12).map(
    lambda sizes: [Queued(f"j{i}", size) for i, size in enumerate(sizes)]
)


@given(jobs, st.integers(0, 10), st.integers(0, 5), st.none() | st.integers(0, 8))
def test_admission_takes_a_prefix_that_fits(
    queue: list[Queued], free: int, in_flight: int, concurrency: int | None
) -> None:
    admitted = admit(queue, free, in_flight, concurrency)
    ids = [job.id for job in queue]
    assert admitted == ids[: len(admitted)], "nothing behind the head overtakes it"
    assert sum(job.slots for job in queue[: len(admitted)]) <= free
    if concurrency is not None:
        assert in_flight + len(admitted) <= max(concurrency, in_flight)
    if len(admitted) < len(queue):  # stopped for a reason: the next does not fit, or the cap
        used = sum(job.slots for job in queue[: len(admitted)])
        blocked_by_cap = concurrency is not None and in_flight + len(admitted) >= concurrency
        assert blocked_by_cap or queue[len(admitted)].slots > free - used


def test_head_of_line_blocking_example() -> None:
    queue = [Queued("big", 3), Queued("small", 1)]
    assert admit(queue, 2) == []
    assert admit(queue, 3) == ["big"]
    assert admit(queue, 4) == ["big", "small"]


# --- waiting jobs no pool will take ---------------------------------------------------------------


def test_orphaned_names_each_group_no_pool_takes_and_why() -> None:
    from sp00ky_infra.policy.jobs import Route, orphaned

    routes = {
        "renderer": Route("render_job", "render"),
        "thumbs": Route("thumb_job", "gpu"),
        "mailer": Route("mail_job", None),
        "resizer": Route("resize_v2", "render"),
    }
    waiting = [
        ("renderer", "render_job", "render"),  # as declared: kept
        ("gone", "gone_job", "render"),
        ("thumbs", "thumb_job", "thumb"),
        ("mailer", "mail_job", "render"),
        ("resizer", "resize_job", "render"),
    ]
    assert orphaned(waiting, routes) == {
        ("gone", "gone_job", "render"): "backend gone was removed from sp00ky.yml",
        ("thumbs", "thumb_job", "thumb"): (
            "backend thumbs no longer runs on pool thumb (it runs on pool gpu now)"
        ),
        ("mailer", "mail_job", "render"): (
            "backend mailer no longer runs on pool render (it runs on no pool now)"
        ),
        ("resizer", "resize_job", "render"): (
            "backend resizer now reads outbox table resize_v2, not resize_job"
        ),
    }
    assert orphaned([], routes) == {}
