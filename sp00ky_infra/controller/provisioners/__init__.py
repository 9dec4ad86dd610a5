"""Where machines come from, behind one port: ``local`` (agent subprocesses), ``docker``,
``pulumi`` (a stack), and ``by_pool`` (each pool on its own)."""

from __future__ import annotations

from sp00ky_infra.controller.provisioners.base import (
    Adopts,
    HasGateway,
    MachineSpec,
    Outcome,
    Provisioned,
    Provisioner,
    ProvisionerError,
    Reaps,
    Refused,
    ReportsOutcomes,
    Routes,
    made_by,
    members,
    serving,
)

__all__ = [
    "Adopts",
    "HasGateway",
    "MachineSpec",
    "Outcome",
    "Provisioned",
    "Provisioner",
    "ProvisionerError",
    "Reaps",
    "Refused",
    "ReportsOutcomes",
    "Routes",
    "made_by",
    "members",
    "serving",
]
