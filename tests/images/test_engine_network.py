"""The address a network's containers reach the host at: from the engine's IPAM config, and on a
real dockerd the one its containers are given."""

from __future__ import annotations

import pytest

from sp00ky_infra import engine
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
