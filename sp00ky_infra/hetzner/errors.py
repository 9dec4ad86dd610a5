"""The Hetzner API's errors: one exception carrying the API's own code and HTTP status.

HcloudError (root)   code = the API's ``error.code`` (``not_found``, ``resource_unavailable``,
                     ...), or one of this client's own: ``unreachable``, ``invalid_response``,
                     ``unauthorized`` (no token)
"""

from __future__ import annotations

from typing import Final

# The API's codes this project acts on (docs.hetzner.cloud, "Errors").
NOT_FOUND: Final = "not_found"
RESOURCE_UNAVAILABLE: Final = "resource_unavailable"
RATE_LIMIT_EXCEEDED: Final = "rate_limit_exceeded"
RESOURCE_LIMIT_EXCEEDED: Final = "resource_limit_exceeded"
UNIQUENESS_ERROR: Final = "uniqueness_error"
# This client's own codes, for failures that never got an API answer.
UNREACHABLE: Final = "unreachable"
INVALID_RESPONSE: Final = "invalid_response"
UNAUTHORIZED: Final = "unauthorized"

# Codes that mean "not here, try the next location or server type".
UNAVAILABLE = frozenset({RESOURCE_UNAVAILABLE, "unsupported_location_for_server_type"})


class HcloudError(Exception):
    """The API refused or failed a request: ``code`` is the API's error code."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.code = code
        self.message = message
        self.status = status
