"""The Hetzner API client against the fake API over real HTTP on 127.0.0.1: rate limits,
retries of busy deletes, and a create that is never made twice. Time is a shared fake clock
that the client's injected sleep moves forward, so nothing sleeps for real."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from sp00ky_infra.hetzner import Firewall, HcloudError, HetznerAPI, RateLimit
from sp00ky_infra.hetzner.domain import FirewallRule
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner

NOW = 1_750_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        api.clock = clock
        yield api


def _api(fake: FakeHetzner, clock: Clock, **kwargs: Any) -> HetznerAPI:
    return HetznerAPI(
        TOKEN,
        fake.url,
        wait=lambda attempt, after: after if after is not None else 0.5 * attempt,
        sleep=clock.sleep,
        clock=clock,
        **kwargs,
    )


def test_every_answer_carries_the_rate_limit_headers(fake: FakeHetzner) -> None:
    for token in (TOKEN, "wrong"):  # authenticated or not
        answer = requests.get(
            f"{fake.url}/servers", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert int(answer.headers["RateLimit-Limit"]) == 3600
        assert int(answer.headers["RateLimit-Reset"]) >= NOW  # a unix timestamp
    assert answer.status_code == 401
    assert answer.headers["RateLimit-Remaining"] == "3598"
    assert RateLimit.from_headers(answer.headers) == RateLimit(3600, 3598, NOW + 2)


def test_a_429_is_waited_out_until_the_reset(fake: FakeHetzner, clock: Clock) -> None:
    fake.rate_limit_remaining = 0  # the budget is spent: full again in an hour
    api = _api(fake, clock, rate_limit_wait_cap=7200)
    assert api.servers() == []
    assert clock.slept == [3600.0]  # RateLimit-Reset said so; the fake clock moved on
    assert api.rate_limit == RateLimit(3600, 3599, NOW + 3600 + 1)


def test_a_429_waits_no_longer_than_the_cap_since_the_budget_refills_gradually(
    fake: FakeHetzner, clock: Clock
) -> None:
    fake.rate_limit_remaining = 0
    api = _api(fake, clock)
    assert api.servers() == []
    assert clock.slept == [60.0]  # 60 requests are back by then (one a second at 3600/h)
    assert api.rate_limit is not None and api.rate_limit.remaining == 59


def test_a_429_still_limited_after_the_wait_is_waited_out_again_then_refused(
    fake: FakeHetzner, clock: Clock
) -> None:
    fake.rate_limit = 1  # one request an hour: a minute's wait never buys one back
    fake.rate_limit_remaining = 0
    with pytest.raises(HcloudError) as caught:
        _api(fake, clock).servers()
    assert caught.value.code == "rate_limit_exceeded" and caught.value.status == 429
    assert clock.slept == [60.0] * 4  # bounded: max_tries answers, four waits


def test_a_post_is_retried_after_a_429_it_was_refused_before_anything_happened(
    fake: FakeHetzner, clock: Clock
) -> None:
    fake.fail_next = [(429, "rate_limit_exceeded", None)]
    api = _api(fake, clock)
    server = api.create_server(name="m1", server_type="cx33", image="debian-12", labels={})
    assert list(fake.servers) == [server.id]
    assert [r[0] for r in fake.requests] == ["POST", "POST"]


def test_delete_retries_locked_and_conflict_then_succeeds(fake: FakeHetzner, clock: Clock) -> None:
    server = fake.add_server("m1", {})
    fake.fail_next = [(423, "locked", None), (409, "conflict", None)]
    assert _api(fake, clock, busy_tries=5).delete_server(server["id"]) is True
    assert fake.servers == {} and clock.slept == [0.5, 1.0]


def test_a_delete_locked_for_too_long_fails_naming_the_code(
    fake: FakeHetzner, clock: Clock
) -> None:
    server = fake.add_server("m1", {})
    fake.fail_next = [(423, "locked", None)] * 3
    with pytest.raises(HcloudError) as caught:
        _api(fake, clock, busy_tries=3).delete_server(server["id"])
    assert str(caught.value) == (
        "locked: cannot perform operation because server is locked (HTTP 423)"
    )
    assert server["id"] in fake.servers and clock.slept == [0.5, 1.0]


def test_a_delete_is_tried_once_unless_asked(fake: FakeHetzner, clock: Clock) -> None:
    server = fake.add_server("m1", {})
    fake.fail_next = [(423, "locked", None)]
    with pytest.raises(HcloudError, match="locked"):
        _api(fake, clock).delete_server(server["id"])


def test_a_late_first_create_is_found_not_made_twice(fake: FakeHetzner, clock: Clock) -> None:
    """The first POST got no answer and made nothing visible yet; the second meets the name
    the first one took after all: the lookup answers with that server."""
    body = {"name": "m1", "server_type": "cx33", "image": "debian-12", "labels": {"a": "1"}}
    fake.fail_next = [(502, "bad_gateway", None)]
    api = _api(fake, clock)
    real_server_named = api.server_named
    lookups: list[str] = []

    def late(name: str) -> object:
        lookups.append(name)
        if len(lookups) == 1:  # the first attempt lands just after the first lookup
            found = real_server_named(name)
            fake.add_server("m1", {"a": "1"})
            return found
        return real_server_named(name)

    api.server_named = late  # type: ignore[assignment, method-assign]
    server = api.create_server(**body)
    assert list(fake.servers) == [server.id] and lookups == ["m1", "m1"]


def test_a_name_taken_by_another_server_is_not_mistaken_for_ours(
    fake: FakeHetzner, clock: Clock
) -> None:
    fake.add_server("m1", {"team": "web"})
    fake.fail_next = [(500, "server_error", None)]
    body = {"name": "m1", "server_type": "cx33", "image": "debian-12", "labels": {"a": "1"}}
    with pytest.raises(HcloudError) as caught:
        _api(fake, clock).create_server(**body)
    assert caught.value.code == "uniqueness_error" and len(fake.servers) == 1


def test_a_post_that_never_gets_an_answer_is_not_repeated_blindly(clock: Clock) -> None:
    api = HetznerAPI(
        TOKEN, "http://127.0.0.1:9", timeout=0.5, sleep=clock.sleep, wait=lambda *_: 1.0
    )
    with pytest.raises(HcloudError) as caught:
        api.create_server(name="m1", server_type="cx33", image="debian-12")
    assert caught.value.code == "unreachable" and caught.value.outcome_unknown


# --- firewalls ---------------------------------------------------------------------------------


def test_a_firewall_create_that_failed_before_making_it_is_tried_again(
    fake: FakeHetzner, clock: Clock
) -> None:
    fake.fail_next = [(503, "unavailable", None)]
    firewall = _api(fake, clock).create_firewall("sp00ky-shop-render", {"sp00ky/pool": "render"})
    assert list(fake.firewalls) == [firewall.id] and firewall.rules == ()
    assert fake.firewalls[firewall.id]["rules"] == []  # none: no inbound, all outbound
    assert [r[0] for r in fake.requests] == ["POST", "GET", "POST"]


def test_a_firewall_name_taken_by_another_is_not_mistaken_for_ours(
    fake: FakeHetzner, clock: Clock
) -> None:
    api = _api(fake, clock)
    api.create_firewall("sp00ky-shop-render", {"team": "web"})
    fake.fail_next = [(502, "bad_gateway", None)]
    with pytest.raises(HcloudError) as caught:
        api.create_firewall("sp00ky-shop-render", {"sp00ky/pool": "render"})
    assert caught.value.code == "uniqueness_error" and len(fake.firewalls) == 1


def test_a_firewall_delete_waits_out_resource_in_use_only_when_asked(
    fake: FakeHetzner, clock: Clock
) -> None:
    api = _api(fake, clock)
    firewall = api.create_firewall("sp00ky-shop-render", {})
    server = fake.add_server("m1", {})
    fake.firewalls[firewall.id]["applied_to"].append(
        {"type": "server", "server": {"id": server["id"]}}
    )
    with pytest.raises(HcloudError) as caught:  # one try by default (the guardian's)
        api.delete_firewall(firewall.id)
    assert str(caught.value) == (
        f"resource_in_use: firewall with ID {firewall.id} is still in use (HTTP 422)"
    )
    fake.server_delete_lag = 2
    requests.delete(
        f"{fake.url}/servers/{server['id']}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert _api(fake, clock, busy_tries=5).delete_firewall(firewall.id) is True
    assert fake.firewalls == {} and clock.slept == [0.5, 1.0]
    assert _api(fake, clock).delete_firewall(firewall.id) is False  # gone: done


def test_firewall_labels_and_name_are_replaced_in_place(fake: FakeHetzner, clock: Clock) -> None:
    api = _api(fake, clock)
    made = api.create_firewall("fw", {"a": "1", "b": "2"})
    updated = api.update_firewall(made.id, labels={"a": "3"})
    assert (updated.id, updated.name, dict(updated.labels)) == (made.id, "fw", {"a": "3"})
    renamed = api.update_firewall(made.id, name="fw2")
    assert (renamed.name, dict(renamed.labels)) == ("fw2", {"a": "3"})
    assert api.get_firewall(made.id) == renamed and api.firewall_named("fw") is None


def test_a_firewall_knows_the_servers_it_reaches_directly_or_by_label_selector() -> None:
    body = {
        "id": 7, "name": "fw", "labels": {}, "created": "2024-01-01T00:00:00+00:00",
        "rules": [{"direction": "in", "protocol": "tcp", "port": "22",
                   "source_ips": ["0.0.0.0/0"], "destination_ips": [], "description": None}],
        "applied_to": [
            {"type": "server", "server": {"id": 1}},
            {"type": "label_selector", "label_selector": {"selector": "pool=render"},
             "applied_to_resources": [{"type": "server", "server": {"id": 2}},
                                      {"type": "server", "server": {"id": 1}}]},
        ],
    }  # fmt: skip
    firewall = Firewall.from_json(body)
    assert firewall.servers == (1, 2)
    assert firewall.rules == (FirewallRule("in", "tcp", "22", ("0.0.0.0/0",), ()),)
