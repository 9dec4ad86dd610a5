"""The provisioner port: create a machine that runs the agent, destroy it, nothing more.

ProvisionerError (root)
└── Refused   the provider will not create the machine (a cap, a quota): a failed boot
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sp00ky_infra.controller.errors import ControllerError


class ProvisionerError(ControllerError):
    """A provisioner failed; the message says what and why."""


class Refused(ProvisionerError):
    """The provider refused to create a machine. Counts as a failed boot."""


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """What a new machine needs: who it is, and how its agent reaches the controller."""

    name: str
    pool: str
    backend: str
    revision: str
    controller_url: str
    join_token: str
    workdir: str = "."  # where a local machine runs the backend's deploy.command
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Provisioned:
    provider_id: str
    provider_state: str = ""


class Provisioner(Protocol):
    name: str

    def create(self, spec: MachineSpec) -> Provisioned:
        """Start a machine; returns once it exists (not once it is ready)."""
        ...

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        """Make sure the machine is gone; a machine already gone is fine."""
        ...

    def close(self) -> None:
        """Release what the provisioner holds (not the machines)."""
        ...
