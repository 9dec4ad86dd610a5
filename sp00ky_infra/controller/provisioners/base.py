"""The provisioner port: create a machine that runs the agent, destroy it, nothing more.

Every provisioner is a ``Provisioner``. What only some can do is declared, never guessed:

- ``delivers_join_token`` (an attribute of every provisioner): it puts ``MachineSpec.join_token``
  into the machine, so the controller issues one per machine. Pulumi does not: its program
  issues the token at ``pulumi up``, and the controller issues none.
- ``Adopts``: takes over the machines the store has when this controller starts leading.
- ``Reaps``: removes the machines an earlier run left behind that the store does not know
  as live, at start (``dev``: all of them).
- ``HasGateway``: machines reach the controller at an address of their own network.
- ``ReportsOutcomes``: creates asynchronously and reports per machine afterwards.
- ``Routes``: serves each pool through a provisioner of its own (``by_pool.py``): what a
  pool's machines can do is its own provisioner's (``serving``), and what acts on all
  machines (adopt, reap, outcomes) asks each provisioner (``members``).

ProvisionerError (a ControllerError, controller/errors.py)
└── Refused   the provider will not create the machine (a cap, a quota): a failed boot
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

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
    join_token: str | None = None  # issued only for a provisioner that delivers it
    workdir: str = "."  # where a local machine runs the backend's deploy.command
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Provisioned:
    provider_id: str
    provider_state: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an asynchronous provisioner did to one machine."""

    machine: str
    kind: Literal["created", "failed", "destroyed"]
    detail: str = ""


class Provisioner(Protocol):
    name: str
    delivers_join_token: bool  # puts MachineSpec.join_token into the machine itself

    def create(self, spec: MachineSpec) -> Provisioned:
        """Start a machine; returns once it exists (not once it is ready)."""
        ...

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        """Make sure the machine is gone; a machine already gone is fine."""
        ...

    def close(self) -> None:
        """Release what the provisioner holds (not the machines)."""
        ...


@runtime_checkable
class Adopts(Protocol):
    def adopt(self, machines: Mapping[str, Mapping[str, str]]) -> None:
        """Take the live machines the store has (pool -> name -> the revision it runs) as
        the ones that exist."""
        ...


@runtime_checkable
class Reaps(Protocol):
    def reap(self, keep: Collection[str] = ()) -> list[str]:
        """Remove the machines an earlier run left, but those named in ``keep`` (the store's
        live ones: they reconnect); returns the names of those removed."""
        ...


@runtime_checkable
class HasGateway(Protocol):
    def gateway(self) -> str:
        """The address machines reach this host at."""
        ...


@runtime_checkable
class ReportsOutcomes(Protocol):
    def outcomes(self) -> list[Outcome]:
        """What happened to machines since the last call."""
        ...


@runtime_checkable
class Routes(Protocol):
    def serving(self, pool: str) -> Provisioner:
        """The provisioner of ``pool``'s machines."""
        ...

    def members(self) -> Sequence[Provisioner]:
        """Each provisioner it routes to, once."""
        ...


def serving(provisioner: Provisioner, pool: str) -> Provisioner:
    """The provisioner that makes ``pool``'s machines: ``provisioner`` itself, unless it routes."""
    return provisioner.serving(pool) if isinstance(provisioner, Routes) else provisioner


def members(provisioner: Provisioner) -> list[Provisioner]:
    """The provisioners behind ``provisioner``: itself, unless it routes."""
    return list(provisioner.members()) if isinstance(provisioner, Routes) else [provisioner]


def made_by(provisioner: Provisioner, pool: str, maker: str) -> Provisioner:
    """The provisioner of a machine of ``pool`` whose row names ``maker`` (the provisioner's
    name when it was made): that one, even when the pool is served otherwise now (its provider
    changed) or no more (removed), else the pool's."""
    for member in members(provisioner):
        if member.name == maker:
            return member
    return serving(provisioner, pool)
