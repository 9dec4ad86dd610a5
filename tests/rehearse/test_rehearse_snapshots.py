"""Snapshots in boot mode: create_image commits a server's container and its own Docker
engine's disk; a server created from the snapshot's id boots that disk (its files and its
engine's images there), as a new instance; DELETE /images/{id} removes both copies."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest
import yaml
from docker.errors import ImageNotFound, NotFound

from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.rehearse.boot import CLOUD, Booter
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from tests.controllers import wait_for


@pytest.fixture
def cloud(rehearsal_image: str) -> Iterator[FakeHetzner]:
    """A fake cloud in boot mode; leaving it removes every snapshot it still holds."""
    with FakeHetzner(boot=Booter(rehearsal_image)) as fake:
        yield fake
    mine = {"label": f"{CLOUD}={fake.boot.cloud if fake.boot else ''}"}
    engine = docker.from_env()
    assert engine.images.list(filters=mine) == [] and engine.volumes.list(filters=mine) == []


def _user_data(path: str) -> str:
    config = {"write_files": [{"path": path, "content": "written\n"}]}
    return "#cloud-config\n" + yaml.safe_dump(config)


def _booted(cloud: FakeHetzner, api: HetznerAPI, server_id: int) -> None:
    boot = cloud.boot
    assert boot is not None
    wait_for(lambda: api.get_server(server_id).status == "running", timeout=120, interval=0.5)
    wait_for(
        lambda: boot.timeline(server_id).cloud_init_done is not None,
        timeout=180, interval=0.5, what="cloud-init done",
    )  # fmt: skip


def test_a_server_made_from_a_snapshot_boots_its_disk_and_engine(cloud: FakeHetzner) -> None:
    boot, api = cloud.boot, HetznerAPI(TOKEN, cloud.url, wait=lambda *_: 0.2)
    assert boot is not None
    first = api.create_server(
        name="bake-a", server_type="cx22", image="debian-12", location="fsn1",
        user_data=_user_data("/etc/baked"),
    )  # fmt: skip
    _booted(cloud, api, first.id)
    # an image in the server's own engine, as the bake's pull leaves one
    made = "tar -cf - -C /etc os-release | docker import - bake/probe:1"
    assert boot.exec(first.id, "sh", "-c", made)[0] == 0
    boot.exec(first.id, "systemctl", "poweroff")
    wait_for(lambda: api.get_server(first.id).status == "off", timeout=60, interval=0.5)

    image, action = api.create_image(first.id, "render snapshot", {"sp00ky/recipe": "abc"})
    assert image.status == "creating" and image.image_size is None
    api.wait_action(action, timeout=300, every=0.5)
    (taken,) = api.images(label_selector="sp00ky/recipe=abc", type="snapshot")
    assert taken.status == "available" and (taken.image_size or 0) > 0.1  # GB, the disk's data
    api.delete_server(first.id)

    second = api.create_server(
        name="bake-b", server_type="cx22", image=str(taken.id), location="fsn1",
        user_data=_user_data("/etc/second"),
    )  # fmt: skip
    _booted(cloud, api, second.id)
    assert boot.exec(second.id, "cat", "/etc/baked") == (0, "written\n")  # the snapshot's disk
    assert boot.exec(second.id, "cat", "/etc/second") == (0, "written\n")  # its own user-data
    code, listed = boot.exec(second.id, "docker", "image", "ls", "-q", "bake/probe:1")
    assert code == 0 and listed.strip() != ""  # its engine has the image: nothing to fetch
    assert boot.exec(second.id, "cloud-init", "query", "v1.instance_id")[1].strip() == str(
        second.id
    )

    assert api.delete_image(taken.id)
    engine = docker.from_env()
    with pytest.raises(ImageNotFound):
        engine.images.get(boot.snapshot_tag(taken.id))
    with pytest.raises(NotFound):
        engine.volumes.get(boot.snapshot_volume(taken.id))
    assert boot.running(second.id)  # a server made from it keeps its own disk
    kept, action = api.create_image(second.id, "left for the cloud to remove", {})
    api.wait_action(action, timeout=300, every=0.5)
    assert engine.images.get(boot.snapshot_tag(kept.id))
    api.delete_server(second.id)
    wait_for(lambda: boot.running(second.id) is None, what="the container removed")
