"""The Hetzner API's errors: one exception carrying the API's own code and HTTP status.

HcloudError (root)   code = the API's ``error.code`` (``not_found``, ``resource_unavailable``,
                     ...), or one of this client's own: ``unreachable``, ``invalid_response``,
                     ``unauthorized`` (no token)

The codes and their statuses are the API reference's errors table
(https://docs.hetzner.cloud/reference/cloud#errors) and hcloud-go's list
(hetznercloud/hcloud-go, ``hcloud/error.go``). Facts this client acts on:

- The API has no code of its own for "this server type is not sold in this location": it
  answers ``invalid_input`` (422) with the message "unsupported location for server type"
  (seen in the field, e.g. testflows/TestFlows-GitHub-Hetzner-Runners#96,
  autobase-tech/autobase#1403, roots/trellis-cli#622). ``unavailable_here`` tells it apart
  from a real input error by that message.
- Out of capacity arrives as ``resource_unavailable`` (412), often with the message "error
  during placement" (hetznercloud/terraform-provider-hcloud#531, pulumi/pulumi-hcloud#104);
  POST /servers also documents ``placement_error`` ("an error during the placement occurred").
- ``resource_limit_exceeded`` (403, "server limit exceeded") is the account's quota.
- ``locked`` (423) means another action runs on the resource; ``conflict`` (409) means it
  changed during the request, "please retry".
"""

from __future__ import annotations

from typing import Final

# The API's codes this project acts on.
NOT_FOUND: Final = "not_found"
INVALID_INPUT: Final = "invalid_input"
RESOURCE_UNAVAILABLE: Final = "resource_unavailable"
PLACEMENT_ERROR: Final = "placement_error"
RATE_LIMIT_EXCEEDED: Final = "rate_limit_exceeded"
RESOURCE_LIMIT_EXCEEDED: Final = "resource_limit_exceeded"
UNIQUENESS_ERROR: Final = "uniqueness_error"
LOCKED: Final = "locked"
CONFLICT: Final = "conflict"
# This client's own codes, for failures that never got an API answer.
UNREACHABLE: Final = "unreachable"
INVALID_RESPONSE: Final = "invalid_response"
UNAUTHORIZED: Final = "unauthorized"

# Codes that mean "not here, try the next location or server type" whatever the message.
UNAVAILABLE = frozenset({RESOURCE_UNAVAILABLE, PLACEMENT_ERROR})
# The message of the ``invalid_input`` answer that means the same (the API's own words).
UNSUPPORTED_LOCATION: Final = "unsupported location for server type"
# Codes that mean "busy right now": a delete is tried again after a pause.
BUSY = frozenset({LOCKED, CONFLICT})


class HcloudError(Exception):
    """The API refused or failed a request: ``code`` is the API's error code."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.code = code
        self.message = message
        self.status = status

    @property
    def unavailable_here(self) -> bool:
        """This location or server type cannot take the server now: try the next one."""
        if self.code in UNAVAILABLE:
            return True
        return self.code == INVALID_INPUT and UNSUPPORTED_LOCATION in self.message.lower()

    @property
    def outcome_unknown(self) -> bool:
        """No answer or a server-side failure: the request may or may not have taken effect."""
        return self.code == UNREACHABLE or (self.status is not None and self.status >= 500)
