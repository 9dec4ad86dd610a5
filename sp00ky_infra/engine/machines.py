"""Machine containers: labelled (``shared.labels``), the agent's ``SPKY_AGENT_*``
environment, on the project's network, no port published, and ``host.docker.internal``
mapped to the host's gateway (``host-gateway``) so a controller on the host is reachable on
Linux too."""

from __future__ import annotations

import json
from collections.abc import Mapping

import docker
from docker.errors import NotFound
from docker.models.containers import Container

from sp00ky_infra.shared import labels
from sp00ky_infra.shared.names import container_name, machine_image

HOST_GATEWAY = {"host.docker.internal": "host-gateway"}  # the host, from inside a container


class MachineRun:
    """What a machine container is made of (the agent's environment derives from it)."""

    def __init__(
        self,
        *,
        project: str,
        pool: str,
        machine: str,
        revision: str,
        backend: str,
        controller_url: str,
        join_token: str,
        command: list[str],
        network: str,
        extra_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.project, self.pool, self.machine, self.revision = project, pool, machine, revision
        self.backend, self.controller_url, self.join_token = backend, controller_url, join_token
        self.command, self.network = command, network
        self.extra_labels = dict(extra_labels or {})

    @property
    def image(self) -> str:
        return machine_image(self.backend)

    @property
    def name(self) -> str:
        return container_name(self.machine)

    def labels(self) -> dict[str, str]:
        return {
            **self.extra_labels,
            **labels.machine_labels(self.project, self.pool, self.machine, self.revision),
            labels.ROLE: "machine",
        }

    def environment(self) -> dict[str, str]:
        return {
            "SPKY_AGENT_CONTROLLER_URL": self.controller_url,
            "SPKY_AGENT_MACHINE": self.machine,
            "SPKY_AGENT_JOIN_TOKEN": self.join_token,
            "SPKY_AGENT_RUNTIME": "process",
            "SPKY_AGENT_COMMAND": json.dumps(self.command),
            "SPKY_AGENT_WORKDIR": "/",
        }


def run_machine(client: docker.DockerClient, run: MachineRun) -> str:
    """Start the machine container; its id. No port is published: the agent dials out."""
    container = client.containers.run(
        run.image,
        name=run.name,
        detach=True,
        network=run.network,
        labels=run.labels(),
        environment=run.environment(),
        extra_hosts=HOST_GATEWAY,
    )
    return str(container.id)


def remove_container(client: docker.DockerClient, ref: str) -> bool:
    """Remove the container (by id or name), running or not; False when it was gone."""
    try:
        client.containers.get(ref).remove(force=True)
    except NotFound:
        return False
    return True


def machine_containers(client: docker.DockerClient, project: str) -> list[Container]:
    """The project's machine containers, running or not."""
    selector = [f"{labels.ROLE}=machine", f"{labels.PROJECT}={project}"]
    # a container removed between the listing and its inspection is gone: not an error
    return list(client.containers.list(all=True, filters={"label": selector}, ignore_removed=True))
