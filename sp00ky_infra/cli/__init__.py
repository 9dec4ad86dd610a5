"""The ``sp00ky-infra`` command line (also ``python -m sp00ky_infra``)."""

from __future__ import annotations

import click

from sp00ky_infra import __version__
from sp00ky_infra.cli.controller import controller, dev
from sp00ky_infra.cli.explain import explain
from sp00ky_infra.cli.guardian import guardian
from sp00ky_infra.cli.jobs import jobs, run
from sp00ky_infra.cli.lint import lint, schema
from sp00ky_infra.cli.mcp_server import mcp
from sp00ky_infra.cli.pools import pools
from sp00ky_infra.cli.rehearse import rehearse
from sp00ky_infra.cli.schedules import schedules
from sp00ky_infra.cli.simulate import simulate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sp00ky-infra")
def cli() -> None:
    """Machine pools for sp00ky backends: jobs on machines that exist only while there is work."""


cli.add_command(lint)
cli.add_command(schema)
cli.add_command(run)
cli.add_command(jobs)
cli.add_command(controller)
cli.add_command(dev)
cli.add_command(pools)
cli.add_command(guardian)
cli.add_command(rehearse)
cli.add_command(simulate)
cli.add_command(explain)
cli.add_command(mcp)
cli.add_command(schedules)


def main() -> None:
    cli(prog_name="sp00ky-infra")
