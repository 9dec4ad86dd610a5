"""The images a docker machine runs: the backend's own (``sp00ky-dev-pool-<backend>``, built
from deploy.dockerfile or pulled from deploy.image) and that image with the agent added
(``sp00ky-dev-machine-<backend>``)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import tarfile
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
from docker.errors import BuildError, DockerException, ImageNotFound
from docker.models.images import Image
from docker.utils import parse_repository_tag
from docker.utils.json_stream import json_stream

from sp00ky_infra.engine.progress import report
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.cloud_init import AGENT
from sp00ky_infra.shared.names import machine_image, pool_image

log = logging.getLogger("sp00ky.engine")
BUILD_LOG_KEPT = 500  # events of a build kept for its BuildError (the CLI shows the last lines)
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
        report(what, event)
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


class MissingDockerfile(DockerException):
    """The Dockerfile a build names is not there (the engine's own answer is a 500 that names
    neither the path looked at nor the setting that gave it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"no Dockerfile at {path}: fix deploy.dockerfile in sp00ky.yml (a relative path "
            "starts at its directory), or add the file there"
        )
        self.path = path


def build_pool_image(
    client: docker.DockerClient, project: str, backend: str, dockerfile: str, context: str
) -> Image:
    """``sp00ky-dev-pool-<backend>`` from deploy.dockerfile, labelled: what a served image is,
    and what a docker machine's image starts from."""
    path = Path(dockerfile).resolve()
    if not path.is_file():
        raise MissingDockerfile(path)
    log.info("building %s from %s", pool_image(backend), dockerfile)
    return _build(
        client, f"building {pool_image(backend)}",
        path=context, dockerfile=str(path), tag=pool_image(backend),
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
        report(what, event)
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
