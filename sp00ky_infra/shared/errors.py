"""Errors of the shared package: one root, each error defined beside the code that raises it.

SharedError (root)
├── TokenError          a join token that is malformed, forged, expired or for another
│                       machine, or an empty SPKY_POOL_SECRET (tokens.py)
├── UserDataTooLarge    a machine's user-data is over Hetzner's 32 KiB (cloud_init.py);
│                       also a ValueError, for callers that catch one
├── DesiredError        a stack's sp00ky:machines is not of a form this reads (desired.py);
│                       also a ValueError
└── MissingExtra        a command needs an extra of the package that is not installed
                        (extras.py)
"""

from __future__ import annotations


class SharedError(Exception):
    """Something every side relies on was refused; the message says what and what to do."""
