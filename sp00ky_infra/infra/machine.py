"""A pool machine on Hetzner Cloud, as a Pulumi dynamic-provider resource.

The provider is serialized into the stack and run by the engine's provider host in another
process, so it keeps no client: each method builds one from HCLOUD_TOKEN and HCLOUD_ENDPOINT
at run time (the token is never stored in state). It lives in an importable module, so the
serialized provider refers to it by name and the host imports it from the project's venv.

create tries ``locations`` in order for ``server_type``, then each fallback type, moving on
only when the API says that location or type cannot take the server (``resource_unavailable``,
``placement_error``, or ``invalid_input`` "unsupported location for server type"); a quota
refusal (``resource_limit_exceeded``) is not tried elsewhere. It returns once the server
exists, and never makes it twice (the client looks it up by name after an unknown outcome).
A server of that name already there that carries this project's and this machine's labels is
the machine's own, made by an update that was killed before it could record it: it is taken
as created, not refused as a duplicate.
delete treats "not found" as done and waits out ``locked``/``conflict``. read (``pulumi
refresh``) finds the server in one listing of the project's machines, kept for the update.

The image (``machine.image``, config/machine_images.py) is resolved once per create: a name
goes to POST /servers as written, a snapshot id as a number (the API takes either: hcloud-go
``schema.IDOrName``), and a label selector becomes the id of the newest available snapshot
that matches it, found as the Kubernetes cluster-autoscaler's Hetzner provider finds one
(GET /images?type=snapshot&status=available&label_selector=...&sort=created:desc, with the
architecture of the pool's x86 server types), once for all the creates of an update
(``hetzner/listing.py``); none matching is a MachineError naming the selector. The image
the server was made from is in its outputs (``created_image``).

The provider never replaces a server: a deploy is new machines under new names, made and
drained by the controller (the labels of shared/labels.py). A change of labels is an in-place
update (PUT /servers/{id}), except that a server keeps its own ``sp00ky/revision``: it runs
what it was made with until it is destroyed. Every other change (user-data with a fresh join
token, server type, locations, fallback types, image, firewalls) matters to new machines only:
no replacement, no API call.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

from sp00ky_infra.config.machine_images import image_kind
from sp00ky_infra.config.model import DEFAULT_MACHINE_IMAGE
from sp00ky_infra.hetzner import HcloudError, HetznerAPI, Server
from sp00ky_infra.hetzner.errors import INVALID_INPUT, NOT_FOUND, UNIQUENESS_ERROR
from sp00ky_infra.hetzner.listing import Kept, Listings
from sp00ky_infra.infra.errors import InfraError
from sp00ky_infra.shared import labels

REVISION_LABEL = labels.REVISION
DEFAULT_IMAGE = DEFAULT_MACHINE_IMAGE
ARCHITECTURE = "x86"  # lint admits x86 server types only (rule SP131)
# Tries of a delete that finds the server locked (an action runs on it) or changing: with the
# client's backoff (1, 2, 4, 8 s) about 15 s in all.
BUSY_TRIES = 5
_LISTINGS = Listings()  # this provider host's: kept for one update's reads
_NEWEST: Kept[int] = Kept()  # a selector's newest snapshot, kept for one update's creates


class MachineError(InfraError):
    """No location or server type could take the machine, or the API refused it."""


def resolve_image(api: HetznerAPI, image: str) -> int | str:
    """What POST /servers is given for ``image``: a name as is, an id as a number, and for a
    label selector the id of the newest available snapshot matching it."""
    kind = image_kind(image)
    if kind == "id":
        return int(image)
    if kind != "selector":
        return image
    return _NEWEST.get((api.endpoint, image), lambda: _newest_snapshot(api, image))


def _newest_snapshot(api: HetznerAPI, selector: str) -> int:
    params = {"type": "snapshot", "status": "available", "label_selector": selector,
              "sort": "created:desc", "architecture": ARCHITECTURE}  # fmt: skip
    newest = next(api.paginate("/images", "images", **params), None)
    if newest is None:  # raised, so not kept: a snapshot made meanwhile is found next time
        raise MachineError(
            f"no available {ARCHITECTURE} snapshot matches the label selector {selector!r} "
            "(machine.image); make one with those labels, or name an image instead"
        )
    return int(newest["id"])


def create_server(api: HetznerAPI, props: dict[str, Any]) -> tuple[Server, list[str]]:
    """Create the server, falling back through locations and server types in order.

    Returns the server and the attempts that were unavailable before it.
    """
    image = resolve_image(api, str(props.get("image") or DEFAULT_IMAGE))
    types = [props["server_type"], *props.get("fallback_types", [])]
    locations: list[str | None] = list(props.get("locations") or []) or [None]
    skipped: list[str] = []
    for server_type in types:
        for location in locations:
            body: dict[str, Any] = {
                "name": props["name"],
                "server_type": server_type,
                "image": image,
                "labels": props.get("labels", {}),
                "user_data": props["user_data"],
                "firewalls": [{"firewall": int(f)} for f in props.get("firewall_ids", [])],
                "start_after_create": True,
            }
            if location:
                body["location"] = location
            try:
                return api.create_server(**body), skipped
            except HcloudError as exc:
                left = _left_behind(api, props) if exc.code == UNIQUENESS_ERROR else None
                if left is not None:
                    return left, skipped
                if not exc.unavailable_here:
                    raise MachineError(
                        f"creating server {props['name']} ({server_type} in "
                        f"{location or 'any location'}) failed: {exc}"
                    ) from exc
                why = f"{exc.code} ({exc.message})" if exc.code == INVALID_INPUT else exc.code
                skipped.append(f"{server_type}@{location or 'any'}: {why}")
    raise MachineError(
        f"no location or server type could take server {props['name']}; tried " + ", ".join(skipped)
    )


def _left_behind(api: HetznerAPI, props: dict[str, Any]) -> Server | None:
    """The server of the machine's name when it is this machine's (its project and machine
    labels say so): one an earlier, killed update made. Another's keeps the refusal."""
    found = api.server_named(props["name"])
    wanted = props.get("labels") or {}
    mine = (labels.PROJECT, labels.MACHINE)
    if found is None or any(found.labels.get(k) != wanted.get(k) for k in mine):
        return None
    return found


