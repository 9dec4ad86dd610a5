"""The fake Hetzner Cloud API, now product code (``sp00ky_infra/rehearse/cloud.py``, the
rehearsal's local cloud); re-exported here for the tests that import it from here."""

from sp00ky_infra.rehearse.cloud import (
    LOCATIONS,
    MESSAGES,
    SERVER_TYPES,
    STATUS_OF,
    TOKEN,
    UNSUPPORTED_LOCATION,
    FakeHetzner,
    iso,
    matches,
)

__all__ = [
    "LOCATIONS", "MESSAGES", "SERVER_TYPES", "STATUS_OF", "TOKEN", "UNSUPPORTED_LOCATION",
    "FakeHetzner", "iso", "matches",
]  # fmt: skip
