"""The names of what sp00ky creates: machines, images, containers, networks, firewalls.

A machine's name is its identity everywhere (store row, stack config, server, container, join
token); the others derive from the project, the pool or the backend. Each is built here only.
"""

from __future__ import annotations

import secrets


def machine_name(pool: str) -> str:
    """A new machine of ``pool``: never reused, so a replaced machine is a new name."""
    return f"{pool}-{secrets.token_hex(3)}"


def pool_image(backend: str) -> str:
    """The backend's own image, built from deploy.dockerfile (the docs'
    ``sp00ky-dev-pool-<backend>``): what a machine's agent runs as the backend."""
    return f"sp00ky-dev-pool-{backend}"


def machine_image(backend: str) -> str:
    """The backend's image with the agent added: what a Docker machine container runs."""
    return f"sp00ky-dev-machine-{backend}"


def container_name(machine: str) -> str:
    """The container of a Docker machine."""
    return f"sp00ky-{machine}"


def network_name(project: str) -> str:
    """The Docker network of a project's machine containers (unless one is configured)."""
    return f"sp00ky-{project}"


def firewall_name(project: str, pool: str) -> str:
    """The Hetzner firewall (no inbound rules) of a pool's servers."""
    return f"sp00ky-{project}-{pool}"


def heartbeat_name(project: str) -> str:
    """The small Hetzner firewall whose label carries the scheduler's heartbeat."""
    return f"sp00ky-heartbeat-{project}"
