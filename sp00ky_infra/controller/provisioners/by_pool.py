"""Each pool on its own provider: one provisioner per provider in use, chosen per pool.

A controller whose pools declare different providers (sp00ky.yml's ``pool.provider``) holds a
provisioner for each (hetzner: the Pulumi stack; docker: this host's Docker engine) and routes
every machine to its pool's. The executor asks ``serving(pool)`` for what a pool's machines
can do (the join token, their output, outcomes); adopt, reap and the outcomes go to each
member (``members``), each taking the machines its ``name`` recorded on their rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sp00ky_infra.controller.provisioners.base import (
    MachineSpec,
    Provisioned,
    Provisioner,
    ProvisionerError,
    Refused,
)


class ByPool:
    """Routes: pool -> the provisioner of its provider."""

    name = "by-pool"
    delivers_join_token = False  # never asked: each pool's own provisioner says (serving)

    def __init__(self, routes: Mapping[str, Provisioner]) -> None:
        self.routes = dict(routes)
        self._members: list[Provisioner] = []
        for provisioner in self.routes.values():
            if not any(provisioner is seen for seen in self._members):
                self._members.append(provisioner)

    def serving(self, pool: str) -> Provisioner:
        found = self.routes.get(pool)
        if found is None:
            served = ", ".join(sorted(self.routes)) or "none"
            raise Refused(f"pool {pool} has no provisioner here (pools served: {served})")
        return found

    def members(self) -> Sequence[Provisioner]:
        return list(self._members)

    def create(self, spec: MachineSpec) -> Provisioned:
        return self.serving(spec.pool).create(spec)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        """By the machine's name (``<pool>-<suffix>``, shared/names.py); the executor, which
        knows the pool, asks the pool's provisioner itself."""
        self.serving(name.rsplit("-", 1)[0]).destroy(name, provider_id, provider_state)

    def close(self) -> None:
        """Close every member, even when one fails; the first failure is raised after."""
        failed: ProvisionerError | None = None
        for provisioner in self._members:
            try:
                provisioner.close()
            except ProvisionerError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def runs_on(provisioner: Provisioner, stack_provider: str) -> str:
    """What a provisioner's machines are, in sp00ky.yml's words: a stack's are its
    sp00ky:provider's (hetzner servers, or docker containers for a stack run on this host);
    docker's are containers, local's processes."""
    return stack_provider if provisioner.name == "pulumi" else provisioner.name
