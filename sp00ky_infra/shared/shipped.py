"""The repository's files the package reads at run time that are not Python modules:
``cloud-init/`` (the agent archive's install files, the bake server's script) and the Pulumi
program (``Pulumi.yaml``, ``__main__.py``, ``stacks/``). A wheel carries them under
``sp00ky_infra/shipped/`` (``setup.py`` copies them there at build); a checkout (an editable
install) reads them where they are."""

from __future__ import annotations

from pathlib import Path

from sp00ky_infra.shared.errors import SharedError

PACKAGE = Path(__file__).resolve().parent.parent
CHECKOUT = PACKAGE.parent
SHIPPED = PACKAGE / "shipped"
# what setup.py copies into the wheel, relative to the repository's root
NAMES = ("cloud-init", "Pulumi.yaml", "__main__.py", "stacks")


class NotShipped(SharedError, FileNotFoundError):
    """A file the package needs is neither in the installed package nor in a checkout."""


def shipped(name: str) -> Path:
    """Where ``name`` (one of ``NAMES``) is: the installed package's copy, else the checkout's.
    Raises ``NotShipped`` naming what is missing and how to get it."""
    for path in (SHIPPED / name, CHECKOUT / name):
        if path.exists():
            return path
    raise NotShipped(
        f"{name} is missing: it is neither in the installed package ({SHIPPED}) nor in a "
        f"checkout ({CHECKOUT}). Install sp00ky-infra from a wheel built by pip from the "
        "repository (pip install .), which carries it, or run it from a checkout"
    )
