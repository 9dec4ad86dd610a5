"""Errors of the agent, all under one root.

AgentError (root)
├── SettingsError        the agent's own settings are missing or malformed (exit 2); also a
│                        ValueError
├── ControllerError      the controller could not be reached or answered with an error;
│   │                    ``status`` is the HTTP status, if any: retried with backoff
│   ├── Refused          401/403/404/409/422: this request will never succeed (a bad token,
│   │                    a stale attempt)
│   ├── Gone             410: the machine is failed or destroyed; the agent must shut down
│   ├── Unreachable      no answer to join or rejoin within its budget: transient (exit 7,
│   │                    restarted), never a power-off
│   └── ProtocolError    the controller's answer is not a message of protocol v1; the message
│                        names the field and what was expected
└── RuntimeError_        the backend could not be started
    ├── DockerError      the Docker engine refused or failed a request
    └── ImageError       the backend's image did not arrive (a failed boot); names the image
        └── ImageUnavailable   missing or unauthorised: retrying cannot help
"""

from __future__ import annotations


class AgentError(Exception):
    """Anything the agent raises on purpose; the message says what and what to do."""


class SettingsError(AgentError, ValueError):
    """A setting is missing or malformed; the message names the variable."""


class ControllerError(AgentError):
    """The controller could not be reached or answered with an error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Refused(ControllerError):
    """401/409: this request will never succeed (a bad token, a stale attempt)."""


class Gone(ControllerError):
    """410: the machine is failed or destroyed; the agent must shut down."""


class Unreachable(ControllerError):
    """No answer to join or rejoin within the agent's budget: transient, never a power-off."""


class ProtocolError(ControllerError):
    """The controller answered with something that is not the message protocol v1 expects."""


class RuntimeError_(AgentError):
    """The backend could not be started."""


class DockerError(RuntimeError_):
    """The Docker engine refused or failed a request; the message carries its answer."""


class ImageError(RuntimeError_):
    """The backend's image did not arrive; the message names it."""


class ImageUnavailable(ImageError):
    """The image is missing or unauthorised: retrying cannot help."""
