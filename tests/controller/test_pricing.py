"""Hetzner's prices on a controller (controller/pricing.py, controller/costs.py): in process on
a virtual clock over a real store, against the project's fake Hetzner API on 127.0.0.1. The
leader reads GET /pricing at its first tick and then daily by its own clock, keeps the reading
in the store, and prices its pools with it (sp00ky.yml's prices first, the dated table last);
a controller restarted without the API uses the kept prices; a failed reading keeps them."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.admin import cost_view
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.costs import PoolPrice, priced
from sp00ky_infra.controller.metrics import exposition
from sp00ky_infra.controller.pricing import price_refresh
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.cost import Price
from sp00ky_infra.policy.server_types import PRIMARY_IPV4_MONTHLY, SERVER_TYPES, LocationPrice
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.store import open_store
from sp00ky_infra.store.prices import PriceReading
from tests.controller.test_controller_executor import Recording
from tests.controller.test_schedules_controller import Clock
from tests.controllers import (
    ADMIN_TOKEN,
    ControllerProcess,
    backend_app,
    running_controller,
    wait_for,
)
from tests.helpers import cli

T0 = 1_796_500_000.0  # 2026-12-05T19:46:40Z
HOUR, DAY = 3600.0, 86_400.0
API = "Hetzner Pricing API (GET /pricing)"
POOLS: dict[str, dict[str, Any]] = {
    "render": {"machine": {"type": "cx33"}},
    "north": {"machine": {"type": "cx23", "locations": ["hel1"]}},
    "legacy": {"machine": {"type": "cx22"}},  # priced nowhere
    "given": {"machine": {"type": "ccx13"}},  # priced in sp00ky.yml
}
SIZE: dict[str, Any] = {"min": 0, "autoscale": True, "max": 1}
GIVEN = {"ccx13": {"hourly": 0.5, "monthly": 9.0}}
PRICING = ("GET", "/v1/pricing")


def write_project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    apps = {
        f"{pool}-app": backend_app(pool, f"{pool}_job", folder / f"{pool}.jsonl") for pool in POOLS
    }
    path = folder / "sp00ky.yml"
    pools = {name: {**SIZE, **pool} for name, pool in POOLS.items()}
    document = {"mode": "cluster", "pools": pools, "apps": apps, "prices": GIVEN}
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHetzner]:
    """The fake API, and the controller pointed at it the way it is in production."""
    with FakeHetzner() as api:
        monkeypatch.setenv("HCLOUD_TOKEN", TOKEN)
        monkeypatch.setenv("HCLOUD_ENDPOINT", api.url)
        yield api


@contextmanager
def controller_at(folder: Path, store_url: str, clock: Clock) -> Iterator[Controller]:
    config = load_config(write_project(folder))
    store = open_store(store_url)
    settings = ControllerSettings(secret="s", state_dir=str(folder))
    controller = Controller(settings, config, store, Recording(True), clock=clock)
    try:
        yield controller
    finally:
        price_refresh(controller).wait(30)
        controller.leader_lock.release()
        store.close()


def tick_and_read(controller: Controller) -> None:
    """One tick as the leader, and the price reading it started (if any) ended."""
    assert tick(controller).leader
    price_refresh(controller).wait(30)


def price(controller: Controller, pool: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cost_view(controller, pool, controller.clock())["price"]
    return found


def samples(metrics: str, name: str) -> dict[str, tuple[dict[str, str], float]]:
    """Each pool's sample of ``name`` in the exposition: its other labels, and its value."""
    return {
        sample.labels["pool"]: (
            {k: v for k, v in sample.labels.items() if k != "pool"},
            sample.value,
        )
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == name
    }


