"""Docker machines (SPKY_POOL_DOCKER=1): each machine is a container on the controller's
Docker engine, made from the backend's image with the agent added, on SPKY_POOL_DOCKER_NETWORK.

The controller builds ``sp00ky-dev-pool-<backend>`` from deploy.dockerfile, and from it
``sp00ky-dev-machine-<backend>`` (the agent added). A machine container runs the agent, which
runs the image's own command as the backend, in the same container. No port is published;
the agent reaches the controller at SPKY_POOL_PUBLIC_URL over the network. Everything carries
labels, and machine containers left by an earlier run are removed when the controller starts.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import tarfile
from collections.abc import Mapping

import docker
from docker.errors import APIError, BuildError, DockerException, ImageNotFound, NotFound

from sp00ky_infra.controller.images import build_pool_image
from sp00ky_infra.controller.provisioners.base import MachineSpec, Provisioned, Refused
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.cloud_init import AGENT
from sp00ky_infra.shared.names import container_name, machine_image, network_name, pool_image

log = logging.getLogger("sp00ky.controller")
MACHINE_DOCKERFILE = """\
FROM {base}
COPY agent /opt/sp00ky/agent
RUN python3 -c "import requests" 2>/dev/null \\
    || pip install --no-cache-dir requests \\
    || (apt-get update && apt-get install -y --no-install-recommends python3-requests)
ENV PYTHONPATH=/opt/sp00ky PYTHONUNBUFFERED=1
LABEL {role}=machine-image
ENTRYPOINT []
CMD ["python3", "-m", "agent"]
"""


class DockerProvisioner:
    """Reaps, HasGateway."""

    name = "docker"
    delivers_join_token = True  # in the container's environment

    def __init__(
        self, network: str, project: str = "dev", client: docker.DockerClient | None = None
    ) -> None:
        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except DockerException as exc:
            raise Refused(f"cannot reach the Docker engine: {exc}") from exc
        self.project = project
        self.network = network or network_name(project)
        self.commands: dict[str, list[str]] = {}  # backend -> its image's command

    def prepare(self, backends: Mapping[str, tuple[str, str]]) -> None:
        """Build each backend's images: {backend: (dockerfile, context)}; make the network."""
        try:
            self.client.networks.get(self.network)
        except NotFound:
            self.client.networks.create(
                self.network, driver="bridge", labels={labels.PROJECT: self.project}
            )
        for backend, (dockerfile, context) in backends.items():
            self._build(backend, dockerfile, context)

    def gateway(self) -> str:
        """The address the network's containers reach this host at."""
        config = self.client.networks.get(self.network).attrs["IPAM"]["Config"]
        return str(config[0]["Gateway"])

    def _build(self, backend: str, dockerfile: str, context: str) -> None:
        try:
            image = build_pool_image(self.client, self.project, backend, dockerfile, context)
            config = image.attrs["Config"]
            self.commands[backend] = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
            self.client.images.build(
                fileobj=_machine_context(pool_image(backend)), custom_context=True,
                tag=machine_image(backend), rm=True,
            )  # fmt: skip
        except (BuildError, APIError) as exc:
            raise Refused(f"building the image of backend {backend} failed: {exc}") from exc

    def create(self, spec: MachineSpec) -> Provisioned:
        if spec.join_token is None:
            raise Refused(f"machine {spec.name} has no join token to start its agent with")
        command = self.commands.get(spec.backend)
        if command is None:
            raise Refused(f"backend {spec.backend}'s image was not built; is it a pool backend?")
        machine_labels = labels.machine_labels(
            self.project, spec.pool, spec.name, spec.revision, **{labels.ROLE: "machine"}
        )
        try:
            container = self.client.containers.run(
                machine_image(spec.backend),
                name=container_name(spec.name),
                detach=True,
                network=self.network,
                labels=machine_labels,
                environment={
                    "SPKY_AGENT_CONTROLLER_URL": spec.controller_url,
                    "SPKY_AGENT_MACHINE": spec.name,
                    "SPKY_AGENT_JOIN_TOKEN": spec.join_token,
                    "SPKY_AGENT_RUNTIME": "process",
                    "SPKY_AGENT_COMMAND": json.dumps(command),
                    "SPKY_AGENT_WORKDIR": "/",
                },
            )  # no ports: the backend's port is never published
        except (APIError, ImageNotFound) as exc:
            raise Refused(f"starting machine {spec.name} failed: {exc}") from exc
        return Provisioned(provider_id=str(container.id), provider_state="container")

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        with contextlib.suppress(NotFound):
            self.client.containers.get(provider_id or container_name(name)).remove(force=True)

    def reap(self) -> list[str]:
        """Remove the machine containers an earlier run left; returns their machine names."""
        removed = []
        selector = [f"{labels.ROLE}=machine", f"{labels.PROJECT}={self.project}"]
        for container in self.client.containers.list(all=True, filters={"label": selector}):
            removed.append(str(container.labels.get(labels.MACHINE, container.name)))
            container.remove(force=True)
        return removed

    def close(self) -> None:
        self.client.close()


def _machine_context(base: str) -> io.BytesIO:
    """A build context: the Dockerfile that adds the agent to ``base``, and the agent."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        dockerfile = MACHINE_DOCKERFILE.format(base=base, role=labels.ROLE).encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        for path in sorted(AGENT.glob("*.py")):
            tar.add(path, arcname=f"agent/{path.name}")
    buffer.seek(0)
    return buffer
