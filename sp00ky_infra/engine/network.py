"""The project's bridge network, which its machine containers join."""

from __future__ import annotations

import contextlib
import ipaddress

import docker
from docker.errors import APIError, NotFound

from sp00ky_infra.engine.client import EngineError
from sp00ky_infra.shared import labels


def ensure_network(client: docker.DockerClient, name: str, project: str) -> str:
    """The bridge network ``name``, made (labelled with the project) if missing; its id."""
    return made_network(client, name, project)[0]


def made_network(client: docker.DockerClient, name: str, project: str) -> tuple[str, bool]:
    """The bridge network ``name``'s id, and whether this call made it (labelled with the
    project) because it was missing: only a network one made is one's own to remove."""
    try:
        return str(client.networks.get(name).id), False
    except NotFound:
        network = client.networks.create(name, driver="bridge", labels={labels.PROJECT: project})
        return str(network.id), True


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


def remove_unused_network(client: docker.DockerClient, name: str) -> bool:
    """Remove the network unless a container is on it (the engine refuses to while one is:
    a container joined since the look is left its network too); whether it is gone."""
    try:
        network = client.networks.get(name)
        if network.attrs.get("Containers"):
            return False
        network.remove()
    except NotFound:
        return True
    except APIError:  # a container joined it meanwhile
        return False
    return True
