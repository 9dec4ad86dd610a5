"""The ``sp00ky-infra`` command line (also ``python -m sp00ky_infra``).

Each command's module is imported when that command runs (``LazyGroup``, click's documented
pattern for lazy subcommands): ``jobs list`` needs neither the controller's web framework, the
Docker SDK nor the MCP server, and importing them all would slow every command's start. A
command that needs an extra the installation lacks (pulumi, fabric, mcp) exits 2 with one line
naming the extra and its pip command.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from sp00ky_infra import __version__
from sp00ky_infra.shared.extras import MissingExtra

EXIT_USAGE = 2

# name -> "module:attribute" of the command (each module's imports come with it alone)
COMMANDS = {
    "lint": "sp00ky_infra.cli.lint:lint",
    "schema": "sp00ky_infra.cli.lint:schema",
    "run": "sp00ky_infra.cli.jobs:run",
    "jobs": "sp00ky_infra.cli.jobs:jobs",
    "controller": "sp00ky_infra.cli.controller:controller",
    "dev": "sp00ky_infra.cli.controller:dev",
    "pools": "sp00ky_infra.cli.pools:pools",
    "guardian": "sp00ky_infra.cli.guardian:guardian",
    "rehearse": "sp00ky_infra.cli.rehearse:rehearse",
    "simulate": "sp00ky_infra.cli.simulate:simulate",
    "explain": "sp00ky_infra.cli.explain:explain",
    "login": "sp00ky_infra.cli.login:login",
    "logout": "sp00ky_infra.cli.login:logout",
    "mcp": "sp00ky_infra.cli.mcp_server:mcp",
    "schedules": "sp00ky_infra.cli.schedules:schedules",
    "image": "sp00ky_infra.cli.image:image",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported by name when they are looked up."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, attribute = self.lazy[cmd_name].split(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
        return command

    def invoke(self, ctx: click.Context) -> Any:
        # an extra this installation lacks is a usage error: one line says what to install
        try:
            return super().invoke(ctx)
        except MissingExtra as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_USAGE)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # click suggests the commands it holds (``self.commands``): here, the lazy ones too
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="sp00ky-infra")
def cli() -> None:
    """Machine pools for sp00ky backends: jobs on machines that exist only while there is work."""


def main() -> None:
    cli(prog_name="sp00ky-infra")
