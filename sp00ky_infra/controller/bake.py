"""A pool's baked snapshot (``sp00ky-infra image bake POOL``): the pool's base image with
Docker, the pinned agent and the backend's image already on its disk, so a machine booted
from it skips the install and the image fetch.

The bake, step by step (each a progress line):

1. The recipe (``shared/recipe.py``): the base image, the agent archive's sha256 and the
   backend image's pinned reference, hashed. An ``available`` snapshot of the pool with that
   hash is reused: no server is made.
2. Else a bake server is created from the base image with the bake's user-data
   (``bake_user_data``, a few KB): ``cloud-init/bake.py``, the agent archive's sha256 and
   where the server fetches what it bakes in: ``ImageFeed``, on the baking host, serves it
   the agent archive once (a one-time token; the server checks its sha256 before unpacking
   it, as a machine's bootstrap does) and, for a controller-built image, ``docker save`` of
   it by id, as the controller serves its machines; a registry image is pulled by digest.
   The server installs, fetches, cleans up and powers itself off; the bake watches its
   status (GET /servers/{id}) until it is ``off``, or until the server reports its failure
   to the feed (``POST /failed``).
3. ``create_image`` with the recipe's labels, its action waited on; the server deleted
   (also when a step failed).
4. The pool's older snapshots deleted, except those a server still runs: Hetzner records the
   image each server was created from (``server.image.id``), so a snapshot stays while a
   machine booted from it lives, and goes at the first bake after the last one is gone.

The bake server carries the pool's label and ``sp00ky/role=bake`` but not the project's: the
guardian, which counts a project's servers as its machines, leaves it alone.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gzip
import json
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

from sp00ky_infra.controller.errors import ControllerError
from sp00ky_infra.controller.images import ImageServer, PoolImage, UnknownImage
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.domain import Image
from sp00ky_infra.hetzner.errors import HcloudError
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.cloud_init import (
    USER_DATA_LIMIT,
    agent_archive,
    agent_sha256,
    cloud_init_file,
    shipped_source,
)
from sp00ky_infra.shared.recipe import Recipe, pool_selector

BAKE_SECONDS = 1800.0  # a bake server's install and image fetch, at most
POLL_SECONDS = 5.0
Progress = Callable[[str], None]


STEPS = ("find", "create", "install", "snapshot", "prune")  # a bake's steps, in order


class BakeError(ControllerError):
    """The bake failed at ``step`` (one of STEPS, "" before any); the message says why."""

    def __init__(self, message: str, step: str = "") -> None:
        super().__init__(message)
        self.step = step


@dataclass(frozen=True, slots=True)
class BakeRequest:
    """What to bake: whose, from which base, on which server, with which image."""

    project: str
    pool: str
    image: PoolImage
    base: str = "debian-12"
    server_type: str = "cx22"
    location: str | None = None
    feed_url: str = ""  # ImageFeed.url: the agent archive, and a controller-built image
    feed_token: str = ""
    agent_token: str = ""  # the feed's one-time token for the agent archive

    @property
    def recipe(self) -> Recipe:
        return Recipe(self.base, agent_sha256(), self.image.reference)


@dataclass(frozen=True, slots=True)
class Baked:
    """The pool's snapshot for the recipe, and what the bake did."""

    snapshot: int
    recipe: str
    reused: bool
    image_size: float | None  # GB, what Hetzner bills a month
    deleted: tuple[int, ...] = field(default_factory=tuple)  # older snapshots removed
    monthly_euros: float | None = None  # net, at GET /pricing's price of a GB a month

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "deleted": list(self.deleted)}


def bake(
    api: HetznerAPI, request: BakeRequest, progress: Progress, *,
    timeout: float = BAKE_SECONDS, every: float = POLL_SECONDS,
    reported: Callable[[], str | None] = lambda: None,
) -> Baked:  # fmt: skip
    """Make (or find) the pool's snapshot for its recipe, then prune the older ones;
    ``reported``: the bake server's own report of its failure (``ImageFeed.failed``)."""
    recipe = request.recipe
    progress(f"recipe {recipe.hash}: base {recipe.base}, agent {recipe.agent_sha256[:12]}, "
             f"image {recipe.image}")  # fmt: skip
    with _step("find"):
        found = _available(api, request)
    if found is not None:
        progress(f"snapshot {found.id} holds recipe {recipe.hash}: reused")
    snapshot = found or _make(api, request, progress, timeout, every, reported)
    with _step("prune"):
        deleted = prune(api, request.project, request.pool, snapshot.id, progress)
    monthly = _monthly_euros(api, snapshot, progress)
    return Baked(snapshot.id, recipe.hash, found is not None, snapshot.image_size, deleted, monthly)


