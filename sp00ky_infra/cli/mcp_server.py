"""``sp00ky-infra mcp``: the admin operations as MCP tools over stdio (the server is in
``mcp_tools``, imported only when the ``mcp`` extra that brings the MCP SDK is installed)."""

from __future__ import annotations

import click

from sp00ky_infra.cli.jobs import store_option
from sp00ky_infra.shared.extras import require


@click.command()
@store_option
def mcp(store_url: str | None) -> None:
    """Serve the admin operations as MCP tools over stdio (for an assistant's MCP client)."""
    require("mcp", "sp00ky-infra mcp")
    from sp00ky_infra.cli.mcp_tools import build

    build(store_url).run("stdio")
