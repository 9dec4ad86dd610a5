"""The address a network's containers reach the host at: from the engine's IPAM config, and on a
real dockerd the one its containers are given; the network a docker provisioner made goes
when it closes, unless a container is still on it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from sp00ky_infra import engine
from sp00ky_infra.controller.provisioners.base import Refused
from sp00ky_infra.controller.provisioners.docker import Build, DockerProvisioner
from tests.conftest import BASE_IMAGE


def test_a_pool_without_its_gateway_has_its_subnets_first_address() -> None:
    # The default bridge on a daemon's first start on a machine (moby/moby#26799): seen on this
    # machine's fresh dockerd, it made the docker provisioner fail with KeyError: 'Gateway'.
    assert engine.ipv4_pool([{"Subnet": "172.17.0.0/16"}]) == ("172.17.0.0/16", "172.17.0.1")
    reported = [{"Subnet": "10.231.7.0/24", "Gateway": "10.231.7.254"}]
    assert engine.ipv4_pool(reported) == ("10.231.7.0/24", "10.231.7.254")


def test_the_first_ipv4_pool_counts_and_a_network_with_none_is_named() -> None:
    dual = [{"Subnet": "fd00:1::/64", "Gateway": "fd00:1::1"}, {"Subnet": "172.20.0.0/16"}]
    assert engine.ipv4_pool(dual) == ("172.20.0.0/16", "172.20.0.1")
    with pytest.raises(engine.EngineError, match="no IPv4 pool"):
        engine.ipv4_pool([{"Subnet": "fd00:1::/64"}])


def test_the_bridges_gateway_is_the_one_its_containers_are_given(docker_images: str) -> None:
    """Whatever the engine reports of the default bridge (with its Gateway or, on a first start,
    without), the address is the gateway a container started on it really has."""
    client = engine.connect()
    container = client.containers.run(
        BASE_IMAGE, ["sleep", "30"], detach=True, network="bridge", labels={"sp00ky/test": "gw"}
    )
    try:
        container.reload()
        given = container.attrs["NetworkSettings"]["Networks"]["bridge"]["Gateway"]
        assert given
        assert engine.network_gateway(client, "bridge") == given
    finally:
        container.remove(force=True)


def _networks(name: str) -> list[str]:
    client = engine.connect()
    try:
        return [str(network.name) for network in client.networks.list(names=[name])]
    finally:
        client.close()


@pytest.fixture
def network_name() -> Iterator[str]:
    name = f"sp00ky-t{secrets.token_hex(3)}"
    yield name
    client = engine.connect()
    try:
        for network in client.networks.list(names=[name]):
            network.remove()
    finally:
        client.close()


def test_a_provisioner_removes_the_network_it_made_at_close(
    docker_images: str, network_name: str
) -> None:
    provisioner = DockerProvisioner(network_name, project="t")
    provisioner.prepare({})
    assert _networks(network_name) == [network_name]
    provisioner.close()
    assert _networks(network_name) == []


def test_a_network_that_was_there_before_is_left(docker_images: str, network_name: str) -> None:
    client = engine.connect()
    try:
        client.networks.create(network_name, driver="bridge")
        provisioner = DockerProvisioner(network_name, project="t")
        provisioner.prepare({})
        provisioner.close()
        assert _networks(network_name) == [network_name]
    finally:
        client.close()


def test_a_network_with_a_container_on_it_is_left_until_it_goes(
    docker_images: str, network_name: str
) -> None:
    provisioner = DockerProvisioner(network_name, project="t")
    provisioner.prepare({})
    client = engine.connect()
    container = client.containers.run(
        BASE_IMAGE, ["sleep", "30"], detach=True, network=network_name,
        labels={"sp00ky/test": "network"},
    )  # fmt: skip
    try:
        assert not engine.remove_unused_network(client, network_name)
        provisioner.close()  # a controller whose live machines stay keeps their network
        assert _networks(network_name) == [network_name]
    finally:
        container.remove(force=True)
    assert engine.remove_unused_network(client, network_name)
    assert _networks(network_name) == []
    assert engine.remove_unused_network(client, network_name)  # gone already: done
    client.close()


def test_a_refused_start_leaves_no_network(
    tmp_path: Path, docker_images: str, network_name: str
) -> None:
    provisioner = DockerProvisioner(network_name, project="t")
    missing = tmp_path / "backend" / "Dockerfile"
    with pytest.raises(Refused) as refused:
        provisioner.prepare({"renderer": Build(str(missing), str(tmp_path))})
    assert str(refused.value) == (
        f"backend renderer: no Dockerfile at {missing}: fix deploy.dockerfile in sp00ky.yml (a "
        "relative path starts at its directory), or add the file there"
    )
    assert _networks(network_name) == []
    provisioner.close()
