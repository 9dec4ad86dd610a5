"""The image paths a rehearsal can take (``phases.PATHS``): the config a path runs, with
``machine.image`` set for every Hetzner pool, and the bake that makes the baked path's
snapshot in the fake cloud before the burst.

A path's config is the user's with that one change, written beside it under a hidden name
(so its relative paths, a spec, a dockerfile, an env file, resolve from the same folder) and
removed once the path has run.

The baked path bakes as ``sp00ky-infra image bake POOL`` does (``controller/bake.py``): the
backend's image settled as the controller settles it, a bake server booted in the fake cloud,
its disk committed as the snapshot; the pool's ``machine.image`` is then the recipe's label
selector. The bake is timed on its own, outside any machine's create-to-ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import yaml

from sp00ky_infra.config import Config
from sp00ky_infra.controller.bake import BakeError, BakeRequest, ImageFeed, bake
from sp00ky_infra.controller.images import ImagesError, ImageServer, PoolImage
from sp00ky_infra.controller.server import settle
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.errors import HcloudError
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.rehearse.errors import RehearseError

BAKE_BASE = "debian-12"  # what `image bake` starts from unless told otherwise
BAKE_POLL_SECONDS = 1.0  # the fake cloud's bake server powers off in seconds, not minutes
Progress = Callable[[str], None]


def path_config(source: Path, images: Mapping[str, str]) -> Path:
    """A copy of the config at ``source``, beside it, whose pools boot ``images`` (pool ->
    machine.image)."""
    doc = yaml.safe_load(source.read_text())
    for pool, image in images.items():
        settings = doc["pools"][pool]
        settings["machine"] = {**(settings.get("machine") or {}), "image": image}
    target = source.with_name(f".{source.stem}.rehearse-{secrets.token_hex(3)}{source.suffix}")
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


@dataclasses.dataclass(frozen=True, slots=True)
class Baked:
    """Each pool's snapshot, as the ``machine.image`` that finds it, and how long it took."""

    images: dict[str, str]
    seconds: float


def bake_pools(
    config: Config, pools: Sequence[str], cloud: FakeHetzner, project: str, say: Progress
) -> Baked:
    """Bake each pool's snapshot in ``cloud``, the images settled once for all of them."""
    assert cloud.boot is not None
    started = time.monotonic()
    try:
        images, server = settle(ControllerSettings(pool_images=True, project=project), config)
    except ImagesError as exc:
        raise RehearseError(f"the bake could not settle the backend's image: {exc}") from exc
    try:
        api = HetznerAPI(TOKEN, cloud.url)
        selectors = {
            pool: _bake(api, config, pool, images[pool], server, project, cloud.boot.gateway, say)
            for pool in pools
        }
    finally:
        if server is not None:
            server.close()
    return Baked(selectors, round(time.monotonic() - started, 1))


def _bake(
    api: HetznerAPI, config: Config, pool: str, image: PoolImage, server: ImageServer | None,
    project: str, gateway: str, say: Progress,
) -> str:  # fmt: skip
    """One pool's snapshot baked; the label selector of its recipe."""
    shape = config.pools[pool].machine
    request = BakeRequest(project, pool, image, BAKE_BASE, shape.type,
                          (shape.locations or (None,))[0])  # fmt: skip
    try:
        with contextlib.ExitStack() as stack:
            if image.source == "controller":  # built here: served to the bake server
                if server is None:
                    raise BakeError(f"pool {pool}'s image is built here, but no engine serves it")
                feed = stack.enter_context(ImageFeed(server, image.reference, gateway))
                request = dataclasses.replace(request, feed_url=feed.url, feed_token=feed.token)
            bake(api, request, lambda line: say(f"bake {pool}: {line}"), every=BAKE_POLL_SECONDS)
    except (BakeError, HcloudError) as exc:
        raise RehearseError(f"the bake of pool {pool} failed: {exc}") from exc
    return request.recipe.selector(project, pool)
