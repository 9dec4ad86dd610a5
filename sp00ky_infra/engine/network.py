"""The project's bridge network, which its machine containers join."""

from __future__ import annotations

import contextlib
import ipaddress

import docker
from docker.errors import NotFound

from sp00ky_infra.engine.client import EngineError
from sp00ky_infra.shared import labels


def ensure_network(client: docker.DockerClient, name: str, project: str) -> str:
    """The bridge network ``name``, made (labelled with the project) if missing; its id."""
    try:
        return str(client.networks.get(name).id)
    except NotFound:
        network = client.networks.create(name, driver="bridge", labels={labels.PROJECT: project})
        return str(network.id)


def network_gateway(client: docker.DockerClient, name: str) -> str:
    """The address the network's containers reach this host at."""
    return ipv4_pool(client.networks.get(name).attrs["IPAM"]["Config"])[1]


def ipv4_pool(config: list[dict[str, str]]) -> tuple[str, str]:
    """The subnet and gateway of a network's first IPv4 pool (its ``IPAM.Config``).

    A daemon's first start on a machine (no docker0 yet) reports the default bridge's pool
    without its Gateway (after a restart it is there): the gateway is then
    the subnet's first address, the one the engine's IPAM gives the bridge by default."""
    for pool in config:
        subnet = ipaddress.ip_network(pool["Subnet"])
        if subnet.version == 4:
            return pool["Subnet"], pool.get("Gateway") or str(next(subnet.hosts()))
    raise EngineError(f"the network has no IPv4 pool (IPAM config: {config})")


def remove_network(client: docker.DockerClient, name: str) -> None:
    """Remove the network; one already gone is done."""
    with contextlib.suppress(NotFound):
        client.networks.get(name).remove()
