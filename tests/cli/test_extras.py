"""A command whose extra is not installed says, in one line, which to install (exit 2), never
a traceback; the commands of the core install start without any extra."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

EXTRAS = ("pulumi", "fabric", "mcp")


def _without_extras(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The command line as an installation without any extra runs it (their modules unfound)."""
    probe = (
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({EXTRAS!r}))\n"
        "from sp00ky_infra.cli import main\n"
        f"sys.argv = ['sp00ky-infra', *{list(args)!r}]\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "command", "extra"),
    [
        (["mcp"], "sp00ky-infra mcp", "mcp"),
        (["guardian", "install", "--host", "h"], "sp00ky-infra guardian install", "fabric"),
        (["rehearse"], "sp00ky-infra rehearse", "pulumi"),
    ],
)
def test_a_command_without_its_extra_names_the_extra_to_install(
    args: list[str], command: str, extra: str
) -> None:
    done = _without_extras(*args, env={"HCLOUD_TOKEN": "t"})
    assert done.returncode == 2
    assert done.stderr == (
        f"error: {command} needs the {extra} extra, which is not installed: "
        f"pip install 'sp00ky-infra[{extra}]'\n"
    )


def test_the_pulumi_controller_without_the_extra_is_refused_before_it_starts() -> None:
    done = _without_extras(
        "controller", "--config", "examples/sp00ky.yml", env={"SPKY_POOL_PROVIDER": "pulumi"}
    )
    assert done.returncode == 2
    assert "error: cannot start: a pool's provider is not served here; fix first:" in done.stderr
    assert (
        "  - pool render (provider hetzner) needs the Pulumi SDK (a stack makes its machines), "
        "but the pulumi extra is not installed: pip install 'sp00ky-infra[pulumi]'\n" in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_the_help_lists_every_command_without_the_extras() -> None:
    done = _without_extras("--help")
    assert done.returncode == 0, done.stderr
    for name in ("mcp", "guardian", "rehearse", "controller"):
        assert f"\n  {name} " in done.stdout
