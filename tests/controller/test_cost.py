"""A pool's cost on a running controller is Hetzner's billing rule (policy/cost.py) applied
to its machines' recorded lifetimes, at the price sp00ky.yml gives: in `pools get`, in
/metrics, and split into idle euros by the machines' recorded busy time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.policy.cost import Price, idle_euros, machine_euros
from tests.controllers import ADMIN_TOKEN, backend_app, project, running_controller, wait_for
from tests.helpers import cli

PRICE = Price(0.25, 4.0)  # EUR per started hour, monthly cap: sp00ky.yml's override


def test_pool_cost_is_the_billing_rule_over_recorded_lifetimes(tmp_path: Path) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(
        tmp_path,
        {"render": {"min": 0, "autoscale": True, "max": 2, "machine": {"type": "cx33"}}},
        {"renderer": app},
    )
    document = yaml.safe_load(config.read_text())
    document["prices"] = {"cx33": {"hourly": PRICE.hourly, "monthly": PRICE.monthly}}
    config.write_text(yaml.safe_dump(document))
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    try:
        with running_controller(tmp_path / "controller", config, store_url) as controller:
            jobs = [
                client.run("renderer", "/render", {"gameId": str(n), "seconds": 1})
                for n in range(3)
            ]
            wait_for(
                lambda: (
                    all(client.store.get(job.id).status == "success" for job in jobs)
                    and not client.store.machines.live("render")
                ),
                timeout=60,
                what="the jobs done and the pool back to zero",
            )
            env = {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}
            shown = json.loads(cli("pools", "get", "render", "--json", env=env).stdout)["cost"]
            text = cli("pools", "get", "render", env=env).stdout
            metrics = controller.admin("GET", "/metrics").text
        lives = client.store.machines.lifetimes("render")
    finally:
        client.close()
    assert lives and all(life.destroyed_at is not None for life in lives)
    bills = [machine_euros(PRICE, life.destroyed_at - life.created_at) for life in lives]  # type: ignore[operator]
    # Each machine lived seconds, so each is billed one started hour, never more.
    assert bills == [PRICE.hourly] * len(lives)
    assert shown["machines"] == len(lives) and shown["euros"] == round(sum(bills), 4)
    assert shown["jobs"] == 3 and shown["euros_per_job"] == round(sum(bills) / 3, 6)
    idle = sum(
        idle_euros(bill, life.seconds(0), life.seconds(0) - life.busy(0))
        for bill, life in zip(bills, lives, strict=True)
    )
    busy = sum(life.busy(0) for life in lives)
    assert busy >= 3.0  # three jobs of a second each ran on them
    assert 0 < shown["idle_euros"] == round(idle, 4) < shown["euros"]
    assert shown["price"] == {"hourly": 0.25, "monthly": 4.0, "source": "sp00ky.yml", "date": None}
    assert f"cost: {sum(bills):.4f} EUR over" in text and "per job (3)" in text
    found = re.search(r'^sp00ky_pool_cost_euros_total\{pool="render"\} (\S+)$', metrics, re.M)
    assert found is not None and float(found.group(1)) == pytest.approx(sum(bills))
    assert re.search(
        r'^sp00ky_pool_price_known\{pool="render",server_type="cx33"\} 1\.0$', metrics, re.M
    )


def test_a_pool_of_a_type_with_no_known_price_shows_its_cost_unknown_never_zero(
    tmp_path: Path,
) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    # cx22: in the catalog (deprecated), with no known price, and none given in sp00ky.yml
    config = project(
        tmp_path,
        {"render": {"min": 0, "autoscale": True, "max": 1, "machine": {"type": "cx22"}}},
        {"renderer": app},
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    try:
        with running_controller(tmp_path / "controller", config, store_url) as controller:
            job = client.run("renderer", "/render", {"gameId": "1", "seconds": 1})
            wait_for(
                lambda: client.store.get(job.id).status == "success",
                timeout=60,
                what="the job done",
            )
            env = {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}
            shown = json.loads(cli("pools", "get", "render", "--json", env=env).stdout)["cost"]
            text = cli("pools", "get", "render", env=env).stdout
            listed = cli("pools", "list", env=env).stdout
            metrics = controller.admin("GET", "/metrics").text
    finally:
        client.close()
    assert shown["machines"] >= 1 and shown["machine_hours"] > 0 and shown["jobs"] == 1
    assert (shown["euros"], shown["idle_euros"], shown["euros_per_job"]) == (None, None, None)
    assert (
        shown["price"] is None
        and "give one under `prices:` in sp00ky.yml" in (shown["price_unknown"])
    )
    assert "cost: unknown over" in text and "no price is known for server type 'cx22'" in text
    assert " EUR" not in text.split("cost:")[1].splitlines()[0]
    assert "unknown" in listed and "0.0000" not in listed
    assert not re.search(r'^sp00ky_pool_cost_euros_total\{pool="render"\}', metrics, re.M)
    assert not re.search(r'^sp00ky_pool_idle_euros_total\{pool="render"\}', metrics, re.M)
    assert re.search(
        r'^sp00ky_pool_price_known\{pool="render",server_type="cx22"\} 0\.0$', metrics, re.M
    )
    assert re.search(r'^sp00ky_pool_machine_seconds_total\{pool="render"\} [1-9]', metrics, re.M)
