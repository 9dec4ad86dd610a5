"""``sp00ky-infra image bake POOL`` against the fake API: the pool's image settled as the
controller settles it, the recipe's snapshot reused when it exists (no server made), the older
ones no server runs deleted, the result on stdout (``--json``) and the steps on stderr."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sp00ky_infra.cli.main import cli
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.rehearse import cloud as cloud_module
from sp00ky_infra.rehearse.catalog import pricing_json
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared.cloud_init import agent_sha256
from sp00ky_infra.shared.recipe import Recipe
from sp00ky_infra.store import open_store, store_url
from sp00ky_infra.store.snapshots import SnapshotTable
from tests.controllers import backend_app, project

IMAGE = "registry.example/render@sha256:" + "b" * 64


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


def _config(tmp_path: Path, image: str = IMAGE) -> Path:
    app = backend_app("render", "render_job", tmp_path / "unused.jsonl")
    app["deploy"] = {"image": image, "port": 8080, "healthcheck": "/health"}
    return project(tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"be": app})


def _bake(fake: FakeHetzner, config: Path, *args: str) -> tuple[int, str, str]:
    env = {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url, "SPKY_CONFIG": str(config)}
    done = CliRunner().invoke(
        cli, ["image", "bake", "render", "--project", "shop", "--serve-on", "127.0.0.1", *args],
        env=env,
    )  # fmt: skip
    return done.exit_code, done.stdout, done.stderr


def _snapshot(fake: FakeHetzner, recipe: Recipe) -> int:
    """A snapshot of the pool as a bake leaves it."""
    server = fake.add_server("sp00ky-bake-render", {})
    image, _ = HetznerAPI(TOKEN, fake.url).create_image(
        server["id"], "render", recipe.labels("shop", "render")
    )
    del fake.servers[server["id"]]
    return image.id


def test_the_recipe_s_snapshot_is_reused_and_older_ones_deleted(
    tmp_path: Path, fake: FakeHetzner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a price of a GB of snapshot a month, as GET /pricing answers it (the catalog has none)
    priced = {
        **pricing_json(),
        "image": {"price_per_gb_month": {"net": "0.0200", "gross": "0.0238"}},
    }
    monkeypatch.setattr(cloud_module, "pricing_json", lambda: priced)
    recipe = Recipe("debian-12", agent_sha256(), IMAGE)
    older = _snapshot(fake, Recipe("debian-12", "c" * 64, IMAGE))
    current = _snapshot(fake, recipe)
    running = _snapshot(fake, Recipe("debian-12", agent_sha256(), IMAGE.replace("b", "d")))
    machine = fake.add_server("render-vm1", {"sp00ky/pool": "render"})
    machine["image"] = dict(fake.snapshots[running])  # a machine still runs that one
    code, out, err = _bake(fake, _config(tmp_path), "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "snapshot": current, "recipe": recipe.hash, "reused": True,
        "image_size": 0.42, "deleted": [older], "monthly_euros": 0.0084,
    }  # fmt: skip
    assert f"snapshot {current}: 0.42 GB at EUR 0.02 a GB and month: EUR 0.01 a month" in err
    assert f"snapshot {current} holds recipe {recipe.hash}: reused" in err
    assert f"snapshot {running} (recipe" in err and "kept" in err
    assert ("POST", "/v1/servers") not in fake.requests
    assert sorted(fake.snapshots) == sorted([current, running])


def test_a_bake_server_that_never_powers_off_fails_the_bake_and_is_deleted(
    tmp_path: Path, fake: FakeHetzner
) -> None:
    code, out, err = _bake(fake, _config(tmp_path), "--timeout", "0")
    assert code == 1 and out == ""
    assert "did not power off within 0s" in err and "cloud-init's output log" in err
    assert "creating bake server sp00ky-bake-shop-render-" in err and "deleting bake server" in err
    assert fake.servers == {} and fake.snapshots == {}


def test_a_pool_that_is_not_there_is_refused(tmp_path: Path, fake: FakeHetzner) -> None:
    env = {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url}
    missing = CliRunner().invoke(
        cli, ["image", "bake", "encode", "--config", str(_config(tmp_path))], env=env
    )
    assert missing.exit_code == 1 and "no pool 'encode' in sp00ky.yml (render)" in missing.stderr


def test_after_a_bake_the_projects_snapshots_are_listed_into_its_store(
    tmp_path: Path, fake: FakeHetzner
) -> None:
    recipe = Recipe("debian-12", agent_sha256(), IMAGE)
    current = _snapshot(fake, recipe)
    config = _config(tmp_path)
    code, _, err = _bake(fake, config, "--json")
    assert code == 0, err
    assert "project shop: 1 snapshot(s) listed into the store" in err
    store = open_store(store_url(None, config))
    try:
        kept = SnapshotTable(store).read()
    finally:
        store.close()
    assert kept is not None and [(s.id, s.pool, s.gigabytes) for s in kept.snapshots] == [
        (current, "render", 0.42)
    ]


def test_a_bake_without_an_address_to_serve_the_agent_from_is_refused(
    tmp_path: Path, fake: FakeHetzner
) -> None:
    env = {
        "HCLOUD_TOKEN": TOKEN,
        "HCLOUD_ENDPOINT": fake.url,
        "SPKY_CONFIG": str(_config(tmp_path)),
    }
    done = CliRunner().invoke(cli, ["image", "bake", "render", "--project", "shop"], env=env)
    assert done.exit_code == 1 and done.stdout == ""
    assert done.stderr == (
        "error: the bake server of pool render fetches the agent from this host: pass "
        "--serve-on HOST, an address of this host the bake server reaches\n"
    )
    assert ("POST", "/v1/servers") not in fake.requests