def kept_labels(olds: dict[str, Any], news: dict[str, Any]) -> dict[str, str]:
    """The labels an existing server should carry: the new ones, with its own revision."""
    wanted = dict(news.get("labels") or {})
    old = olds.get("labels") or {}
    if REVISION_LABEL in old:
        wanted[REVISION_LABEL] = old[REVISION_LABEL]
    return wanted


class HetznerMachineProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        api = HetznerAPI.from_env()
        image = resolve_image(api, str(props.get("image") or DEFAULT_IMAGE))
        server, skipped = create_server(api, {**props, "image": image})
        outs = {
            **props,
            "server_id": server.id,
            "location": server.location,
            "created_type": server.server_type,
            "created_image": image,
            "skipped": skipped,
        }
        return CreateResult(id_=str(server.id), outs=outs)

    def delete(self, id: str, props: dict[str, Any]) -> None:
        HetznerAPI.from_env(busy_tries=BUSY_TRIES).delete_server(id)

    def diff(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """Never a replacement: only a change of labels (other than the revision) is a
        change, made in place by ``update``."""
        changed = kept_labels(olds, news) != dict(olds.get("labels") or {})
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def update(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Put the new labels on the server, keeping its own revision; the outputs stay
        what the server is (its type, user-data, ...), with the labels it now carries."""
        wanted = kept_labels(olds, news)
        if wanted != dict(olds.get("labels") or {}):
            HetznerAPI.from_env().update_server_labels(id, wanted)
        return UpdateResult(outs={**olds, "labels": wanted})

    def read(self, id: str, props: dict[str, Any]) -> ReadResult:
        """The server as its project's listing has it (one listing answers a refresh's
        reads: ``hetzner/listing.py``), else read by id; gone when the API does not know it."""
        api = HetznerAPI.from_env()
        project = (props.get("labels") or {}).get(labels.PROJECT)
        mine = labels.selector({labels.PROJECT: project, labels.MACHINE: None})
        server = _LISTINGS.server(api, mine, id) if project else None
        try:
            server = server or api.get_server(id)
        except HcloudError as exc:
            if exc.code == NOT_FOUND:
                return ReadResult(id_="", outs={})
            raise
        return ReadResult(id_=str(server.id), outs={**props, "server_id": server.id})


class HetznerMachine(Resource):
    """One pool machine: a Hetzner server with its firewall, labels and user-data."""

    server_id: pulumi.Output[int]

    def __init__(
        self,
        resource_name: str,
        *,
        name: str,
        server_type: str,
        fallback_types: list[str],
        locations: list[str],
        labels: dict[str, str],
        user_data: pulumi.Input[str],
        firewall_ids: list[pulumi.Input[str]],
        image: str = DEFAULT_IMAGE,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(
            HetznerMachineProvider(),
            resource_name,
            {
                "name": name,
                "server_type": server_type,
                "fallback_types": fallback_types,
                "locations": locations,
                "labels": labels,
                "user_data": pulumi.Output.secret(user_data),
                "firewall_ids": firewall_ids,
                "image": image,
                "server_id": None,
                "location": None,
                "created_type": None,
                "created_image": None,
                "skipped": None,
            },
            opts,
        )
