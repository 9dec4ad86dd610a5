"""The fake Hetzner API's server types and prices, over real HTTP on 127.0.0.1: every type of
the catalog is listed with its per-location prices, GET /pricing answers in the real API's
shape, a server of any catalog type is made where that type is sold, and the client reads
both endpoints back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.policy.server_types import SERVER_TYPES
from sp00ky_infra.rehearse.cloud import LOCATIONS, TOKEN, FakeHetzner

AUTH = {"Authorization": f"Bearer {TOKEN}"}
AMOUNT = {"net", "gross"}
READ_AT = 1_796_500_000.0  # 2026-12-05, UTC


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


def _get(fake: FakeHetzner, path: str, **params: Any) -> dict[str, Any]:
    answer = requests.get(f"{fake.url}{path}", headers=AUTH, params=params, timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _create(fake: FakeHetzner, name: str, server_type: str, location: str) -> requests.Response:
    body = {"name": name, "server_type": server_type, "image": "debian-12", "location": location}
    return requests.post(f"{fake.url}/servers", headers=AUTH, json=body, timeout=10)


def test_server_types_lists_every_catalog_type_with_its_prices_per_location(
    fake: FakeHetzner,
) -> None:
    listed = _get(fake, "/server_types", per_page=50)["server_types"]
    assert [t["name"] for t in listed] == list(SERVER_TYPES)
    cx23 = next(t for t in listed if t["name"] == "cx23")
    assert (cx23["cores"], cx23["memory"], cx23["disk"]) == (2, 4.0, 40)
    assert (cx23["architecture"], cx23["cpu_type"], cx23["deprecated"]) == ("x86", "shared", False)
    assert [p["location"] for p in cx23["prices"]] == ["fsn1", "nbg1", "hel1"]
    assert [loc["name"] for loc in cx23["locations"]] == ["fsn1", "nbg1", "hel1"]
    fsn1 = cx23["prices"][0]
    assert (
        float(fsn1["price_monthly"]["net"]) == 3.99 and float(fsn1["price_hourly"]["net"]) == 0.0064
    )
    assert set(fsn1["price_monthly"]) == AMOUNT
    assert float(fsn1["price_monthly"]["gross"]) == pytest.approx(3.99 * 1.19)
    cx22 = _get(fake, "/server_types", name="cx22")["server_types"]
    assert [(t["name"], t["deprecated"], t["prices"]) for t in cx22] == [("cx22", True, [])]
    assert cx22[0]["deprecation"]["unavailable_after"].startswith("2025-12-31")


def test_pricing_answers_in_the_real_shape(fake: FakeHetzner) -> None:
    pricing = _get(fake, "/pricing")["pricing"]
    assert pricing["currency"] == "EUR" and float(pricing["vat_rate"]) == 19.0
    by_name = {t["name"]: t for t in pricing["server_types"]}
    assert set(by_name) == set(SERVER_TYPES)
    ccx33 = {p["location"]: p for p in by_name["ccx33"]["prices"]}
    assert set(ccx33) == {"fsn1", "nbg1", "hel1", "ash", "hil", "sin"}
    assert float(ccx33["ash"]["price_monthly"]["net"]) == 50.49
    assert set(ccx33["ash"]) == {
        "location", "price_hourly", "price_monthly", "included_traffic", "price_per_tb_traffic"
    }  # fmt: skip
    (ipv4,) = pricing["primary_ips"]
    assert ipv4["type"] == "ipv4"
    assert {float(p["price_monthly"]["net"]) for p in ipv4["prices"]} == {0.5}


def test_a_server_of_any_catalog_type_is_made_where_that_type_is_sold(fake: FakeHetzner) -> None:
    made = _create(fake, "a", "cx23", "fsn1")
    assert made.status_code == 201, made.text
    assert made.json()["server"]["server_type"]["name"] == "cx23"
    assert _create(fake, "b", "ccx13", "sin").status_code == 201
    elsewhere = _create(fake, "c", "cx23", "ash")
    assert elsewhere.status_code == 422
    assert elsewhere.json()["error"] == {
        "code": "invalid_input", "message": "unsupported location for server type", "details": {}
    }  # fmt: skip
    unknown = _create(fake, "d", "cx99", "fsn1")
    assert unknown.status_code == 422
    assert unknown.json()["error"]["message"] == "server type cx99 not found"


def test_offered_still_narrows_where_a_type_is_sold(fake: FakeHetzner) -> None:
    fake.offered["cx33"] = {"nbg1"}
    assert _create(fake, "a", "cx33", "fsn1").status_code == 422
    assert _create(fake, "b", "cx33", "nbg1").status_code == 201


def test_the_client_reads_pricing_and_server_types_dated_the_day_it_read_them(
    fake: FakeHetzner,
) -> None:
    api = HetznerAPI(TOKEN, fake.url, clock=lambda: READ_AT, sleep=lambda _: None)
    pricing = api.pricing()
    assert (pricing.currency, pricing.vat_rate, pricing.date) == ("EUR", 19.0, "2026-12-05")
    cx23 = {p.location: p for p in pricing.server_types["cx23"]}
    assert (cx23["fsn1"].hourly, cx23["fsn1"].monthly) == (0.0064, 3.99)
    assert cx23["fsn1"].date == "2026-12-05" and "GET /pricing" in cx23["fsn1"].source
    assert {p.location for p in pricing.primary_ipv4} == set(LOCATIONS)
    assert {p.monthly for p in pricing.primary_ipv4} == {0.5}
    read = {t.name: t for t in api.server_types()}
    assert set(read) == set(SERVER_TYPES)  # more than one page of 25
    for name, kind in SERVER_TYPES.items():
        got = read[name]
        assert (got.cores, got.memory, got.disk, got.architecture, got.cpu_type) == (
            kind.cores, kind.memory, kind.disk, kind.architecture, kind.cpu_type
        ), name  # fmt: skip
        assert (got.locations, got.deprecated) == (kind.locations, kind.deprecated), name
        assert [(p.location, p.hourly, p.monthly) for p in got.prices] == [
            (p.location, p.hourly, p.monthly) for p in kind.prices
        ], name
