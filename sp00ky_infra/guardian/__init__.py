"""The guardian: a run-once cron against the Hetzner API that trusts nobody.

It needs only HCLOUD_TOKEN (and HCLOUD_ENDPOINT). It lists servers by label, reads each
project's scheduler heartbeat (a label with a unix time on a small firewall the stacks do not
manage), asks the pure verdicts what to destroy, and destroys it, logging each with its
reason. A pass that could not list everything destroys nothing.

GuardianError (root)
└── Incomplete   the listing failed part-way: nothing was destroyed
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sp00ky_infra.infra.hetzner import HcloudError, HetznerAPI
from sp00ky_infra.policy.guardian import Machine, Verdict, Why, verdicts

log = logging.getLogger("sp00ky.guardian")
HEARTBEAT_LABEL = "sp00ky/heartbeat"
PROJECT_LABEL = "sp00ky/project"


class GuardianError(Exception):
    pass


class Incomplete(GuardianError):
    """The servers or heartbeats could not all be listed; nothing was destroyed."""


@dataclass
class PassReport:
    dry_run: bool
    servers: int = 0
    verdicts: list[Verdict] = field(default_factory=list)
    destroyed: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "servers": self.servers,
            "plan": [
                {
                    "id": v.machine.id,
                    "name": v.machine.name,
                    "project": v.machine.project,
                    "pool": v.machine.pool,
                    "reason": v.why.value,
                    "detail": v.detail,
                }
                for v in self.verdicts
            ],
            "destroyed": self.destroyed,
            "failed": [{"id": i, "error": e} for i, e in self.failed],
        }


def _created(server: dict[str, Any]) -> float:
    return datetime.fromisoformat(server["created"].replace("Z", "+00:00")).timestamp()


def _machine(server: dict[str, Any]) -> Machine:
    labels = server.get("labels") or {}
    try:
        limit: int | None = int(labels.get("sp00ky/limit", ""))
    except ValueError:
        limit = None
    return Machine(
        id=int(server["id"]),
        name=server["name"],
        project=labels[PROJECT_LABEL],
        pool=labels.get("sp00ky/pool", ""),
        created=_created(server),
        limit=limit,
    )


def heartbeat_name(project: str) -> str:
    return f"sp00ky-heartbeat-{project}"


def heartbeats(api: HetznerAPI) -> dict[str, float]:
    """Each project's last heartbeat (unix time) from its heartbeat firewall's label."""
    found: dict[str, float] = {}
    for firewall in api.firewalls(label_selector=HEARTBEAT_LABEL):
        labels = firewall.get("labels") or {}
        try:
            found[labels[PROJECT_LABEL]] = float(labels[HEARTBEAT_LABEL])
        except (KeyError, ValueError):
            log.warning("firewall %s has a malformed heartbeat label", firewall.get("name"))
    return found


def stamp_heartbeat(api: HetznerAPI, project: str, now: float) -> None:
    """The scheduler's side: stamp ``now`` on the project's heartbeat firewall (made once)."""
    labels = {PROJECT_LABEL: project, HEARTBEAT_LABEL: str(int(now)), "sp00ky/role": "heartbeat"}
    existing = api.firewalls(label_selector=f"{PROJECT_LABEL}={project},{HEARTBEAT_LABEL}")
    if existing:
        api.request("PUT", f"/firewalls/{existing[0]['id']}", json={"labels": labels})
    else:
        api.request(
            "POST",
            "/firewalls",
            json={"name": heartbeat_name(project), "labels": labels, "rules": []},
        )


def listing(
    api: HetznerAPI, selector: str = PROJECT_LABEL
) -> tuple[list[Machine], dict[str, float]]:
    try:
        servers = api.servers(label_selector=selector)
        beats = heartbeats(api)
    except HcloudError as exc:
        raise Incomplete(
            f"could not list every server and heartbeat ({exc}); destroyed nothing"
        ) from exc
    return [_machine(s) for s in servers if (s.get("labels") or {}).get(PROJECT_LABEL)], beats


def run_pass(api: HetznerAPI, now: float, dry_run: bool = False) -> PassReport:
    """One guardian pass. Idempotent: a second pass finds nothing more to do."""
    machines, beats = listing(api)
    report = PassReport(
        dry_run=dry_run, servers=len(machines), verdicts=verdicts(machines, beats, now)
    )
    if not dry_run:
        _destroy(api, report)
    return report


def _destroy(api: HetznerAPI, report: PassReport) -> None:
    for verdict in report.verdicts:
        machine = verdict.machine
        try:
            api.delete_server(machine.id)
        except HcloudError as exc:
            log.error("server=%s name=%s destroy failed: %s", machine.id, machine.name, exc)
            report.failed.append((machine.id, str(exc)))
            continue
        where = f"{machine.project}/{machine.pool}"
        log.warning(
            "destroyed server=%s name=%s pool=%s reason=%s (%s)",
            machine.id, machine.name, where, verdict.why.value, verdict.detail,
        )  # fmt: skip
        report.destroyed.append(machine.id)


def destroy_project(api: HetznerAPI, project: str, dry_run: bool = False) -> PassReport:
    """Destroy a project's machines first, then its firewalls (heartbeat included)."""
    machines, _ = listing(api, f"{PROJECT_LABEL}={project}")
    report = PassReport(
        dry_run=dry_run,
        servers=len(machines),
        verdicts=[
            Verdict(m, Why.PROJECT_DESTROYED, f"project {project} destroyed") for m in machines
        ],
    )
    if dry_run:
        return report
    _destroy(api, report)
    if report.failed:
        return report  # firewalls still guard machines that are left: keep them
    for firewall in api.firewalls(label_selector=f"{PROJECT_LABEL}={project}"):
        try:
            api.request("DELETE", f"/firewalls/{firewall['id']}")
            log.warning(
                "destroyed firewall=%s name=%s project=%s",
                firewall["id"],
                firewall["name"],
                project,
            )
        except HcloudError as exc:
            if exc.code != "not_found":
                report.failed.append((int(firewall["id"]), str(exc)))
    return report


def iter_plan_lines(report: PassReport) -> Iterator[str]:
    verb = "would destroy" if report.dry_run else "destroy"
    for verdict in report.verdicts:
        machine = verdict.machine
        yield (
            f"{verb} server {machine.id} {machine.name} ({machine.project}/{machine.pool}): "
            f"{verdict.why.value}: {verdict.detail}"
        )
