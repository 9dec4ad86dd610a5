"""The guardian: a run-once cron against the Hetzner API that trusts nobody.

It needs only HCLOUD_TOKEN (and HCLOUD_ENDPOINT). It lists servers by label, reads each
project's scheduler heartbeat (a label with a unix time on a small firewall the stacks do not
manage), asks the pure verdicts what to destroy, and destroys it, logging each with its
reason. A pass that could not list everything destroys nothing (``Incomplete``).

A pass costs two listings (servers, heartbeat firewalls; one request per 50 of each) and one
DELETE per machine it destroys. It never waits for the API budget: the controller keeps a
reserve of it (``hetzner/budget.py``) so that the guardian can always delete. Each pass says
what it spent and what the API said was left.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from sp00ky_infra.guardian.errors import Incomplete
from sp00ky_infra.hetzner import HcloudError, HetznerAPI, Server
from sp00ky_infra.hetzner.heartbeat import heartbeats
from sp00ky_infra.policy.guardian import Machine, Verdict, Why, verdicts
from sp00ky_infra.shared import labels

log = logging.getLogger("sp00ky.guardian")


@dataclass
class PassReport:
    dry_run: bool
    servers: int = 0
    verdicts: list[Verdict] = field(default_factory=list)
    destroyed: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    requests: int = 0  # sent by this pass
    remaining: int | None = None  # of the project's hourly budget, after the pass
    limit: int | None = None

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
            "api": {"requests": self.requests, "remaining": self.remaining, "limit": self.limit},
        }


def _machine(server: Server) -> Machine:
    try:
        limit: int | None = int(server.labels.get(labels.LIMIT, ""))
    except ValueError:
        limit = None
    return Machine(
        id=server.id,
        name=server.name,
        project=server.labels[labels.PROJECT],
        pool=server.labels.get(labels.POOL, ""),
        created=server.created,
        limit=limit,
    )


def listing(
    api: HetznerAPI, selector: str = labels.PROJECT
) -> tuple[list[Machine], dict[str, float]]:
    try:
        servers = api.servers(label_selector=selector)
        beats = heartbeats(api)
    except HcloudError as exc:
        raise Incomplete(
            f"could not list every server and heartbeat ({exc}); destroyed nothing"
        ) from exc
    return [_machine(s) for s in servers if s.labels.get(labels.PROJECT)], beats


class Progress(Protocol):
    """Told how a pass goes (a bar on a terminal): the servers seen once
    listed, then each destroy as it ends."""

    def listed(self, servers: int, to_destroy: int) -> None: ...
    def destroyed(self, server: int) -> None: ...


class _Quiet:
    def listed(self, servers: int, to_destroy: int) -> None:
        return None

    def destroyed(self, server: int) -> None:
        return None


def run_pass(
    api: HetznerAPI, now: float, dry_run: bool = False, progress: Progress | None = None
) -> PassReport:
    """One guardian pass. Idempotent: a second pass finds nothing more to do."""
    told = progress or _Quiet()
    before = api.sent.total()
    machines, beats = listing(api)
    report = PassReport(
        dry_run=dry_run, servers=len(machines), verdicts=verdicts(machines, beats, now)
    )
    told.listed(len(machines), 0 if dry_run else len(report.verdicts))
    if not dry_run:
        _destroy(api, report, told)
    return _spent(api, report, before)


def _spent(api: HetznerAPI, report: PassReport, before: int) -> PassReport:
    """The pass's requests and the budget its last answer told, on the report and logged."""
    report.requests = api.sent.total() - before
    if api.rate_limit is not None:
        report.remaining, report.limit = api.rate_limit.remaining, api.rate_limit.limit
    log.info(
        "event=guardian_pass requests=%d remaining=%s limit=%s",
        report.requests, report.remaining, report.limit,
    )  # fmt: skip
    return report


def _destroy(api: HetznerAPI, report: PassReport, told: Progress | None = None) -> None:
    told = told or _Quiet()
    for verdict in report.verdicts:
        machine = verdict.machine
        try:
            api.delete_server(machine.id)
        except HcloudError as exc:
            log.error("server=%s name=%s destroy failed: %s", machine.id, machine.name, exc)
            report.failed.append((machine.id, str(exc)))
            told.destroyed(machine.id)
            continue
        where = f"{machine.project}/{machine.pool}"
        log.warning(
            "destroyed server=%s name=%s pool=%s reason=%s (%s)",
            machine.id, machine.name, where, verdict.why.value, verdict.detail,
        )  # fmt: skip
        report.destroyed.append(machine.id)
        told.destroyed(machine.id)


def destroy_project(api: HetznerAPI, project: str, dry_run: bool = False) -> PassReport:
    """Destroy a project's machines first, then its firewalls (heartbeat included)."""
    mine = labels.selector({labels.PROJECT: project})
    machines, _ = listing(api, mine)
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
    for firewall in api.firewalls(label_selector=mine):
        try:
            if api.delete_firewall(firewall.id):
                log.warning(
                    "destroyed firewall=%s name=%s project=%s", firewall.id, firewall.name, project
                )
        except HcloudError as exc:
            report.failed.append((firewall.id, str(exc)))
    return report


def iter_plan_lines(report: PassReport) -> Iterator[str]:
    verb = "would destroy" if report.dry_run else "destroy"
    for verdict in report.verdicts:
        machine = verdict.machine
        yield (
            f"{verb} server {machine.id} {machine.name} ({machine.project}/{machine.pool}): "
            f"{verdict.why.value}: {verdict.detail}"
        )
