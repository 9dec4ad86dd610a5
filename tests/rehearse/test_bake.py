"""The bake against the fake API in boot mode: a bake server really installs Docker and the
agent and loads the backend's image into its own engine, the snapshot holds them, a machine
booted from it finds the image present and fetches nothing; the same recipe bakes nothing
new, a changed one bakes anew and the old snapshot goes once no server runs it."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.controller.bake import Baked, BakeRequest, ImageFeed, bake
from sp00ky_infra.controller.images import ImageServer, PoolImage
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from tests.controllers import backend_app, project, running_controller, wait_for
from tests.engines import backend_context
from tests.rehearse.machines import ready_machine


@pytest.fixture
def cloud(rehearsal_image: str) -> Iterator[FakeHetzner]:
    with FakeHetzner(boot=Booter(rehearsal_image)) as fake:
        yield fake


def _bake(cloud: FakeHetzner, images: ImageServer, image_id: str, lines: list[str]) -> Baked:
    assert cloud.boot is not None
    api = HetznerAPI(TOKEN, cloud.url, wait=lambda *_: 0.2)
    with ImageFeed(cloud.boot.gateway, images, image_id) as feed:
        request = BakeRequest(
            "test", "render", PoolImage("controller", image_id), server_type="cx23",
            location="fsn1",
        )  # fmt: skip
        try:
            return bake(api, feed.for_request(request), lines.append, timeout=600, every=1.0,
                        reported=lambda: feed.failed)  # fmt: skip
        except Exception:
            print("\n".join(lines))
            raise


def _servers_made(cloud: FakeHetzner) -> int:
    return sum(1 for method, path in cloud.requests if (method, path) == ("POST", "/v1/servers"))


def test_a_baked_snapshot_boots_a_machine_that_fetches_no_image(
    tmp_path: Path, cloud: FakeHetzner, docker_images: str
) -> None:
    assert cloud.boot is not None
    backend = f"bake{int(time.time() * 1000) % 10**8}"
    backend_context(tmp_path / "backend")
    engine = docker.from_env()
    images = ImageServer(engine, "dev")  # the project the controller builds for
    dockerfile = str(tmp_path / "backend" / "Dockerfile")
    image_id = images.build(backend, dockerfile, str(tmp_path / "backend"))
    lines: list[str] = []
    first = _bake(cloud, images, image_id, lines)
    assert not first.reused and first.deleted == () and (first.image_size or 0) > 0.1
    assert any("powered off" in line for line in lines)
    made = _servers_made(cloud)
    again = _bake(cloud, images, image_id, lines)
    assert (again.snapshot, again.reused, _servers_made(cloud)) == (first.snapshot, True, made)
    assert cloud.servers == {}  # the bake server is gone

    app = backend_app("render", "render_job", tmp_path / "unused.jsonl")
    app["deploy"].pop("command")
    app["deploy"]["dockerfile"] = dockerfile
    config = project(tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {backend: app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    machine = "render-vm1"
    api = HetznerAPI(TOKEN, cloud.url, wait=lambda *_: 0.2)
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_IMAGES="1", SPKY_POOL_MAX_MACHINES="1",
        SPKY_POOL_TIMINGS="lease=10s,idleTimeout=120s,bootTimeout=240s",
        SPKY_POOL_HOST=cloud.boot.gateway,
    ) as controller:  # fmt: skip
        server = ready_machine(
            cloud, client, controller, config, image_id, machine, image=str(first.snapshot)
        )
        _, journal = cloud.boot.exec(
            server.id, "journalctl", "-u", "sp00ky-agent.service", "--no-pager"
        )
        assert "event=image_cached" in journal and "event=image_fetch" not in journal
        assert api.get_server(server.id).image == first.snapshot

        # a changed recipe: another image bakes a new snapshot; the old one stays while the
        # machine booted from it runs, and goes at the first bake after it is gone
        changed = engine.images.build(
            fileobj=io.BytesIO(f"FROM {image_id}\nLABEL changed=1\n".encode()), rm=True
        )[0]
        images.serve(str(changed.id))
        lines.clear()
        second = _bake(cloud, images, str(changed.id), lines)
        assert not second.reused and second.snapshot != first.snapshot and second.deleted == ()
        assert any(f"snapshot {first.snapshot}" in line and "kept" in line for line in lines)
        assert api.delete_server(server.id)
        wait_for(lambda: cloud.boot is not None and cloud.boot.running(server.id) is None)
    client.close()
    third = _bake(cloud, images, str(changed.id), lines)
    assert (third.snapshot, third.reused, third.deleted) == (
        second.snapshot,
        True,
        (first.snapshot,),
    )
    left = HetznerAPI(TOKEN, cloud.url).images(type="snapshot")
    assert [i.id for i in left] == [second.snapshot]
    engine.images.remove(str(changed.id), force=True)
