"""The Docker engine to speak to, and what is said when none answers."""

from __future__ import annotations

import docker
from docker.errors import DockerException


class EngineError(Exception):
    """No Docker engine answers, or it answers what cannot be used (a network with no IPv4)."""


def connect() -> docker.DockerClient:
    """The engine at DOCKER_HOST (default: the local socket), answering."""
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        raise EngineError(f"cannot reach the Docker engine: {exc}") from exc
    return client
