"""The scheduler's heartbeat on the Hetzner API: stamped by the controller every minute,
read by the guardian. The format is ``sp00ky_infra.shared.heartbeat``'s.

A ``Stamper`` makes each stamp one request: it keeps the heartbeat firewall's id from its
first stamp (one listing) and looks it up again only when the API no longer knows it."""

from __future__ import annotations

import logging

from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.errors import NOT_FOUND, HcloudError
from sp00ky_infra.shared import heartbeat, labels
from sp00ky_infra.shared.names import heartbeat_name

log = logging.getLogger("sp00ky.hetzner")


def heartbeats(api: HetznerAPI) -> dict[str, float]:
    """Each project's last heartbeat (unix time) from its heartbeat firewall's label."""
    found: dict[str, float] = {}
    for firewall in api.firewalls(label_selector=labels.HEARTBEAT):
        try:
            project, at = heartbeat.read_stamp(firewall.labels)
        except (KeyError, ValueError):
            log.warning("firewall %s has a malformed heartbeat label", firewall.name)
            continue
        found[project] = at
    return found


def stamp_heartbeat(api: HetznerAPI, project: str, now: float) -> int:
    """Stamp ``now`` on the project's heartbeat firewall (made on the first stamp); its id."""
    stamp = heartbeat.stamp_labels(project, now)
    existing = api.firewalls(
        label_selector=labels.selector({labels.PROJECT: project, labels.HEARTBEAT: None})
    )
    if existing:
        api.request("PUT", f"/firewalls/{existing[0].id}", json={"labels": stamp})
        return existing[0].id
    made = api.request(
        "POST", "/firewalls", json={"name": heartbeat_name(project), "labels": stamp, "rules": []}
    )
    return int(made["firewall"]["id"])


class Stamper:
    """One controller's stamps: the firewall's id kept per (endpoint, project)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str], int] = {}

    def stamp(self, api: HetznerAPI, project: str, now: float) -> None:
        key = (api.endpoint, project)
        known = self.ids.get(key)
        if known is not None:
            stamp = heartbeat.stamp_labels(project, now)
            try:
                api.request("PUT", f"/firewalls/{known}", json={"labels": stamp})
                return
            except HcloudError as exc:
                if exc.code != NOT_FOUND:
                    raise
        self.ids[key] = stamp_heartbeat(api, project, now)  # first, or deleted by hand
