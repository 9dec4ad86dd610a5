"""A pool's firewall on Hetzner Cloud, as a Pulumi dynamic-provider resource.

Built like the machine (machine.py): the provider is serialized into the stack and run by the
engine's provider host in another process, so it keeps no client: each method builds one from
HCLOUD_TOKEN and HCLOUD_ENDPOINT at run time (the token is never stored in state). Being
dynamic, it needs no provider plugin, so ``pulumi up`` runs with
PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true (the TF-bridged pulumi-hcloud cannot be had).

create makes the firewall with its name, labels and no rules at all: Hetzner then drops every
inbound packet and lets all outbound traffic go (API reference, "Firewalls": no ``in`` rule
means DROP, no ``out`` rule means ACCEPT). The machines only dial out, so nothing needs in. It
never makes the firewall twice: after an unknown outcome the client looks it up by name.

read finds it by id; "not found" means it is gone, so ``pulumi refresh`` drops it from the
state. A change of labels or name is an in-place update (PUT /firewalls/{id}), never a
replacement: the servers refer to the firewall by id.

delete treats "not found" as done. A firewall cannot be deleted while it is applied to a server
(``resource_in_use``); when the stack goes, the servers are deleted first in the same update,
but a server's deletion runs on after its DELETE is answered and the firewall stays applied to
it until it is done, so delete waits that out, ``IN_USE_TRIES`` times, then fails saying so.
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

from sp00ky_infra.hetzner import Firewall, HcloudError, HetznerAPI
from sp00ky_infra.hetzner.client import RESOURCE_IN_USE
from sp00ky_infra.hetzner.errors import NOT_FOUND
from sp00ky_infra.infra.errors import InfraError

# Tries of a delete that finds the firewall still applied to a server being deleted: with the
# client's backoff (1, 2, 4, 8, 16, 30 s) about a minute in all. A server's delete_server
# action usually takes seconds; the machine provider returns once the DELETE is answered.
IN_USE_TRIES = 7


class FirewallError(InfraError):
    """The firewall could not be deleted: it is still applied to servers."""


def delete_firewall(api: HetznerAPI, firewall_id: str, name: str) -> bool:
    """Delete the firewall, waiting out ``resource_in_use`` as many times as ``api`` is told
    (``busy_tries``); False when it was already gone."""
    try:
        return api.delete_firewall(firewall_id)
    except HcloudError as exc:
        if exc.code != RESOURCE_IN_USE:
            raise
        raise FirewallError(
            f"firewall {name} ({firewall_id}) is still applied to servers after "
            f"{api.busy_tries} tries ({exc}); servers deleted in this update may still be "
            "shutting down: run the update again, and if it persists, see which servers it "
            "is applied to in the Hetzner console (Firewalls) and remove it from them"
        ) from exc


def _outs(props: dict[str, Any], firewall: Firewall) -> dict[str, Any]:
    """The state: what was asked, with the firewall's id, name and labels as it has them."""
    return {
        **props,
        "name": firewall.name,
        "labels": dict(firewall.labels),
        "firewall_id": firewall.id,
    }


class HetznerFirewallProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        firewall = HetznerAPI.from_env().create_firewall(props["name"], props.get("labels") or {})
        outs = _outs(props, firewall)
        return CreateResult(id_=str(firewall.id), outs=outs)

    def read(self, id: str, props: dict[str, Any]) -> ReadResult:
        """What the firewall is now (its name and labels, as changed by hand or not); gone
        when the API does not know it."""
        try:
            firewall = HetznerAPI.from_env().get_firewall(id)
        except HcloudError as exc:
            if exc.code == NOT_FOUND:
                return ReadResult(id_="", outs={})
            raise
        outs = _outs(props, firewall)
        return ReadResult(id_=str(firewall.id), outs=outs)

    def diff(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """Never a replacement: a new name or new labels are changed in place by ``update``."""
        changed = [
            key for key in ("name", "labels") if (olds.get(key) or None) != (news.get(key) or None)
        ]
        return DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def update(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Put the new name and labels on the same firewall (the API replaces the whole set
        of labels)."""
        name = news["name"] if news["name"] != olds.get("name") else None
        labels = dict(news.get("labels") or {})
        firewall = HetznerAPI.from_env().update_firewall(id, name=name, labels=labels)
        return UpdateResult(outs=_outs(olds, firewall))

    def delete(self, id: str, props: dict[str, Any]) -> None:
        api = HetznerAPI.from_env(busy_tries=IN_USE_TRIES)
        delete_firewall(api, id, props.get("name") or id)


class HetznerFirewall(Resource):
    """A pool's firewall: a Hetzner firewall with no rules (no inbound, all outbound), its
    name and labels. Its ``id`` is the firewall's id, which the pool's servers are given."""

    firewall_id: pulumi.Output[int]

    def __init__(
        self,
        resource_name: str,
        *,
        name: str,
        labels: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(
            HetznerFirewallProvider(),
            resource_name,
            {"name": name, "labels": labels, "firewall_id": None},
            opts,
        )
