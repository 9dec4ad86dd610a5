"""The ``sp00ky-infra`` command line (also ``python -m sp00ky_infra``): the group and its lazy
subcommands are in ``main``; each command's module is imported only when that command runs."""

from sp00ky_infra.cli.main import COMMANDS, cli, main

__all__ = ["COMMANDS", "cli", "main"]
