"""A pool machine on Hetzner Cloud, as a Pulumi dynamic-provider resource.

The provider is serialized into the stack and run by the engine's provider host in another
process, so it keeps no client: each method builds one from HCLOUD_TOKEN and HCLOUD_ENDPOINT
at run time (the token is never stored in state). It lives in an importable module, so the
serialized provider refers to it by name and the host imports it from the project's venv.

create tries ``locations`` in order for ``server_type``, then each fallback type, moving on
only when the API says that location or type is unavailable; it returns once the server
exists. delete treats "not found" as done. A changed ``sp00ky/revision`` label replaces.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from sp00ky_infra.hetzner import UNAVAILABLE, HcloudError, HetznerAPI, Server
from sp00ky_infra.hetzner.errors import NOT_FOUND
from sp00ky_infra.infra.errors import InfraError
from sp00ky_infra.shared import labels

REVISION_LABEL = labels.REVISION
DEFAULT_IMAGE = "debian-12"


class MachineError(InfraError):
    """No location or server type could take the machine, or the API refused it."""


def create_server(api: HetznerAPI, props: dict[str, Any]) -> tuple[Server, list[str]]:
    """Create the server, falling back through locations and server types in order.

    Returns the server and the attempts that were unavailable before it.
    """
    types = [props["server_type"], *props.get("fallback_types", [])]
    locations: list[str | None] = list(props.get("locations") or []) or [None]
    skipped: list[str] = []
    for server_type in types:
        for location in locations:
            body: dict[str, Any] = {
                "name": props["name"],
                "server_type": server_type,
                "image": props.get("image") or DEFAULT_IMAGE,
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
                if exc.code not in UNAVAILABLE:
                    raise MachineError(
                        f"creating server {props['name']} ({server_type} in "
                        f"{location or 'any location'}) failed: {exc}"
                    ) from exc
                skipped.append(f"{server_type}@{location or 'any'}: {exc.code}")
    raise MachineError(
        f"no location or server type could take server {props['name']}; tried " + ", ".join(skipped)
    )


class HetznerMachineProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        api = HetznerAPI.from_env()
        server, skipped = create_server(api, props)
        outs = {
            **props,
            "server_id": server.id,
            "location": server.location,
            "created_type": server.server_type,
            "skipped": skipped,
        }
        return CreateResult(id_=str(server.id), outs=outs)

    def delete(self, id: str, props: dict[str, Any]) -> None:
        HetznerAPI.from_env().delete_server(id)

    def diff(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """Only what the machine runs (its revision) or its name replaces it. A fresh join
        token, new locations or types in the pool matter to new machines, not to this one."""
        replaces = []
        if (olds.get("labels") or {}).get(REVISION_LABEL) != (news.get("labels") or {}).get(
            REVISION_LABEL
        ):
            replaces.append("labels")
        if olds.get("name") != news.get("name"):
            replaces.append("name")
        return DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)

    def read(self, id: str, props: dict[str, Any]) -> ReadResult:
        try:
            server = HetznerAPI.from_env().get_server(id)
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
                "skipped": None,
            },
            opts,
        )
