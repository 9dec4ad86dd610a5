"""The backend on this machine: its runtime (a process, or a container whose image is
fetched first), started, restarted and stopped under one lock, since the watchdog may stop
it while the loop starts it.

A container's boot: the Docker engine is looked for from the agent's start (``prepare``,
while the join is out), the image is fetched as soon as the join has named it and the
engine answers, then the container starts and its healthcheck is polled until it answers."""

from __future__ import annotations

import threading
from typing import Any

from agent import controller as remote
from agent.clock import Clock, Monotonic
from agent.docker import DockerAPI, DockerRuntime, EngineWatch
from agent.errors import ControllerError, Gone, ImageUnavailable, Refused, RuntimeError_
from agent.images import Transient, ensure_image
from agent.logs import Log
from agent.protocol import BackendInfo
from agent.runtime import ProcessRuntime, Runtime, wait_ready
from agent.settings import Settings


class Backend:
    def __init__(
        self,
        settings: Settings,
        controller: remote.Controller,
        log: Log,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.controller = controller  # where a served image comes from
        self.log = log
        self.clock = clock or Monotonic()
        docker = settings.runtime == "docker"
        self.engine = EngineWatch(settings.docker_socket, self.clock) if docker else None
        self.lock = threading.RLock()
        self.runtime: Runtime | None = None
        self.info: BackendInfo | None = None
        self.pool = ""
        self.boot_timeout = 0.0

    def prepare(self) -> None:
        """Before the join: start looking for the Docker engine (a container's runtime), so
        that the image's fetch waits for neither the engine nor the join once both are done.
        Safe beside the join: it only reads the engine's ``/_ping``."""
        if self.engine is not None:
            self.engine.start()

    def boot(self, info: BackendInfo, pool: str, boot_timeout: float) -> str | None:
        """Start the backend the join described; None once it answers, else why not."""
        self.info, self.pool, self.boot_timeout = info, pool, boot_timeout
        return self.start()

    def start(self) -> str | None:
        """Start it (its runtime made at the first start) and wait until it answers: None,
        or the reason it cannot (with its last lines of output)."""
        try:
            with self.lock:
                assert self.info is not None
                if self.runtime is None:
                    self.runtime = self._runtime(self.info)
                self.runtime.start()
                deadline = self.clock.now() + self.boot_timeout
                return wait_ready(self.runtime, self.info.healthcheck, deadline, self.clock)
        except RuntimeError_ as exc:
            return str(exc)

    def stop(self) -> None:
        with self.lock:
            if self.runtime is not None:
                self.runtime.stop()

    def alive(self) -> bool:
        with self.lock:
            return self.runtime is not None and self.runtime.alive()

    def restart(self, why: str) -> bool:
        self.log("backend_restart", reason=why)
        self.stop()
        problem = self.start()
        if problem:
            self.log("backend_down", reason=problem)
            return False
        return True

    def describe(self) -> str | None:
        return self.runtime.describe() if self.runtime else None

    @property
    def port(self) -> int:
        assert self.runtime is not None
        return self.runtime.port

    def _runtime(self, backend: BackendInfo) -> Runtime:
        settings = self.settings
        if self.engine is not None:
            deadline = self.clock.now() + self.boot_timeout
            self.engine.ready(deadline)
            api = DockerAPI(settings.docker_socket)
            image = settings.image or self._fetch_image(api, backend, deadline)
            if not image:
                raise RuntimeError_("the docker runtime needs an image (SPKY_AGENT_IMAGE)")
            labels = {"sp00ky/machine": settings.machine, "sp00ky/pool": self.pool}
            return DockerRuntime(
                image=image,
                env=backend.env,
                container_port=backend.port or 8080,
                labels={**labels, "sp00ky/role": "backend"},
                name=f"sp00ky-{settings.machine}-backend",
                api=api,
            )
        command = list(settings.command or backend.command)
        return ProcessRuntime(command, backend.env, settings.workdir, inherit=settings.inherit_env)

    def _fetch_image(self, api: DockerAPI, backend: BackendInfo, deadline: float) -> str | None:
        """The backend's image onto this machine's engine before it starts (ImageError, a
        failed boot naming the image, if it cannot be had by ``deadline``)."""
        if backend.image_source is None:
            return backend.image
        return ensure_image(api, backend.image_source, self._image_stream, self.log, deadline)

    def _image_stream(self, image_id: str) -> Any:
        try:
            return self.controller.image(image_id)
        except Gone:
            raise
        except Refused as exc:
            raise ImageUnavailable(f"image {image_id}: the controller refused it: {exc}") from exc
        except ControllerError as exc:
            raise Transient(str(exc)) from exc
