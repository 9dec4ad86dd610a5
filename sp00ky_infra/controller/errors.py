"""Errors of the controller package; the HTTP status each answers with is in ``AGENT_STATUS``.

ControllerError (root)                                             500
├── Unauthorized      a bad join token or session                   401
├── Gone              the machine is failed or destroyed: the agent should exit   410
├── NotLeader         another controller leads this store            503
├── Refusal           a stale attempt, or a state that does not allow it   409
│   └── admin.NotFound   no such pool or machine (admin API)          404
│   └── images.UnknownImage   an image this controller does not serve (also an ImagesError)
├── SettingsError     a setting is missing or malformed (settings.py; also a ValueError)
├── registry.RegistryError   a deploy.image cannot be resolved (names it, says what to do)
│   ├── ImageNotFound   no such repository, tag or digest
│   └── RegistryDenied  no credentials for the registry, or refused ones
├── images.ImagesError   a pool's image cannot be settled at start (says what to set)
└── ProvisionerError  a provisioner failed (provisioners/base.py)
    └── Refused       the provider will not create the machine: a failed boot

The statuses live in one table per HTTP app (``AGENT_STATUS`` here, the admin API's in
``api_admin.py``), resolved by ``http_status`` through the exception's classes, most specific
first; the exceptions themselves carry only their message.
"""

from __future__ import annotations

from collections.abc import Mapping


class ControllerError(Exception):
    """The controller refuses or cannot do what was asked; the message says why."""


class Unauthorized(ControllerError):
    """A bad join token or session: the agent must not retry with it."""


class Gone(ControllerError):
    """The machine is failed or destroyed, or its pool is gone: the agent should exit."""


class NotLeader(ControllerError):
    """Another controller leads this store: retry shortly (or elsewhere)."""


class Refusal(ControllerError):
    """A stale attempt, or a state that does not allow the request."""


# The agents' endpoint: what each controller error answers with (docs in api_agents.ERRORS).
AGENT_STATUS: Mapping[type[Exception], int] = {
    Unauthorized: 401,
    Gone: 410,
    NotLeader: 503,
    Refusal: 409,
    ControllerError: 500,
}


def http_status(exc: Exception, table: Mapping[type[Exception], int]) -> int:
    """The status ``table`` gives the most specific of ``exc``'s classes; 500 if none."""
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return 500
