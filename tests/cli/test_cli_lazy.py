"""The command line imports a command's module only when that command runs."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from sp00ky_infra.cli import COMMANDS, cli
from tests.helpers import ROOT

HEAVY = ("docker", "fastapi", "uvicorn", "mcp", "pulumi", "sp00ky_infra.controller")


def test_every_command_resolves_to_the_command_of_its_name() -> None:
    with click.Context(cli) as ctx:
        assert cli.list_commands(ctx) == sorted(COMMANDS)
        for name in COMMANDS:
            command = cli.get_command(ctx, name)
            assert isinstance(command, click.Command), name
            assert command.name == name
        assert cli.get_command(ctx, "nonesuch") is None


def test_a_mistyped_command_is_named_with_the_one_meant() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sp00ky_infra", "jbos"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "No such command 'jbos'. Did you mean 'jobs'?" in done.stderr


def _imported_by(*args: str) -> list[str]:
    probe = (
        "import json, sys\n"
        "from sp00ky_infra.cli import cli\n"
        "try:\n"
        f"    cli({list(args)!r}, prog_name='sp00ky-infra')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in sys.modules if m.split('.')[0] in {HEAVY!r}\n"
        f"                  or m.startswith({HEAVY[-1]!r})]), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    modules: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return modules


def test_lint_and_the_job_commands_do_not_import_the_controller_or_docker() -> None:
    assert _imported_by("lint", "examples/sp00ky.yml") == []
    assert _imported_by("jobs", "list", "--help") == []
    assert _imported_by("run", "--help") == []


def test_a_command_that_needs_the_controller_still_gets_it() -> None:
    assert "sp00ky_infra.controller.server" in _imported_by("dev", "--help")
