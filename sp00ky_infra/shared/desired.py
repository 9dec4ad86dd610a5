"""The machines a stack asks for (``sp00ky:machines``): pool -> machine name -> the revision it
runs. The controller writes it; a person running ``pulumi up`` by hand may have an old copy.

Two forms are read: ``{pool: {name: revision}}`` (what the controller writes) and
``{pool: [name, ...]}`` (written by hand; each machine then runs the pool's revision).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from sp00ky_infra.shared.errors import SharedError

# Set by the controller on the `pulumi up` it runs: only that run may take machines away.
UPDATED_BY_ENV: Final = "SPKY_STACK_UPDATED_BY"
CONTROLLER: Final = "controller"
# The same mark for a program the controller runs in its own process (an inline `pulumi up`),
# where the CLI's environment never reaches the program.
UPDATED_BY: ContextVar[str | None] = ContextVar("sp00ky_stack_updated_by", default=None)


def updated_by() -> str | None:
    """Who runs this `pulumi up`: CONTROLLER for the controller's own, else None (by hand)."""
    return UPDATED_BY.get() or os.environ.get(UPDATED_BY_ENV)


class DesiredError(SharedError, ValueError):
    """``sp00ky:machines`` is not of a form this reads; the message says which part."""


@dataclass(frozen=True, slots=True)
class Desired:
    machines: Mapping[str, Mapping[str, str | None]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def pools(self) -> list[str]:
        return sorted(self.machines)

    def of(self, pool: str) -> Mapping[str, str | None]:
        return self.machines.get(pool, MappingProxyType({}))

    def names(self) -> set[str]:
        return {name for each in self.machines.values() for name in each}

    def keeping(self, existing: Iterable[tuple[str, str, str | None]]) -> Desired:
        """These machines plus ``existing`` (pool, name, revision) ones it does not name."""
        merged = {pool: dict(each) for pool, each in self.machines.items()}
        for pool, name, revision in existing:
            merged.setdefault(pool, {}).setdefault(name, revision)
        return Desired({pool: MappingProxyType(each) for pool, each in merged.items()})

    @classmethod
    def parse(cls, raw: Any) -> Desired:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise DesiredError("sp00ky:machines must be an object of pool -> machines")
        parsed: dict[str, Mapping[str, str | None]] = {}
        for pool, machines in raw.items():
            where = f"sp00ky:machines.{pool}"
            if isinstance(machines, Mapping):
                each = {
                    str(name): None if rev is None else str(rev) for name, rev in machines.items()
                }
            elif isinstance(machines, list) and all(isinstance(n, str) for n in machines):
                each = dict.fromkeys(machines)
            else:
                raise DesiredError(
                    f"{where} must be a list of machine names or an object of name -> revision"
                )
            parsed[str(pool)] = MappingProxyType(each)
        return cls(MappingProxyType(parsed))

    def as_json(self) -> dict[str, dict[str, str | None]]:
        """The controller's form, sorted: what it writes into the stack's config."""
        return {pool: dict(sorted(self.of(pool).items())) for pool in self.pools}
