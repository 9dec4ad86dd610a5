"""The optional parts of sp00ky-infra, each installed by an extra of the package: a command that
needs one the installation lacks says which extra to install, instead of failing on an import.
"""

from __future__ import annotations

import importlib.util

from sp00ky_infra.shared.errors import SharedError

# extra -> the module it brings (what tells whether it is installed)
EXTRAS = {"pulumi": "pulumi", "fabric": "fabric", "mcp": "mcp"}


class MissingExtra(SharedError):
    """``needed_by`` needs an extra of the package that is not installed."""

    def __init__(self, extra: str, needed_by: str) -> None:
        self.extra = extra
        self.install = install_command(extra)
        super().__init__(
            f"{needed_by} needs the {extra} extra, which is not installed: {self.install}"
        )


def install_command(extra: str) -> str:
    return f"pip install 'sp00ky-infra[{extra}]'"


def installed(extra: str) -> bool:
    """Whether ``extra``'s module can be imported (looked up, not imported: it may be heavy)."""
    return importlib.util.find_spec(EXTRAS[extra]) is not None


def require(extra: str, needed_by: str) -> None:
    """Raise MissingExtra unless ``extra`` is installed."""
    if not installed(extra):
        raise MissingExtra(extra, needed_by)
