"""What a pool's snapshots cost, on a controller (controller/pricing.py, controller/costs.py,
controller/metrics.py, cli/pools.py): in process on a virtual clock over a real store, against
the project's fake Hetzner API on 127.0.0.1. The leader's pricing pass lists the project's
snapshots with GET /pricing's price of a GB a month and keeps them; `pools get` and /metrics
show each pool's; a failed listing keeps the last one; never listed is unknown, never 0."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.controller.admin import cost_view
from sp00ky_infra.controller.metrics import exposition
from sp00ky_infra.controller.pricing import refresh_snapshots
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.policy.cost import snapshot_euros
from sp00ky_infra.rehearse import cloud as cloud_module
from sp00ky_infra.rehearse.catalog import error_body, pricing_json
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.store import open_store
from sp00ky_infra.store.snapshots import SnapshotTable
from tests.controller.test_pricing import (
    DAY,
    HOUR,
    T0,
    controller_at,
    cost_once,
    running_project,
    samples,
    tick_and_read,
)
from tests.controller.test_schedules_controller import Clock
from tests.helpers import cli

PER_GB = 0.02  # the fake's price of a GB of snapshot a month (the catalog has none)
IMAGES = ("GET", "/v1/images")


class Fake(FakeHetzner):
    """The fake API, whose GET /images can be made to fail alone."""

    images_down = False

    def answer(
        self, method: str, path: str, query: dict[str, str], raw: bytes, auth: str
    ) -> tuple[int, Any, dict[str, str]]:
        if self.images_down and method == "GET" and path.startswith("/images"):
            return 503, error_body("unavailable", "images are down"), {}
        return super().answer(method, path, query, raw, auth)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    """The fake API with a price of a GB of snapshot, and the controller pointed at it."""
    priced = {
        **pricing_json(),
        "image": {"price_per_gb_month": {"net": "0.0200", "gross": "0.0238"}},
    }
    monkeypatch.setattr(cloud_module, "pricing_json", lambda: priced)
    api = Fake()
    with api:
        monkeypatch.setenv("HCLOUD_TOKEN", TOKEN)
        monkeypatch.setenv("HCLOUD_ENDPOINT", api.url)
        yield api


def snapshot(fake: FakeHetzner, project: str, pool: str | None, size: float, made: float) -> int:
    labels = {"sp00ky/project": project, "sp00ky/role": "snapshot"}
    image = fake.add_snapshot(
        {**labels, **({"sp00ky/pool": pool} if pool else {})}, datetime.fromtimestamp(made, UTC)
    )
    image["image_size"] = size
    return int(image["id"])


def two_pools(fake: FakeHetzner, made: float = T0 - DAY) -> None:
    """render's two snapshots and north's one, and snapshots that are no pool's of this
    project (another project's, one without a pool label)."""
    snapshot(fake, "dev", "render", 1.5, made)
    snapshot(fake, "dev", "render", 2.5, made)
    snapshot(fake, "dev", "north", 0.75, made)
    snapshot(fake, "shop", "render", 9.0, made)
    snapshot(fake, "dev", None, 9.0, made)


def test_the_leaders_pass_keeps_each_pools_snapshots_and_shows_them(
    tmp_path: Path, store_url: str, fake: Fake
) -> None:
    two_pools(fake)
    with controller_at(tmp_path, store_url, Clock(T0)) as controller:
        tick_and_read(controller)
        assert fake.requests.count(IMAGES) == 1
        render = cost_view(controller, "render", T0 + HOUR)
        legacy = cost_view(controller, "legacy", T0 + HOUR)
        metrics = exposition(controller).decode()
    so_far = 2 * snapshot_euros(2.0, PER_GB, DAY + HOUR)  # 1.5 and 2.5 GB, a day and an hour
    assert render["snapshots"] == {
        "count": 2, "gigabytes": 4.0, "monthly_euros": 0.08, "euros": round(so_far, 4),
        "per_gb_month": PER_GB, "read_on": "2026-12-05", "read_at": T0,
    }  # fmt: skip
    assert render["machine_euros"] == render["euros"] == 0.0  # no machine yet
    assert render["total_euros"] == round(so_far, 4)
    assert legacy["snapshots"]["count"] == 0  # listed: it has none
    assert legacy["total_euros"] is None  # its machines' euros are unknown
    assert samples(metrics, "sp00ky_pool_snapshot_gigabytes") == {
        "render": ({}, 4.0), "north": ({}, 0.75), "legacy": ({}, 0.0), "given": ({}, 0.0),
    }  # fmt: skip
    monthly = samples(metrics, "sp00ky_pool_snapshot_monthly_euros")
    assert monthly["render"][1] == pytest.approx(0.08)
    assert monthly["north"][1] == pytest.approx(0.015)


def test_never_listed_snapshots_are_unknown_with_no_sample(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HCLOUD_TOKEN", raising=False)
    with controller_at(tmp_path, store_url, Clock(T0)) as controller:
        tick_and_read(controller)
        render = cost_view(controller, "render", T0)
        metrics = exposition(controller).decode()
    assert (render["snapshots"], render["total_euros"]) == (None, None)
    assert render["machine_euros"] == render["euros"] == 0.0
    assert samples(metrics, "sp00ky_pool_snapshot_gigabytes") == {}
    assert samples(metrics, "sp00ky_pool_snapshot_monthly_euros") == {}


def test_a_failed_listing_keeps_the_last_one_and_is_tried_an_hour_later(
    tmp_path: Path, store_url: str, fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sp00ky.controller")
    two_pools(fake)
    clock = Clock(T0)
    with controller_at(tmp_path, store_url, clock) as controller:
        tick_and_read(controller)
        snapshot(fake, "dev", "render", 5.0, T0 + HOUR)  # made since
        fake.images_down = True
        clock.now = T0 + DAY
        tick_and_read(controller)
        assert fake.requests.count(IMAGES) == 2  # tried once, and refused
        kept = cost_view(controller, "render", clock.now)["snapshots"]
        fake.fail_next.append((503, "unavailable", None))  # GET /pricing refused: no listing
        clock.now = T0 + DAY + HOUR
        tick_and_read(controller)
        assert fake.requests.count(IMAGES) == 2
        fake.images_down = False
        clock.now = T0 + DAY + 2 * HOUR
        tick_and_read(controller)
        assert fake.requests.count(IMAGES) == 3
        again = cost_view(controller, "render", clock.now)["snapshots"]
    assert (kept["count"], kept["gigabytes"], kept["read_on"]) == (2, 4.0, "2026-12-05")
    assert "listing project dev's snapshots (GET /images) failed; the last reading stays" in (
        caplog.text
    )
    assert "images are down" in caplog.text
    assert (again["count"], again["gigabytes"], again["read_on"]) == (3, 9.0, "2026-12-06")


def test_a_refresh_after_a_bake_lists_the_snapshots_at_once(
    tmp_path: Path, store_url: str, fake: Fake
) -> None:
    two_pools(fake)
    store = open_store(store_url)
    try:
        api = HetznerAPI(TOKEN, fake.url, clock=lambda: T0)
        reading = refresh_snapshots(store, api, "shop", T0)
        kept = SnapshotTable(store).read()
    finally:
        store.close()
    assert kept == reading and reading.read_on == "2026-12-05"
    assert [(s.pool, s.gigabytes) for s in reading.snapshots] == [("render", 9.0)]
    assert reading.per_gb_month == PER_GB


def test_pools_get_shows_a_pools_snapshots_and_the_total_and_none_for_a_pool_without(
    tmp_path: Path, fake: Fake
) -> None:
    made = datetime.now(UTC).timestamp() - DAY
    two_pools(fake, made)
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    with running_project(tmp_path) as (controller, env):
        cost = cost_once(
            env, "render", lambda shown: bool(shown["snapshots"]), "the pool's snapshots listed"
        )
        text = cli("pools", "get", "render", env=env).stdout
        legacy = cli("pools", "get", "legacy", env=env).stdout
        metrics = controller.admin("GET", "/metrics").text
    snapshots = cost["snapshots"]
    assert (snapshots["count"], snapshots["gigabytes"]) == (2, 4.0)
    assert (snapshots["monthly_euros"], snapshots["read_on"]) == (0.08, today)
    assert cost["total_euros"] == round(cost["machine_euros"] + snapshots["euros"], 4)
    line = (
        f"  snapshots: 2, 4.00 GB, 0.0800 EUR a month (read {today}); "
        f"{snapshots['euros']:.4f} EUR so far, machines and snapshots together "
        f"{cost['total_euros']:.4f} EUR\n"
    )
    assert line in text and f"cost: {cost['euros']:.4f} EUR over" in text
    assert "snapshots" not in legacy  # none: nothing shown
    assert samples(metrics, "sp00ky_pool_snapshot_gigabytes")["render"] == ({}, 4.0)
