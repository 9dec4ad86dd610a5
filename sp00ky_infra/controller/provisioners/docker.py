"""Docker machines (SPKY_POOL_DOCKER=1): each machine is a container on the controller's
Docker engine, made from the backend's image with the agent added, on SPKY_POOL_DOCKER_NETWORK.

A thin adapter over ``sp00ky_infra.engine``, which the local Pulumi stack shares: the controller
builds ``sp00ky-dev-pool-<backend>`` from deploy.dockerfile (or pulls deploy.image from its
registry, with the controller's credentials), and from it ``sp00ky-dev-machine-<backend>`` (the
agent added). A machine container runs the agent, which
runs the image's own command as the backend, in the same container. No port is published;
the agent reaches the controller at SPKY_POOL_PUBLIC_URL over the network.

When the controller starts, ``reap`` removes the machine containers the store does not know as
live; those it does keep running, and their agents reconnect (a restart loses nothing). ``dev``
keeps none: it removes every leftover of an earlier run. The network goes at ``close`` (or a
failed ``prepare``) when this provisioner made it and no container is on it any more.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import APIError, BuildError, DockerException, ImageNotFound, NotFound

from agent.tail import TAIL_LINES
from sp00ky_infra import engine
from sp00ky_infra.controller.provisioners.base import MachineSpec, Provisioned, Refused
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.names import container_name, network_name, pool_image


@dataclass(frozen=True, slots=True)
class Build:
    """The backend's image, built from its deploy.dockerfile."""

    dockerfile: str
    context: str


@dataclass(frozen=True, slots=True)
class Pull:
    """The backend's image, pulled from a registry (deploy.image), with its credentials."""

    reference: str
    auth: Mapping[str, str] | None = None


class DockerProvisioner:
    """Reaps, HasGateway."""

    name = "docker"
    delivers_join_token = True  # in the container's environment

    def __init__(
        self, network: str, project: str = "dev", client: docker.DockerClient | None = None
    ) -> None:
        try:
            self.client = client or engine.connect()
        except engine.EngineError as exc:
            raise Refused(str(exc)) from exc
        self.project = project
        self.network = network or network_name(project)
        self.commands: dict[str, list[str]] = {}  # backend -> its image's command
        self.image_env: dict[str, list[str]] = {}  # backend -> the names of its image's ENV
        self.made_network = False  # whether prepare made the network (then close removes it)

    def prepare(self, backends: Mapping[str, Build | Pull]) -> None:
        """Make the network; each backend's images, built or pulled (the network made goes
        again when one fails: nothing is left of a start that is refused)."""
        _, self.made_network = engine.made_network(self.client, self.network, self.project)
        try:
            for backend, source in backends.items():
                self._images(backend, source)
        except BaseException:
            self._remove_network()
            raise

    def _images(self, backend: str, source: Build | Pull) -> None:
        try:
            if isinstance(source, Pull):
                self.commands[backend] = engine.pull_images(
                    self.client, backend, source.reference, source.auth
                )
            else:
                self.commands[backend] = engine.build_images(
                    self.client, self.project, backend, source.dockerfile, source.context
                )
            self.image_env[backend] = self._image_env(backend)
        except engine.MissingDockerfile as exc:
            raise Refused(f"backend {backend}: {exc}") from exc
        except ImageNotFound as exc:
            raise Refused(f"the image of backend {backend} was not found: {exc}") from exc
        except (BuildError, APIError) as exc:
            how = "pulling" if isinstance(source, Pull) else "building"
            raise Refused(f"{how} the image of backend {backend} failed: {exc}") from exc

    def _image_env(self, backend: str) -> list[str]:
        """The names the backend's own image sets (its ENV, not the agent layer's): what its
        agent passes on to it."""
        config = self.client.images.get(pool_image(backend)).attrs.get("Config") or {}
        return [entry.split("=", 1)[0] for entry in config.get("Env") or []]

    def gateway(self) -> str:
        """The address the network's containers reach this host at."""
        return engine.network_gateway(self.client, self.network)

    def create(self, spec: MachineSpec) -> Provisioned:
        if spec.join_token is None:
            raise Refused(f"machine {spec.name} has no join token to start its agent with")
        command = self.commands.get(spec.backend)
        if command is None:
            raise Refused(f"backend {spec.backend}'s image was not built; is it a pool backend?")
        run = _MachineRun(
            self.image_env.get(spec.backend, []),
            project=self.project, pool=spec.pool, machine=spec.name, revision=spec.revision,
            backend=spec.backend, controller_url=spec.controller_url, join_token=spec.join_token,
            command=command, network=self.network,
        )  # fmt: skip
        try:
            container_id = engine.run_machine(self.client, run)
        except (APIError, ImageNotFound) as exc:
            raise Refused(f"starting machine {spec.name} failed: {exc}") from exc
        return Provisioned(provider_id=container_id, provider_state="container")

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        engine.remove_container(self.client, provider_id or container_name(name))

    def last_output(self, name: str, provider_id: str | None) -> list[str]:
        """The end of the machine container's log (its agent's lines and its backend's)."""
        try:
            container = self.client.containers.get(provider_id or container_name(name))
            raw = container.logs(tail=TAIL_LINES * 4)
        except (NotFound, APIError):
            return []
        return bytes(raw).decode(errors="replace").splitlines()

    def reap(self, keep: Collection[str] = ()) -> list[str]:
        """Remove this project's machine containers but those of the machines in ``keep`` (the
        store's live ones, which reconnect); returns the removed containers' machine names."""
        removed = []
        for container in engine.machine_containers(self.client, self.project):
            machine = str(container.labels.get(labels.MACHINE, container.name))
            if machine in keep:
                continue
            removed.append(machine)
            with contextlib.suppress(NotFound):
                container.remove(force=True)
        return removed

    def close(self) -> None:
        self._remove_network()
        self.client.close()

    def _remove_network(self) -> None:
        """The network this provisioner made, once no container is on it (``dev`` destroyed
        its machines first; a controller's live ones keep it, and it them)."""
        if self.made_network:
            with contextlib.suppress(DockerException):  # an engine gone: nothing to tidy
                self.made_network = not engine.remove_unused_network(self.client, self.network)


class _MachineRun(engine.MachineRun):
    """A machine container whose agent passes the image's ENV on to the backend (and nothing
    else of its environment: the agent's settings and join token stay the agent's)."""

    def __init__(self, image_env: list[str], **fields: Any) -> None:
        super().__init__(**fields)
        self.image_env = image_env

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "SPKY_AGENT_INHERIT_ENV": json.dumps(self.image_env)}
