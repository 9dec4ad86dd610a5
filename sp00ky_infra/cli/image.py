"""``sp00ky-infra image bake POOL``: the pool's snapshot with Docker, the pinned agent and the
backend's image on its disk, against HCLOUD_TOKEN's API (HCLOUD_ENDPOINT for another one).
How the bake goes is ``controller/bake.py``; progress lines go to stderr, the result to stdout
(``--json`` for a program). After it, the project's snapshots are listed again into the
project's store (``controller/pricing.py``), so that ``pools get`` and /metrics show what the
pool's snapshots cost now rather than at the leader's next daily reading.

The bake server fetches the agent archive from ``--serve-on HOST``, an address of this host
the server reaches (run the bake where the controller runs, for one). The backend's image is
settled as the controller settles it: a ``deploy.image`` resolved to its digest (the bake
server pulls it from its registry), or a ``deploy.dockerfile`` built on this host's Docker
engine and served to the bake server from the same address.
"""

from __future__ import annotations

import json
import sys
import time

import click

from sp00ky_infra.cli.jobs import EXIT_REFUSED, config_option, json_option, refusals
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.bake import BakeError, BakeRequest, ImageFeed, bake
from sp00ky_infra.controller.images import ImagesError
from sp00ky_infra.controller.pricing import refresh_snapshots
from sp00ky_infra.controller.server import settle
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.errors import HcloudError
from sp00ky_infra.store import StoreError, open_store


@click.group()
def image() -> None:
    """A pool's machine image: a baked Hetzner snapshot."""


@image.command("bake")
@click.argument("pool")
@config_option
@click.option("--project", envvar="SPKY_PROJECT", default="dev", show_default=True,
              help="The project whose snapshot it is (its label).")  # fmt: skip
@click.option("--base", default="debian-12", show_default=True,
              help="The Hetzner image the snapshot starts from.")  # fmt: skip
@click.option("--serve-on", "serve_on", default="",
              help="An address of this host the bake server reaches, to serve it the agent "
                   "and a dockerfile-built image from.")  # fmt: skip
@click.option("--timeout", default=1800.0, show_default=True,
              help="Seconds the bake server may take to install and fetch.")  # fmt: skip
@json_option
def bake_command(
    pool: str, config_file: str | None, project: str, base: str, serve_on: str, timeout: float,
    as_json: bool,
) -> None:  # fmt: skip
    """Bake POOL's snapshot, or reuse the one with the same recipe; delete older ones no
    server runs any more."""
    with refusals():
        config = load_config(config_file or None)
    if pool not in config.pools:
        click.echo(f"error: no pool {pool!r} in sp00ky.yml ({', '.join(config.pools)})", err=True)
        sys.exit(EXIT_REFUSED)
    shape = config.pools[pool].machine
    settings = ControllerSettings.from_env(
        config_path=config_file or None, pool_images=True, project=project
    )
    try:
        api = HetznerAPI.from_env()
        images, server = settle(settings, config)
        source = images[pool]
        if not serve_on:
            raise BakeError(
                f"the bake server of pool {pool} fetches the agent from this host: pass "
                "--serve-on HOST, an address of this host the bake server reaches"
            )
        built = source.source == "controller"
        request = BakeRequest(project, pool, source, base, shape.type,
                              (shape.locations or (None,))[0])  # fmt: skip
        with ImageFeed(serve_on, server, source.reference if built else "") as feed:
            baked = bake(api, feed.for_request(request), _progress, timeout=timeout,
                         reported=lambda: feed.failed)  # fmt: skip
    except (BakeError, ImagesError, HcloudError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    _list_snapshots(settings, api, project)
    if as_json:
        click.echo(json.dumps(baked.to_json()))
    else:
        how = "reused" if baked.reused else "baked"
        click.echo(f"pool {pool}: snapshot {baked.snapshot} ({how}, recipe {baked.recipe})")


def _list_snapshots(settings: ControllerSettings, api: HetznerAPI, project: str) -> None:
    """The project's snapshots listed into its store; a failure only warns (the bake is
    done, and the leader's next reading lists them)."""
    try:
        store = open_store(settings.store_url)
        try:
            found = refresh_snapshots(store, api, project, time.time())
        finally:
            store.close()
    except (StoreError, HcloudError, ValueError) as exc:
        click.echo(f"warning: the project's snapshots were not listed into the store: {exc}",
                   err=True)  # fmt: skip
        return
    click.echo(f"project {project}: {len(found.snapshots)} snapshot(s) listed into the store",
               err=True)  # fmt: skip


def _progress(line: str) -> None:
    click.echo(line, err=True)
