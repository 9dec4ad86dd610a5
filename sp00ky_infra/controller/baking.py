"""Pools whose ``machine.image`` is ``baked``: their snapshots made by the controller at each
deploy and booted by their new machines once they exist, never waited for.

Once the controller leads (``start_bakes``, ``Bakes.on_leadership``), a thread for each baked
Hetzner pool runs ``bake.bake`` for the pool's recipe (``shared/recipe.py``: the default
image ``docker-ce`` as its base, the agent archive's sha256, the image the deploy settled for
the pool), each step a line of the controller's log: an available snapshot of the recipe is
used at once; else a bake server makes one (fetching the agent and a controller-built image
from an ``ImageFeed`` on the agents' host) while the pool's new machines boot the base image.
Once the snapshot exists, the provisioner writes its id for the pool into the stack
(``sp00ky:images``) at its next update, and the machines created from then on boot it; the
ones already running keep the image they booted (``infra/machine.py``). Older snapshots of
the pool that no server runs are pruned after it (``bake.prune``).

A failed bake is logged with its step and reason; the pool keeps booting the base image,
``explain pool`` says why, and the bake is tried again after RETRY_SECONDS, or at the next
deploy. Each outcome is one line (``outcome_line``) that ``parse_outcome`` reads back, for
whoever watches the log (``sp00ky-infra rehearse``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from sp00ky_infra.config import Config
from sp00ky_infra.config.machine_images import BAKED
from sp00ky_infra.config.model import DEFAULT_MACHINE_IMAGE
from sp00ky_infra.controller.bake import BakeError, BakeRequest, ImageFeed, bake
from sp00ky_infra.controller.images import ImageServer, PoolImage
from sp00ky_infra.controller.pricing import refresh_snapshots
from sp00ky_infra.controller.provisioners import Provisioner
from sp00ky_infra.controller.provisioners.by_pool import ByPool
from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.errors import HcloudError
from sp00ky_infra.policy.explain import Bake
from sp00ky_infra.store import open_store

log = logging.getLogger("sp00ky.controller")
RETRY_SECONDS = 3600.0  # a failed bake is tried again an hour later (or at the next deploy)
BASE_IMAGE = DEFAULT_MACHINE_IMAGE  # what a baked snapshot starts from
CLOSE_SECONDS = 15.0  # a stopping controller waits this long for a bake to delete its server
STOPPED = "the controller stopped"
_OUTCOME = re.compile(
    r"pool (?P<pool>\S+): (?:baked in (?P<seconds>[\d.]+)s: snapshot (?P<snapshot>\d+)"
    r"|bake failed at step (?P<step>\w*) after (?P<failed_after>[\d.]+)s: (?P<reason>.*))$"
)


class ImageSink(Protocol):
    """Where the image each baked pool's new machines boot goes (the pulumi provisioner)."""

    def set_image(self, pool: str, image: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """A bake's outcome as its log line says it."""

    pool: str
    seconds: float
    snapshot: int | None = None  # None: it failed
    step: str = ""
    reason: str = ""


def outcome_line(outcome: Outcome) -> str:
    if outcome.snapshot is not None:
        return f"pool {outcome.pool}: baked in {outcome.seconds:.1f}s: snapshot {outcome.snapshot}"
    return (f"pool {outcome.pool}: bake failed at step {outcome.step} after "
            f"{outcome.seconds:.1f}s: {outcome.reason}")  # fmt: skip


def parse_outcome(line: str) -> Outcome | None:
    """The outcome a line of the controller's log tells; None for any other line."""
    found = _OUTCOME.search(line.rstrip())
    if found is None:
        return None
    if found["snapshot"] is not None:
        return Outcome(found["pool"], float(found["seconds"]), int(found["snapshot"]))
    return Outcome(
        found["pool"], float(found["failed_after"]), step=found["step"], reason=found["reason"]
    )


class Bakes:
    """The bakes of one deploy, a thread per baked pool; ``state`` says where each stands."""

    def __init__(
        self, sink: ImageSink, api: Callable[[], HetznerAPI], feed_host: tuple[str, str],
        image_server: ImageServer | None = None, clock: Callable[[], float] = time.time,
        retry: float = RETRY_SECONDS, listed: Callable[[HetznerAPI], None] | None = None,
    ) -> None:  # fmt: skip
        self.sink = sink
        self.api = api
        self.feed_host = feed_host  # (where the feed listens, the address a server dials)
        self.image_server = image_server
        self.clock = clock
        self.retry = retry
        self.listed = listed  # after a bake: the project's snapshots, as their cost counts them
        self._states: dict[str, Bake] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._requests: dict[str, BakeRequest] = {}

    def prepare(self, requests: Mapping[str, BakeRequest]) -> None:
        """The pools to bake: their machines boot the base image until their snapshot exists."""
        self._requests = dict(requests)
        for pool, request in requests.items():
            self._set(pool, Bake("baking", request.base, self.clock()))

    def on_leadership(self, leader: bool) -> None:
        """Bake once this controller leads (a standby makes no servers), the first time only."""
        if not leader or self._threads:
            return
        for pool, request in self._requests.items():
            thread = threading.Thread(target=self._run, args=(request,), name=f"bake-{pool}",
                                      daemon=True)  # fmt: skip
            self._threads.append(thread)
            thread.start()

    def state(self, pool: str) -> Bake | None:
        with self._lock:
            return self._states.get(pool)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Stop: no retry, and a bake under way stops waiting for its server and deletes it."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _set(self, pool: str, state: Bake) -> None:
        with self._lock:
            self._states[pool] = state
        self.sink.set_image(pool, state.image)

    def _run(self, request: BakeRequest) -> None:
        while not self._stop.is_set():
            if self._once(request):
                return
            if self._stop.wait(self.retry):
                return

    def _once(self, request: BakeRequest) -> bool:
        """One bake of the pool; whether its snapshot is now what new machines boot."""
        pool, started = request.pool, time.monotonic()
        self._set(pool, Bake("baking", request.base, self.clock()))
        try:
            snapshot = self._bake(request)
        except Exception as exc:  # a failed bake never stops the controller: said and retried
            seconds = time.monotonic() - started
            step = exc.step if isinstance(exc, BakeError) else ""
            if not isinstance(exc, BakeError | HcloudError | OSError):
                log.exception("pool %s: the bake broke", pool)
            outcome = Outcome(pool, seconds, step=step or "start", reason=str(exc))
            log.warning("%s; its machines boot %s", outcome_line(outcome), request.base)
            now = self.clock()
            self._set(pool, Bake("failed", request.base, now, None, outcome.step, str(exc),
                                 now + self.retry))  # fmt: skip
            return False
        self._set(pool, Bake("baked", str(snapshot), self.clock(), snapshot))
        log.info("%s", outcome_line(Outcome(pool, time.monotonic() - started, snapshot)))
        return True

    def _bake(self, request: BakeRequest) -> int:
        listen, dial = self.feed_host
        built = request.image.source == "controller"
        image_id = request.image.reference if built else ""
        api = self.api()
        with ImageFeed(listen, self.image_server if built else None, image_id, dial=dial) as feed:
            baked = bake(
                api, feed.for_request(request),
                lambda line: log.info("pool %s: bake: %s", request.pool, line),
                reported=lambda: feed.failed or (STOPPED if self._stop.is_set() else None),
            )  # fmt: skip
        if self.listed is not None:
            try:
                self.listed(api)
            except Exception as exc:  # the daily pricing pass lists them again
                log.warning(
                    "pool %s: the project's snapshots were not listed: %s", request.pool, exc
                )
        return baked.snapshot


def baked_requests(
    config: Config, project: str, images: Mapping[str, PoolImage]
) -> dict[str, BakeRequest]:
    """What to bake for each baked Hetzner pool whose image the deploy settled."""
    found = {}
    for name, pool in config.pools.items():
        if pool.machine.image != BAKED or pool.provider != "hetzner" or name not in images:
            continue
        shape = pool.machine
        found[name] = BakeRequest(project, name, images[name], BASE_IMAGE, shape.type,
                                  (shape.locations or (None,))[0])  # fmt: skip
    return found


def start_bakes(
    settings: ControllerSettings, config: Config, provisioner: Provisioner,
    images: Mapping[str, PoolImage], image_server: ImageServer | None,
) -> Bakes | None:  # fmt: skip
    """The deploy's bakes, when the provisioner makes Hetzner servers with Pulumi and a pool
    asks for ``baked``: started once the controller leads (``on_leadership``); the
    provisioner keeps them (``bakes``) and closes them."""
    requests = baked_requests(config, settings.project or "dev", images)
    members = provisioner.members() if isinstance(provisioner, ByPool) else [provisioner]
    stack = next((m for m in members if isinstance(m, PulumiProvisioner)), None)
    if not requests or stack is None:
        return None
    provisioner = stack  # the hetzner pools' (each pool on its own provider)
    if provisioner.runs_on != "hetzner":
        log.warning("the stack's machines are containers: pools %s boot no snapshot",
                    ", ".join(requests))  # fmt: skip
        return None
    dial = urlsplit(settings.agents_url).hostname or settings.pool_host
    bakes = Bakes(provisioner, lambda: HetznerAPI.from_env(caller="bake"),
                  (settings.pool_host, dial), image_server,
                  listed=lambda api: _list_snapshots(settings, api))  # fmt: skip
    provisioner.bakes = bakes
    bakes.prepare(requests)
    return bakes


def _list_snapshots(settings: ControllerSettings, api: HetznerAPI) -> None:
    """The project's snapshots listed into its store right after a bake, so ``pools get`` and
    /metrics count the new one (and not the pruned ones) before the daily pricing pass."""
    store = open_store(settings.store_url)
    try:
        refresh_snapshots(store, api, settings.project or "dev", time.time())
    finally:
        store.close()
