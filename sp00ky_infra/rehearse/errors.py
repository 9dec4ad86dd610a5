"""The rehearsal's one exception root.

RehearseError
 +-- ImageBuildError   the machine image could not be built (debootstrap, docker import)
 +-- BootError         a server's container could not be made, started or read
"""

from __future__ import annotations


class RehearseError(Exception):
    """Something of the local fake cloud failed; the message says what and what to do."""


class ImageBuildError(RehearseError):
    """The rehearsal machine image could not be built; the message names the step."""


class BootError(RehearseError):
    """A server's container could not be made, started or inspected."""