@contextlib.contextmanager
def _step(step: str, what: str = "") -> Iterator[None]:
    """A failure of the API in ``step`` as a BakeError of that step (``what``: of what)."""
    try:
        yield
    except BakeError as exc:
        exc.step = exc.step or step
        raise
    except HcloudError as exc:
        raise BakeError(f"{what}{exc}", step) from exc


def _monthly_euros(api: HetznerAPI, snapshot: Image, progress: Progress) -> float | None:
    """What the snapshot costs a month, net: Hetzner bills snapshots per GB and month
    (https://docs.hetzner.com/cloud/general/faq, "What are snapshots and backups?"), at GET
    /pricing's ``image.price_per_gb_month``. None when the size or the price is not known."""
    if snapshot.image_size is None:
        return None
    try:
        price = api.pricing().image_per_gb_month
    except HcloudError as exc:
        progress(f"snapshot {snapshot.id}: no price ({exc})")
        return None
    euros = round(snapshot.image_size * price, 4)
    progress(f"snapshot {snapshot.id}: {snapshot.image_size:.2f} GB at EUR {price} a GB and "
             f"month: EUR {euros:.2f} a month")  # fmt: skip
    return euros


def _available(api: HetznerAPI, request: BakeRequest) -> Image | None:
    selector = request.recipe.selector(request.project, request.pool)
    ready = [i for i in api.images(selector, type="snapshot") if i.status == "available"]
    return ready[0] if ready else None


def _make(
    api: HetznerAPI, request: BakeRequest, progress: Progress, timeout: float, every: float,
    reported: Callable[[], str | None],
) -> Image:  # fmt: skip
    """A bake server made, watched until it powered off, snapshotted and deleted."""
    recipe = request.recipe
    # names are unique per Hetzner project, which several sp00ky projects may share
    name = f"sp00ky-bake-{request.project}-{request.pool}-{recipe.hash[:8]}"[:63]
    progress(f"creating bake server {name} ({request.server_type}, {request.base})")
    with _step("create", f"creating bake server {name}: "):
        server = api.create_server(
            name=name, server_type=request.server_type, image=request.base,
            **({"location": request.location} if request.location else {}),
            user_data=bake_user_data(request),
            labels={labels.POOL: request.pool, labels.ROLE: "bake", labels.RECIPE: recipe.hash},
        )  # fmt: skip
    where = f"baking pool {request.pool} on server {server.id}: "
    try:
        progress(f"server {server.id}: installing Docker and the agent, fetching the image")
        with _step("install", where):
            _wait_off(api, server.id, timeout, every, reported)
        progress(f"server {server.id} powered off: taking its snapshot")
        description = f"sp00ky {request.project}/{request.pool} recipe {recipe.hash}"
        with _step("snapshot", where):
            image, action = api.create_image(
                server.id, description, recipe.labels(request.project, request.pool)
            )
            api.wait_action(action, timeout, every)
    finally:
        progress(f"deleting bake server {server.id}")
        api.delete_server(server.id)
    made = next((i for i in api.images(recipe.selector(request.project, request.pool))
                 if i.id == image.id), image)  # fmt: skip
    progress(f"snapshot {made.id} made ({made.image_size or 0:.2f} GB)")
    return made


def _wait_off(
    api: HetznerAPI, server_id: int, timeout: float, every: float,
    reported: Callable[[], str | None],
) -> None:  # fmt: skip
    deadline = api.clock() + timeout
    while api.get_server(server_id).status != "off":
        if (reason := reported()) is not None:
            raise BakeError(f"bake server {server_id} failed: {reason}")
        if api.clock() > deadline:
            raise BakeError(
                f"bake server {server_id} did not power off within {timeout:.0f}s: its "
                "install or image fetch failed (cloud-init's output log says why)"
            )
        api.sleep(every)


def prune(
    api: HetznerAPI, project: str, pool: str, keep: int, progress: Progress
) -> tuple[int, ...]:
    """Delete the pool's snapshots but ``keep`` and those a server was created from and still
    runs; the ids deleted."""
    in_use = {s.image for s in api.servers()}
    deleted = []
    for image in api.images(pool_selector(project, pool), type="snapshot"):
        if image.id == keep:
            continue
        if image.id in in_use:
            progress(f"snapshot {image.id} (recipe {image.labels.get(labels.RECIPE)}) kept: "
                     "a server still runs it")  # fmt: skip
            continue
        progress(f"deleting snapshot {image.id} (recipe {image.labels.get(labels.RECIPE)})")
        if api.delete_image(image.id):
            deleted.append(image.id)
    return tuple(deleted)


