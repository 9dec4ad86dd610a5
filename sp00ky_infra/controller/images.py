"""The image each pool's machines run, settled once per deploy (when the controller starts):

- ``deploy.image``: a registry image, its tag resolved to a digest here (registry.py); each
  machine pulls that digest through its own Docker engine, with the credentials its join
  reply carries.
- ``deploy.dockerfile`` only: built here on the controller's Docker engine and served to the
  controller's own machines by image id over the agents' endpoint
  (``GET /v1/machines/NAME/images/ID``): ``docker save`` streamed chunk by chunk, never held
  whole; the agent loads it as it arrives, checks the id and keeps it, so a machine never
  fetches the same image twice.

Either way the pinned reference (digest or image id) is part of the pool's revision.

ImagesError (a ControllerError): the message names the pool, the backend and what to set.
└── UnknownImage   a machine asked for an image this controller does not serve (409)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import docker
from docker.errors import APIError, BuildError, DockerException, ImageNotFound

from sp00ky_infra.config import Config
from sp00ky_infra.config.images import parse_image
from sp00ky_infra.controller.errors import ControllerError, Refusal
from sp00ky_infra.controller.registry import RegistryAuth, RegistryError, Resolver
from sp00ky_infra.engine.images import build_pool_image

log = logging.getLogger("sp00ky.controller")
CHUNK_BYTES = 1 << 22  # docker save is read and sent 4 MiB at a time


class ImagesError(ControllerError):
    """A pool's image cannot be settled; the message says what to set."""


class UnknownImage(ImagesError, Refusal):
    """A machine asked for an image this controller does not serve (409: never retried)."""


@dataclass(frozen=True, slots=True)
class PoolImage:
    """Where a pool's machines get their image, pinned."""

    source: Literal["registry", "controller"]
    reference: str  # registry: NAME@sha256:...; controller: the image id, sha256:...
    auth: RegistryAuth | None = None  # registry credentials, sent in the join reply only


class ImageServer:
    """Images built from deploy.dockerfile on the controller's engine, served by id."""

    def __init__(self, client: docker.DockerClient, project: str = "dev") -> None:
        self.client = client
        self.project = project
        self.served: set[str] = set()

    @classmethod
    def connect(cls, project: str = "dev") -> ImageServer:
        """The engine at DOCKER_HOST (default: the local socket); ImagesError if none answers."""
        try:
            client = docker.from_env()
            client.ping()
        except DockerException as exc:
            raise ImagesError(f"no Docker engine answers ({exc})") from exc
        return cls(client, project)

    def build(self, backend: str, dockerfile: str, context: str) -> str:
        """Build ``sp00ky-dev-pool-<backend>``; its image id, now served."""
        try:
            image = build_pool_image(self.client, self.project, backend, dockerfile, context)
        except (BuildError, APIError, DockerException) as exc:
            raise ImagesError(f"building the image of backend {backend} failed: {exc}") from exc
        return self.serve(str(image.id))

    def serve(self, image_id: str) -> str:
        """Serve an image the engine has (by id) to this controller's machines."""
        self.served.add(image_id)
        return image_id

    def stream(self, image_id: str) -> Iterator[bytes]:
        """The image as ``docker save`` writes it (a tar), chunk by chunk."""
        if image_id not in self.served:
            raise UnknownImage(f"image {image_id} is not one this controller serves")
        try:
            chunks: Iterator[bytes] = self.client.api.get_image(image_id, chunk_size=CHUNK_BYTES)
        except ImageNotFound as exc:
            raise UnknownImage(f"image {image_id} is no longer on the controller's engine") from exc
        return chunks

    def close(self) -> None:
        self.client.close()


def settle_images(
    config: Config,
    resolver: Resolver,
    server: ImageServer | None,
    no_engine: str = "",
) -> dict[str, PoolImage]:
    """Each pool's image, by pool: registry images resolved, dockerfile images built.

    ``server`` is None when the controller has no Docker engine (``no_engine`` says why):
    then every pool backend needs a deploy.image.
    """
    images: dict[str, PoolImage] = {}
    for pool in config.pools:
        backend = config.backend_for(pool)
        if backend.deploy.image:
            ref = parse_image(backend.deploy.image)
            try:
                pinned = resolver.resolve(ref)
            except RegistryError as exc:
                raise ImagesError(f"pool {pool}: {exc}") from exc
            log.info("pool %s runs %s (resolved from %s)", pool, pinned, ref)
            images[pool] = PoolImage("registry", str(pinned), resolver.auth_for(ref))
            continue
        if server is None:
            raise ImagesError(
                f"pool {pool}: backend {backend.name} has no deploy.image, and this controller "
                f"has no Docker engine to build its deploy.dockerfile ({no_engine}). Set "
                f"apps.{backend.name}.deploy.image to a registry image (REGISTRY/NAME:TAG), "
                "or give the controller a Docker engine (DOCKER_HOST, or /var/run/docker.sock)"
            )
        dockerfile = config.resolve(backend.deploy.dockerfile or "Dockerfile")
        image_id = server.build(backend.name, dockerfile, str(Path(dockerfile).parent))
        images[pool] = PoolImage("controller", image_id)
    return images
