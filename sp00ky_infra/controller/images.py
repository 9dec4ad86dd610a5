"""The image each pool's machines run, settled once per deploy (when the controller starts):

- ``deploy.image``: a registry image, its tag resolved to a digest here (registry.py); each
  machine pulls that digest through its own Docker engine, with the credentials its join
  reply carries.
- ``deploy.dockerfile`` only: built here on the controller's Docker engine and served to the
  controller's own machines by image id over the agents' endpoint
  (``GET /v1/machines/NAME/images/ID``). It is saved (``docker save``) once, to a file of the
  server's own, in a thread of its own from the moment it is served, and every machine is
  sent that file chunk by chunk, never held whole: a ``docker save`` per machine costs the
  engine seconds each time, two machines at once twice. A machine that asks while the save
  is under way waits for it (SAVE_WAIT_SECONDS at most); past that, or if the save failed, it
  is sent ``docker save`` streamed as it comes. The agent loads the image as it arrives,
  checks the id and keeps it, so a machine never fetches the same image twice.

Either way the pinned reference (digest or image id) is part of the pool's revision.

ImagesError (a ControllerError): the message names the pool, the backend and what to set.
└── UnknownImage   a machine asked for an image this controller does not serve (409)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import docker
from docker.errors import APIError, BuildError, DockerException, ImageNotFound

from sp00ky_infra.config import Config
from sp00ky_infra.config.images import parse_image
from sp00ky_infra.controller.errors import ControllerError, Refusal
from sp00ky_infra.controller.registry import RegistryAuth, RegistryError, Resolver
from sp00ky_infra.engine.images import build_pool_image

log = logging.getLogger("sp00ky.controller")
CHUNK_BYTES = 1 << 22  # an image is read and sent 4 MiB at a time
# How long a machine's request waits for a save under way before it is sent its own stream
# of ``docker save``: a save takes seconds, and the agent's read timeout is 60 s.
SAVE_WAIT_SECONDS = 30.0
# Where the saved images go by default: on disk by convention, where /tmp may be a tmpfs
# (memory), and an image is never held whole in memory
SPOOL_DIR = "/var/tmp"


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
    """Images built from deploy.dockerfile on the controller's engine, served by id, each
    saved once to a file in a temporary directory of the server's own (in ``spool``, default
    SPOOL_DIR, else the system's), made at the first serve and removed at close, or at exit
    without one."""

    def __init__(
        self, client: docker.DockerClient, project: str = "dev", spool: str | None = None
    ) -> None:
        self.client = client
        self.project = project
        self.served: set[str] = set()
        self._spool_in = spool
        self._spool: Path | None = None
        self._saves: dict[str, _Save] = {}
        self._lock = threading.Lock()

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
        """Serve an image the engine has (by id) to this controller's machines; its save to
        the spool starts now, beside whatever the controller does next."""
        with self._lock:
            self.served.add(image_id)
            if image_id not in self._saves:
                path = self._spool_dir() / f"{image_id.removeprefix('sha256:')}.tar"
                self._saves[image_id] = _Save(path, lambda: self._engine_save(image_id))
        return image_id

    def stream(self, image_id: str) -> Iterator[bytes]:
        """The image as ``docker save`` writes it (a tar), chunk by chunk: from its saved
        file, or straight from the engine if its save failed or is slow."""
        if image_id not in self.served:
            raise UnknownImage(f"image {image_id} is not one this controller serves")
        saved = self._saves[image_id].wait(SAVE_WAIT_SECONDS)
        if saved is not None:
            return _chunks(saved)
        try:  # the engine's save answers 500, not 404, for an image it lost: ask first
            self.client.images.get(image_id)
        except ImageNotFound as exc:
            raise UnknownImage(f"image {image_id} is no longer on the controller's engine") from exc
        return self._engine_save(image_id)

    def _spool_dir(self) -> Path:
        if self._spool is None:
            default = SPOOL_DIR if os.access(SPOOL_DIR, os.W_OK) else None
            where = self._spool_in or default
            self._spool = Path(tempfile.mkdtemp(prefix="sp00ky-images-", dir=where))
            weakref.finalize(self, shutil.rmtree, self._spool, True)
        return self._spool

    def _engine_save(self, image_id: str) -> Iterator[bytes]:
        chunks: Iterator[bytes] = self.client.api.get_image(image_id, chunk_size=CHUNK_BYTES)
        return chunks

    def close(self) -> None:
        self.client.close()
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)


class _Save:
    """One image's ``docker save`` to its file in the spool, in a thread of its own: written
    beside the file and renamed into place once whole, so a file there is a whole save."""

    def __init__(self, path: Path, save: Callable[[], Iterator[bytes]]) -> None:
        self.path = path
        self.done = threading.Event()
        self.ok = False
        threading.Thread(target=self._run, args=(save,), name="image-save", daemon=True).start()

    def _run(self, save: Callable[[], Iterator[bytes]]) -> None:
        partial, started, size = self.path.with_suffix(".partial"), time.monotonic(), 0
        try:
            with partial.open("wb") as out:
                for chunk in save():
                    size += out.write(chunk)
            partial.rename(self.path)
            self.ok = True
            log.info("image %s saved to %s (%.1f MB in %.1f s)", self.path.stem, self.path,
                     size / 1e6, time.monotonic() - started)  # fmt: skip
        except Exception as exc:  # the thread's end: machines get docker save streamed instead
            log.warning("saving image %s to %s failed: %s", self.path.stem, self.path, exc)
            partial.unlink(missing_ok=True)
        finally:
            self.done.set()

    def wait(self, seconds: float) -> BinaryIO | None:
        """The saved file, open; None if the save failed, is still under way after
        ``seconds``, or its file is gone."""
        if not self.done.wait(seconds) or not self.ok:
            return None
        try:
            return self.path.open("rb")
        except OSError:
            return None


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    with file:
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


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
