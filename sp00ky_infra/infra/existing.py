"""The machines a stack's project has in the cloud now, read from their labels.

A ``pulumi up`` run by hand, from a checkout whose ``sp00ky:machines`` is older than the
controller's, would destroy machines that are running jobs. The program then keeps every
machine that exists (the controller is the only one that takes machines away), and refuses
to run when it cannot tell what exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sp00ky_infra.hetzner import HcloudError, HetznerAPI
from sp00ky_infra.infra.errors import InfraError
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.desired import CONTROLLER, Desired

Found = tuple[str, str, str | None]  # pool, machine, revision


class CannotTell(InfraError):
    """What exists could not be listed, so a run by hand might destroy busy machines."""


def hetzner_machines(project: str, api: HetznerAPI | None = None) -> Iterator[Found]:
    try:
        api = api or HetznerAPI.from_env()
        servers = api.servers(
            label_selector=labels.selector({labels.PROJECT: project, labels.MACHINE: None})
        )
    except HcloudError as exc:
        raise CannotTell(f"cannot list project {project}'s servers on Hetzner: {exc}") from exc
    for server in servers:
        found = server.labels
        yield found.get(labels.POOL, ""), found[labels.MACHINE], found.get(labels.REVISION)


def docker_machines(project: str) -> Iterator[Found]:
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        try:
            containers = client.containers.list(
                all=True,
                filters={"label": [f"{labels.PROJECT}={project}", labels.MACHINE]},
                ignore_removed=True,  # removed between the listing and its inspection: gone
            )
        finally:
            client.close()
    except DockerException as exc:
        raise CannotTell(f"cannot list project {project}'s containers: {exc}") from exc
    for container in containers:
        found = container.labels
        yield found.get(labels.POOL, ""), found[labels.MACHINE], found.get(labels.REVISION)


def keep_existing(desired: Desired, found: Iterable[Found]) -> tuple[Desired, list[str]]:
    """``desired`` plus every machine ``found`` in the cloud; also the names it adds."""
    existing = list(found)
    kept = sorted(name for _, name, _ in existing if name not in desired.names())
    return desired.keeping(existing), kept


def machines_for_run(
    desired: Desired, provider: str, project: str, updated_by: str | None
) -> tuple[Desired, list[str]]:
    """What this run of the program creates and keeps. The controller's own run takes the
    stack's ``sp00ky:machines`` as it is; any other run also keeps what exists."""
    if updated_by == CONTROLLER:
        return desired, []
    listing = hetzner_machines(project) if provider == "hetzner" else docker_machines(project)
    return keep_existing(desired, listing)