def cost_once(
    env: dict[str, str], pool: str, ready: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """``pools get POOL --json``'s cost, once ``ready`` says it is (polled)."""

    def shown() -> dict[str, Any] | None:
        cost: dict[str, Any] = json.loads(cli("pools", "get", pool, "--json", env=env).stdout)[
            "cost"
        ]
        return cost if ready(cost) else None

    found: dict[str, Any] = wait_for(shown, what=what)
    return found


@contextmanager
def running_project(folder: Path) -> Iterator[tuple[ControllerProcess, dict[str, str]]]:
    """The project's controller running as a process of its own on a SQLite store, and the
    environment ``pools`` reaches its admin API with."""
    config = write_project(folder)
    store_url = f"sqlite:///{folder}/state.db"
    with running_controller(folder / "controller", config, store_url) as controller:
        yield controller, {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}


def table_price(server_type: str, location: str = "fsn1") -> tuple[float, float]:
    entry = SERVER_TYPES[server_type].price_at(location)
    assert entry is not None
    return entry.hourly, entry.monthly


def test_the_leader_prices_its_pools_with_the_apis_prices_and_the_primary_ipv4(
    tmp_path: Path, store_url: str, fake: FakeHetzner
) -> None:
    with controller_at(tmp_path, store_url, Clock(T0)) as controller:
        tick_and_read(controller)
        assert fake.requests.count(PRICING) == 1
        render, north = price(controller, "render"), price(controller, "north")
        legacy = cost_view(controller, "legacy", T0)
        given = price(controller, "given")
        metrics = exposition(controller).decode()
    hourly, monthly = table_price("cx33")
    ipv4 = PRIMARY_IPV4_MONTHLY.monthly  # the fake's primary IPv4: 0 an hour, 0.50 a month
    assert render == {
        "hourly": hourly, "monthly": round(monthly + ipv4, 10),
        "source": f"{API}, fsn1, 2026-12-05, with its primary IPv4", "date": "2026-12-05",
    }  # fmt: skip
    assert (
        north is not None and north["source"] == f"{API}, hel1, 2026-12-05, with its primary IPv4"
    )
    assert north["monthly"] == round(table_price("cx23", "hel1")[1] + ipv4, 10)
    assert given == {"hourly": 0.5, "monthly": 9.0, "source": "sp00ky.yml", "date": None}
    # priced nowhere: unknown, never 0
    assert (legacy["price"], legacy["euros"]) == (None, None)
    assert "no price is known for server type 'cx22'" in legacy["price_unknown"]
    prices = samples(metrics, "sp00ky_pool_price_hourly_euros")
    assert prices == {
        "render": (
            {
                "server_type": "cx33",
                "date": "2026-12-05",
                "source": f"{API}, fsn1, 2026-12-05, with its primary IPv4",
            },
            hourly,
        ),
        "north": (
            {
                "server_type": "cx23",
                "date": "2026-12-05",
                "source": f"{API}, hel1, 2026-12-05, with its primary IPv4",
            },
            table_price("cx23", "hel1")[0],
        ),
        "given": ({"server_type": "ccx13", "date": "", "source": "sp00ky.yml"}, 0.5),
    }  # fmt: skip: "legacy" has none
    known = samples(metrics, "sp00ky_pool_price_known")
    assert known["legacy"] == ({"server_type": "cx22"}, 0.0) and known["render"][1] == 1.0
    assert "legacy" not in samples(metrics, "sp00ky_pool_cost_euros_total")


def test_a_restarted_controller_without_the_api_prices_with_the_kept_reading(
    tmp_path: Path, store_url: str, fake: FakeHetzner, caplog: pytest.LogCaptureFixture
) -> None:
    with controller_at(tmp_path, store_url, Clock(T0)) as first:
        tick_and_read(first)
    fake.__exit__()  # the API is gone: nothing answers at its address any more
    caplog.set_level(logging.WARNING, logger="sp00ky.controller")
    with controller_at(tmp_path, store_url, Clock(T0 + 3 * DAY)) as again:
        tick_and_read(again)  # its own reading fails
        render = price(again, "render")
    assert render is not None
    assert render["source"] == f"{API}, fsn1, 2026-12-05, with its primary IPv4"
    assert render["date"] == "2026-12-05"
    assert "reading Hetzner's prices (GET /pricing) failed; the last prices stay" in caplog.text


def test_with_no_api_and_no_kept_reading_the_dated_table_prices(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HCLOUD_TOKEN", raising=False)
    entry = SERVER_TYPES["cx33"].price_at("fsn1")
    assert entry is not None
    with controller_at(tmp_path, store_url, Clock(T0)) as controller:
        tick_and_read(controller)
        render = price(controller, "render")
        legacy = price(controller, "legacy")
    assert render == {
        "hourly": entry.hourly, "monthly": entry.monthly,
        "source": f"{entry.source}, fsn1, {entry.date}", "date": entry.date,
    }  # fmt: skip
    assert legacy is None


def test_the_prices_are_read_again_daily_by_the_controllers_clock(
    tmp_path: Path, store_url: str, fake: FakeHetzner
) -> None:
    clock = Clock(T0)
    with controller_at(tmp_path, store_url, clock) as controller:
        tick_and_read(controller)
        clock.now = T0 + DAY - 1
        tick_and_read(controller)
        assert fake.requests.count(PRICING) == 1  # not due yet
        first = price(controller, "render")
        clock.now = T0 + DAY
        tick_and_read(controller)
        assert fake.requests.count(PRICING) == 2
        later = price(controller, "render")
    assert first is not None and first["date"] == "2026-12-05"
    assert later is not None and later["date"] == "2026-12-06"
    assert later["source"] == f"{API}, fsn1, 2026-12-06, with its primary IPv4"


def test_an_api_error_keeps_the_last_prices_logs_a_warning_and_is_tried_an_hour_later(
    tmp_path: Path, store_url: str, fake: FakeHetzner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sp00ky.controller")
    clock = Clock(T0)
    with controller_at(tmp_path, store_url, clock) as controller:
        tick_and_read(controller)
        fake.fail_next.append((503, "unavailable", None))
        clock.now = T0 + DAY
        tick_and_read(controller)
        assert fake.requests.count(PRICING) == 2  # tried once, and refused
        kept = price(controller, "render")
        clock.now = T0 + DAY + HOUR - 1
        tick_and_read(controller)
        assert fake.requests.count(PRICING) == 2
        clock.now = T0 + DAY + HOUR
        tick_and_read(controller)
        assert fake.requests.count(PRICING) == 3
        again = price(controller, "render")
    assert kept is not None and kept["date"] == "2026-12-05"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "GET /pricing" in r.getMessage() and "unavailable" in r.getMessage() for r in warnings
    )
    assert again is not None and again["date"] == "2026-12-06"


def test_pools_get_and_metrics_of_a_running_controller_say_where_each_price_came_from(
    tmp_path: Path, fake: FakeHetzner
) -> None:
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    with running_project(tmp_path) as (controller, env):
        cost = cost_once(
            env,
            "render",
            lambda shown: API in shown["price"]["source"],
            "the pool priced by the API",
        )
        text = cli("pools", "get", "render", env=env).stdout
        legacy = cli("pools", "get", "legacy", env=env).stdout
        metrics = controller.admin("GET", "/metrics").text
    source = f"{API}, fsn1, {today}, with its primary IPv4"
    assert (cost["price"]["source"], cost["price"]["date"]) == (source, today)
    assert f"cx33 at {cost['price']['hourly']:g} EUR/h" in text and f"({source})" in text
    assert "cost: unknown over" in legacy and "no price is known for server type 'cx22'" in legacy
    prices = samples(metrics, "sp00ky_pool_price_hourly_euros")
    assert prices["render"][0] == {"server_type": "cx33", "source": source, "date": today}
    assert "legacy" not in prices


def test_an_api_price_is_the_types_plus_its_primary_ipv4s_at_the_same_location(
    tmp_path: Path,
) -> None:
    config = load_config(write_project(tmp_path))
    reading = PriceReading(
        T0,
        MappingProxyType(
            {
                "cx33": (_listed("nbg1", 0.0120, 7.49), _listed("fsn1", 0.0110, 6.99)),
                "cx23": (_listed("nbg1", 0.0070, 4.49),),  # not sold in hel1, where north is
            }
        ),
        (_listed("fsn1", 0.0008, 0.50), _listed("nbg1", 0.0009, 0.60)),
    )
    render = priced(config, "render", reading)  # no location: fsn1's first, as in the table
    north = priced(config, "north", reading)
    assert isinstance(render, PoolPrice) and isinstance(north, PoolPrice)
    assert (render.price.hourly, render.price.monthly) == (0.0118, 7.49)
    assert render.price.source == f"{API}, fsn1, 2026-12-05, with its primary IPv4"
    assert (north.price.hourly, north.price.monthly) == (0.0079, 5.09)
    assert north.price.source == f"{API}, nbg1, 2026-12-05, with its primary IPv4"
    # sp00ky.yml's price wins over the API's; a type priced nowhere is unknown, never free
    assert priced(config, "given", reading) == PoolPrice(Price(0.5, 9.0, "sp00ky.yml"))
    assert isinstance(priced(config, "legacy", reading), str)


def _listed(location: str, hourly: float, monthly: float) -> LocationPrice:
    return LocationPrice(location, hourly, monthly, "2026-12-05", API)
