"""The guardian's errors.

GuardianError (root)
└── Incomplete   the listing failed part-way: nothing was destroyed
"""

from __future__ import annotations


class GuardianError(Exception):
    """The guardian's root: a pass that could not do its work; the message says why."""


class Incomplete(GuardianError):
    """The servers or heartbeats could not all be listed; nothing was destroyed."""
