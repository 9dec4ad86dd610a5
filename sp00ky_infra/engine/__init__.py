"""The Docker Engine work both the controller (its docker provisioner, its image server) and
infra (the local Pulumi stack's dynamic provider) do: the images, the network and the machine
containers. Below both of them (``.importlinter``); named ``engine``, not ``docker``, so it
never shadows the SDK.

- ``sp00ky-dev-pool-<backend>``: the backend's image, built from deploy.dockerfile, labelled;
  its command (entrypoint + cmd) is what the agent runs as the backend.
- ``sp00ky-dev-machine-<backend>``: that image with the agent added, running ``python3 -m
  agent``: what a machine container runs.
- A machine container: labelled (``shared.labels``), the agent's ``SPKY_AGENT_*`` environment,
  on the project's network, no port published, and ``host.docker.internal`` mapped to the
  host's gateway (``host-gateway``) so a controller on the host is reachable on Linux too.

Docker's own errors (DockerException and its kinds) are the callers' to word, except
``connect`` and ``ipv4_pool``, which raise EngineError.

Builds and pulls tell their progress, the engine's own JSON events as they stream (build steps,
pulled layers), to the reporter a caller installs with ``reporting`` (the CLI draws it on a
terminal: cli/progress.py); with none installed they say nothing.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import logging
import re
import tarfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import docker
from docker.errors import BuildError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.models.images import Image
from docker.utils import parse_repository_tag
from docker.utils.json_stream import json_stream

from sp00ky_infra.shared import labels
from sp00ky_infra.shared.cloud_init import AGENT
from sp00ky_infra.shared.names import container_name, machine_image, pool_image

__all__ = [
    "HOST_GATEWAY",
    "EngineError",
    "MachineRun",
    "Reporter",
    "build_images",
    "build_machine_image",
    "build_pool_image",
    "connect",
    "ensure_network",
    "image_command",
    "ipv4_pool",
    "machine_containers",
    "network_gateway",
    "pull_images",
    "remove_container",
    "remove_network",
    "reporting",
    "run_machine",
]

log = logging.getLogger("sp00ky.engine")
HOST_GATEWAY = {"host.docker.internal": "host-gateway"}  # the host, from inside a container
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


# --- progress --------------------------------------------------------------------------------

# What is under way ("building sp00ky-dev-pool-renderer", "pulling REF"), and one event of the
# engine's stream: {"stream": "Step 2/5 : COPY ..."} for a build, {"status": "Downloading",
# "id": LAYER, "progressDetail": {...}} for a pull.
Reporter = Callable[[str, Mapping[str, Any]], None]
_reporter: ContextVar[Reporter | None] = ContextVar("sp00ky_engine_reporter", default=None)
BUILD_LOG_KEPT = 500  # events of a build kept for its BuildError (the CLI shows the last lines)


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Builds and pulls in this context (this thread) tell ``reporter`` their progress."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)


def _report(what: str, event: Mapping[str, Any]) -> None:
    reporter = _reporter.get()
    if reporter is not None:
        reporter(what, event)


def _build(client: docker.DockerClient, what: str, **kwargs: Any) -> Image:
    """``client.images.build`` (the same errors: BuildError with the build's log), telling
    each event of the build's stream as it comes. Callers pass ``forcerm``: a failed step's
    container is removed too (``docker build --force-rm``), not left stopped on the engine."""
    seen: deque[dict[str, Any]] = deque(maxlen=BUILD_LOG_KEPT)
    image_id: str | None = None
    for decoded in json_stream(client.api.build(**kwargs)):
        if not isinstance(decoded, dict):
            continue
        event: dict[str, Any] = decoded
        seen.append(event)
        _report(what, event)
        if "error" in event:
            raise BuildError(str(event["error"]), iter(list(seen)))
        built = re.search(
            r"(^Successfully built |sha256:)([0-9a-f]+)$", str(event.get("stream", ""))
        )
        if built:
            image_id = built.group(2)
    if image_id is None:
        last = str(seen[-1]) if seen else "the engine said nothing"
        raise BuildError(last, iter(list(seen)))
    return client.images.get(image_id)


# --- images ----------------------------------------------------------------------------------


def build_pool_image(
    client: docker.DockerClient, project: str, backend: str, dockerfile: str, context: str
) -> Image:
    """``sp00ky-dev-pool-<backend>`` from deploy.dockerfile, labelled: what a served image is,
    and what a docker machine's image starts from."""
    log.info("building %s from %s", pool_image(backend), dockerfile)
    return _build(
        client, f"building {pool_image(backend)}",
        path=context, dockerfile=str(Path(dockerfile).resolve()), tag=pool_image(backend),
        labels={labels.PROJECT: project, labels.ROLE: "pool-image"}, rm=True, forcerm=True,
    )  # fmt: skip


def image_command(image: Image) -> list[str]:
    """What the image runs: its entrypoint, then its command."""
    config = image.attrs["Config"]
    return [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]


def build_machine_image(client: docker.DockerClient, backend: str) -> None:
    """``sp00ky-dev-machine-<backend>``: the pool image with the agent added."""
    _build(
        client, f"building {machine_image(backend)}",
        fileobj=_machine_context(pool_image(backend)), custom_context=True,
        tag=machine_image(backend), rm=True, forcerm=True,
    )  # fmt: skip


def build_images(
    client: docker.DockerClient,
    project: str,
    backend: str,
    dockerfile: str,
    context: str,
    *,
    if_missing: bool = False,
) -> list[str]:
    """Both images of ``backend`` (only those the engine lacks, with ``if_missing``); the
    pool image's command, which the agent runs as the backend."""
    image: Image | None = None
    if if_missing:
        with contextlib.suppress(ImageNotFound):
            image = client.images.get(pool_image(backend))
    if image is None:
        image = build_pool_image(client, project, backend, dockerfile, context)
        build_machine_image(client, backend)  # a new pool image: the agent goes on it again
    elif if_missing:
        try:
            client.images.get(machine_image(backend))
        except ImageNotFound:
            build_machine_image(client, backend)
    return image_command(image)


def pull_images(
    client: docker.DockerClient,
    backend: str,
    reference: str,
    auth: Mapping[str, str] | None = None,
) -> list[str]:
    """A registry image (deploy.image) as ``sp00ky-dev-pool-<backend>``: pulled with the
    registry's credentials (by digest when the reference is pinned), tagged, and the machine
    image built from it; the image's command, which the agent runs as the backend."""
    log.info("pulling %s for backend %s", reference, backend)
    image = _pull(client, reference, auth)
    image.tag(pool_image(backend))
    build_machine_image(client, backend)
    return image_command(image)


def _pull(client: docker.DockerClient, reference: str, auth: Mapping[str, str] | None) -> Image:
    """``client.images.pull(reference)`` (a tag or a digest), telling each layer's events."""
    repository, tag = parse_repository_tag(reference)
    tag = tag or "latest"
    what = f"pulling {reference}"
    events = client.api.pull(
        repository, tag=tag, stream=True, decode=True, auth_config=dict(auth) if auth else None
    )
    for event in events:
        _report(what, event)
    return client.images.get(f"{repository}{'@' if tag.startswith('sha256:') else ':'}{tag}")


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


# --- the network -----------------------------------------------------------------------------


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
    without its Gateway (moby/moby#26799; after a restart it is there): the gateway is then
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


# --- machine containers ----------------------------------------------------------------------


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