def bake_user_data(request: BakeRequest) -> str:
    """The bake server's ``#cloud-config``: the bake script, where the feed is and what it
    serves, the archive's sha256 to check; BakeError past Hetzner's limit."""
    image: dict[str, Any] = {"source": request.image.source, "reference": request.image.reference}
    if request.image.auth is not None:
        image["auth"] = request.image.auth.as_dict()
    settings = {"image": image, "url": request.feed_url, "token": request.feed_token,
                "agent_token": request.agent_token}  # fmt: skip
    script = shipped_source(cloud_init_file("bake.py").read_bytes(), "bake.py")
    packed = base64.b64encode(gzip.compress(script, 9, mtime=0)).decode()
    files = [
        {"path": "/etc/sp00ky/bake.json", "permissions": "0600",
         "content": json.dumps(settings) + "\n"},
        {"path": "/opt/sp00ky/bake.py", "permissions": "0700", "encoding": "gz+b64",
         "content": packed},
    ]  # fmt: skip
    document = {
        "write_files": files,
        "runcmd": [["python3", "/opt/sp00ky/bake.py", agent_sha256()]],
    }
    text = "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, width=1000)
    if len(text.encode()) > USER_DATA_LIMIT:
        raise BakeError(f"the bake's user-data is {len(text.encode())} bytes, over "
                        f"Hetzner's {USER_DATA_LIMIT}", "create")  # fmt: skip
    return text


class ImageFeed:
    """What a bake server fetches from the host that bakes it, over HTTP for the bake's
    length: the agent archive (``GET /agent``, once: ``agent_token`` is spent by the first
    whole answer) and ``docker save`` of a controller-built image (``GET /images/{id}``,
    ``token`` as bearer), as the controller serves its machines (``ImageServer.stream``);
    and the server's report that its bake failed (``POST /failed``, ``token``), kept in
    ``failed`` for ``bake`` to stop waiting on."""

    def __init__(
        self, host: str, images: ImageServer | None = None, image_id: str = "", port: int = 0,
        dial: str | None = None,
    ) -> None:  # fmt: skip
        """Listen on ``host`` (and ``port``); ``dial``: the address a bake server reaches it
        at, when not ``host`` (a controller listening on every address)."""
        self.images = images
        self.image_id = images.serve(image_id) if images is not None and image_id else ""
        self.token = secrets.token_urlsafe(24)
        self.agent_token: str | None = secrets.token_urlsafe(24)
        self.failed: str | None = None
        self._lock = threading.Lock()
        self.http = ThreadingHTTPServer((host, port), _feed_handler(self))
        self.http.daemon_threads = True
        self.url = f"http://{dial or host}:{self.http.server_port}"

    def for_request(self, request: BakeRequest) -> BakeRequest:
        """``request`` with this feed's address and tokens."""
        assert self.agent_token is not None, "the feed's agent archive was served already"
        return dataclasses.replace(
            request, feed_url=self.url, feed_token=self.token, agent_token=self.agent_token
        )

    def chunks(self, path: str, auth: str) -> Iterator[bytes] | None:
        """The image's stream for an authorised GET of its path; None otherwise."""
        if auth != f"Bearer {self.token}" or self.images is None:
            return None
        if not self.image_id or path != f"/images/{self.image_id}":
            return None
        try:
            return self.images.stream(self.image_id)
        except UnknownImage:
            return None

    def agent(self, auth: str) -> bytes | None:
        """The agent archive for the one GET that brings its token; None otherwise."""
        with self._lock:
            if self.agent_token is None or auth != f"Bearer {self.agent_token}":
                return None
            return agent_archive()

    def agent_sent(self) -> None:
        """The archive went out whole: its token is spent."""
        with self._lock:
            self.agent_token = None

    def report(self, auth: str, body: bytes) -> bool:
        """The bake server's failure, kept; False for a request without the feed's token."""
        if auth != f"Bearer {self.token}":
            return False
        try:
            reason = str(json.loads(body).get("reason", ""))
        except (ValueError, AttributeError):
            reason = body.decode(errors="replace")
        self.failed = reason[:500] or "no reason given"
        return True

    def __enter__(self) -> ImageFeed:
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.http.shutdown()
        self.http.server_close()


def _feed_handler(feed: ImageFeed) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            if self.path == "/agent":
                archive = feed.agent(auth)
                if archive is None:
                    self.send_error(404)
                    return
                self._answer(200, "application/x-bzip2", [archive])
                feed.agent_sent()
                return
            chunks = feed.chunks(self.path, auth)
            if chunks is None:
                self.send_error(404)
                return
            self._answer(200, "application/x-tar", chunks)

        def do_POST(self) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), 4096)
            body = self.rfile.read(length)
            known = self.path == "/failed"
            if not (known and feed.report(self.headers.get("Authorization", ""), body)):
                self.send_error(404)
                return
            self._answer(204, "text/plain", [])

        def _answer(self, status: int, kind: str, chunks: Iterable[bytes]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)

    return Handler
