"""``sp00ky-infra lint`` and ``sp00ky-infra schema``."""

from __future__ import annotations

import json
import sys

import click

from sp00ky_infra.cli.jobs import with_flag
from sp00ky_infra.config import Config, ConfigFileError, Issue
from sp00ky_infra.config.document import read_document
from sp00ky_infra.config.loader import config_path, lint_document
from sp00ky_infra.config.model import build_config
from sp00ky_infra.config.reference import markdown
from sp00ky_infra.config.rules import RULES
from sp00ky_infra.config.schema import load_schema

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


@click.command()
@click.argument("file", required=False)
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON list of {path, code, message, line}."
)
def lint(file: str | None, as_json: bool) -> None:
    """Check FILE (default: $SPKY_CONFIG or ./sp00ky.yml) against the schema and every rule.

    Exit 0 when valid (warnings allowed), 1 with one line per problem, 2 when the file
    cannot be read or is not YAML.
    """
    path = config_path(file)
    try:
        doc = read_document(path)
    except ConfigFileError as exc:
        message = with_flag(str(exc), "as FILE: sp00ky-infra lint FILE")
        if as_json:
            click.echo(json.dumps([unreadable(message)], indent=2))
        click.echo(f"error: {message}", err=True)
        sys.exit(EXIT_UNREADABLE)
    issues = lint_document(doc, files=True)
    errors = [issue for issue in issues if issue.severity == "error"]
    if as_json:
        click.echo(json.dumps([issue.as_json() for issue in issues], indent=2))
    else:
        for issue in issues:
            click.echo(issue.render())
        if errors:
            click.echo(f"{path}: {len(errors)} problem(s)", err=True)
        else:
            config = build_config(doc.data, root=str(path.parent))
            click.echo(_summary(str(path), config, warnings=len(issues)))
    sys.exit(EXIT_INVALID if errors else EXIT_VALID)


# the file cannot be read or is not YAML (docs/configuration.md, "Checking a file")
UNREADABLE_CODE = "SP000"


def unreadable(message: str) -> dict[str, object]:
    """``lint --json``'s one entry for a file it could not read: code SP000, an error."""
    return Issue("", UNREADABLE_CODE, message, 0, "error").as_json()


def _summary(path: str, config: Config, warnings: int) -> str:
    """What was checked, so that a passing lint says more than nothing."""
    described = []
    for pool in config.pools.values():
        size = f"autoscale {pool.min}..{pool.max}" if pool.autoscale else f"fixed {pool.min}"
        backend = config.backend_for(pool.name).name
        described.append(f"{pool.name} ({size}, {pool.slots} slot(s), runs {backend})")
    note = f", {warnings} warning(s)" if warnings else ""
    return (
        f"{path}: ok. Checked against the JSON Schema and {len(RULES)} rules{note}. "
        f"Pools: {', '.join(described) or 'none'}."
    )


@click.command()
@click.option(
    "--markdown", "as_markdown", is_flag=True, help="Print the configuration reference instead."
)
def schema(as_markdown: bool) -> None:
    """Print the JSON Schema of sp00ky.yml (for editors), or its reference as Markdown."""
    click.echo(markdown() if as_markdown else json.dumps(load_schema(), indent=2))
