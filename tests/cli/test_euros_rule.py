"""One rule for euros everywhere (pools get, /metrics, simulate, dev's summary): a pool costs
what the provider sp00ky.yml declares for it charges. A hetzner pool is priced at its server
type's Hetzner price wherever its machines run (dev's local processes or Docker, simulate's
boot model of another provider); a docker pool costs 0 EUR."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.costs import PoolPrice, pool_cost, priced
from sp00ky_infra.policy.cost import price_of
from sp00ky_infra.store import open_store
from tests.controllers import backend_app
from tests.helpers import cli

SIZE: dict[str, Any] = {"min": 0, "autoscale": True, "max": 1}
POOLS: dict[str, dict[str, Any]] = {
    "render": {"provider": "hetzner", "machine": {"type": "cx33"}},
    "boxes": {"provider": "docker", "machine": {"type": "cx33"}},
    "odd": {"provider": "docker", "machine": {"type": "cx22"}},  # a type priced nowhere
}


def _project(folder: Path, prices: dict[str, Any] | None = None) -> Path:
    apps = {f"{p}-app": backend_app(p, f"{p}_job", folder / f"{p}.jsonl") for p in POOLS}
    document: dict[str, Any] = {
        "mode": "cluster",
        "pools": {name: {**SIZE, **pool} for name, pool in POOLS.items()},
        "apps": apps,
        **({"prices": prices} if prices else {}),
    }
    path = folder / "sp00ky.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_a_pool_is_priced_by_its_declared_provider(tmp_path: Path) -> None:
    config = load_config(_project(tmp_path, {"cx33": {"hourly": 0.5, "monthly": 9.0}}))
    free = price_of("cx33", provider="docker")
    assert (free.hourly, free.monthly) == (0.0, 0.0)
    assert priced(config, "boxes", None) == PoolPrice(free)  # prices: are Hetzner's, not its
    assert priced(config, "odd", None) == PoolPrice(price_of("cx22", provider="docker"))
    given = priced(config, "render", None)
    assert isinstance(given, PoolPrice) and given.price.hourly == 0.5


def test_a_hetzner_pool_run_on_local_machines_costs_its_price_and_a_docker_pool_nothing(
    tmp_path: Path,
) -> None:
    config = load_config(_project(tmp_path))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        for pool in POOLS:  # each served as dev serves it: a local process
            store.machines.add(f"{pool}-1", pool, "local", "r1", 1, 1_000.0)
        render = pool_cost(store, config, "render", "render_job", 1_600.0)
        boxes = pool_cost(store, config, "boxes", "boxes_job", 1_600.0)
        odd = pool_cost(store, config, "odd", "odd_job", 1_600.0)
    finally:
        store.close()
    hourly = price_of("cx33").hourly
    assert hourly > 0 and render["euros"] == render["price"]["hourly"]  # one started hour
    assert render["price"]["hourly"] >= hourly  # the table's, or with its primary IPv4
    assert (boxes["euros"], boxes["idle_euros"], boxes["price"]["hourly"]) == (0.0, 0.0, 0.0)
    assert odd["euros"] == 0.0 and odd["price"] is not None  # free, not unknown


def _simulated(config: Path, pool: str, provider: str) -> float:
    shown = cli(
        "simulate", "--config", str(config), "--pool", pool, "--rate", "6", "--hours", "2",
        "--duration", "fixed:5m", "--provider", provider, "--json",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    euros: float = json.loads(shown.stdout)["pools"][pool]["euros"]
    return euros


def test_simulate_bills_by_the_declared_provider_whatever_its_boot_model(tmp_path: Path) -> None:
    config = _project(tmp_path)
    assert _simulated(config, "render", "hetzner") > 0
    assert _simulated(config, "render", "docker") > 0  # docker's boots, Hetzner's bill
    assert _simulated(config, "boxes", "hetzner") == 0.0  # Hetzner's boots, nobody bills
