"""One exception root per part, and the HTTP status each controller error gets."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from sp00ky_infra.controller import admin
from sp00ky_infra.controller.api_admin import ADMIN_STATUS
from sp00ky_infra.controller.errors import (
    AGENT_STATUS,
    ControllerError,
    Gone,
    NotLeader,
    Refusal,
    Unauthorized,
    http_status,
)
from sp00ky_infra.controller.provisioners import ProvisionerError, Refused
from sp00ky_infra.controller.settings import SettingsError
from sp00ky_infra.shared.cloud_init import UserDataTooLarge
from sp00ky_infra.store import Conflict, InvalidJob, JobNotFound, QueueFull, StaleAttempt
from sp00ky_infra.store.machines import MachineNotFound

ROOTS = {
    "agent": "agent.errors.AgentError",
    "sp00ky_infra.config": "sp00ky_infra.config.errors.ConfigError",
    "sp00ky_infra.controller": "sp00ky_infra.controller.errors.ControllerError",
    "sp00ky_infra.guardian": "sp00ky_infra.guardian.errors.GuardianError",
    "sp00ky_infra.hetzner": "sp00ky_infra.hetzner.errors.HcloudError",
    "sp00ky_infra.infra": "sp00ky_infra.infra.errors.InfraError",
    "sp00ky_infra.rehearse": "sp00ky_infra.rehearse.errors.RehearseError",
    "sp00ky_infra.shared": "sp00ky_infra.shared.errors.SharedError",
    "sp00ky_infra.store": "sp00ky_infra.store.model.StoreError",
}
# Not yet under their part's root; each is another change's to make.
OUTSIDE = {
    # config is not this change's: DurationError should become a ConfigError (and stay a
    # ValueError, which callers catch).
    "sp00ky_infra.config.durations.DurationError",
}


def _modules(package: str) -> list[str]:
    found = importlib.import_module(package)
    names = [package]
    names += [m.name for m in pkgutil.walk_packages(found.__path__, prefix=f"{package}.")]
    return [name for name in names if not name.endswith(".__main__")]  # runs, not a library


def _resolve(dotted: str) -> type[BaseException]:
    module, _, name = dotted.rpartition(".")
    root: type[BaseException] = getattr(importlib.import_module(module), name)
    return root


@pytest.mark.parametrize("part", sorted(ROOTS))
def test_every_exception_of_a_part_derives_from_its_root(part: str) -> None:
    root = _resolve(ROOTS[part])
    seen = []
    for name in _modules(part):
        module = importlib.import_module(name)
        for value in vars(module).values():
            if not (inspect.isclass(value) and issubclass(value, BaseException)):
                continue
            if value.__module__ != name:
                continue  # imported, not defined here
            dotted = f"{name}.{value.__qualname__}"
            seen.append(dotted)
            if dotted not in OUTSIDE:
                assert issubclass(value, root), f"{dotted} is not a {root.__name__}"
    assert ROOTS[part] in seen  # the root is among what was looked at


def test_what_was_a_value_error_still_is() -> None:
    assert issubclass(SettingsError, ControllerError) and issubclass(SettingsError, ValueError)
    assert issubclass(UserDataTooLarge, ValueError)
    assert issubclass(Refused, ProvisionerError) and issubclass(ProvisionerError, ControllerError)


@pytest.mark.parametrize(
    ("error", "agents", "admin_api"),
    [
        (Unauthorized("x"), 401, 401),
        (Gone("x"), 410, 410),
        (NotLeader("x"), 503, 503),
        (Refusal("x"), 409, 409),
        (admin.NotFound("x"), 409, 404),  # the agents' endpoint never raises it
        (ControllerError("x"), 500, 500),
        (SettingsError("x"), 500, 500),
        (JobNotFound("x"), 500, 404),  # the store's errors reach only the admin API
        (MachineNotFound("x"), 500, 409),
        (StaleAttempt("x"), 500, 409),
        (Conflict("x"), 500, 409),
        (InvalidJob("x"), 500, 409),
        (QueueFull("x"), 500, 409),
    ],
)
def test_each_error_answers_with_its_status(error: Exception, agents: int, admin_api: int) -> None:
    assert http_status(error, AGENT_STATUS) == agents
    assert http_status(error, ADMIN_STATUS) == admin_api
