"""What each provisioner needs, checked when the controller starts (not at the first scale-up,
when a missing CLI or token would only open the breaker).

``problems(settings, env)`` returns every problem found, each a ``Problem`` saying what is
wrong and what to do; ``dev`` and ``controller`` refuse to start (exit 2) when there is one.

- local: nothing beyond Python (agents are subprocesses of this one).
- docker: a Docker engine that answers (DOCKER_HOST, else the local socket).
- pulumi: the pulumi extra (the SDK) and the pulumi CLI on PATH; SPKY_PROJECT; the Pulumi
  project (Pulumi.yaml) and the stack's config file in it; a public URL (SPKY_POOL_PUBLIC_URL)
  that machines elsewhere can reach (not a loopback or unspecified address); and what the
  stack's provider needs: HCLOUD_TOKEN for hetzner, a Docker engine for docker.
"""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.shared.extras import install_command, installed

DOCKER_PROBE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Problem:
    what: str  # what is wrong
    fix: str  # what to do

    def line(self) -> str:
        return f"{self.what}: {self.fix}"


def docker_answers() -> str | None:
    """None when a Docker engine answers, else why not."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=int(DOCKER_PROBE_SECONDS))
    except DockerException as exc:
        return str(exc)
    try:
        client.ping()
    except Exception as exc:  # requests' and docker's errors alike: it does not answer
        return str(exc)
    finally:
        client.close()
    return None


def problems(
    settings: ControllerSettings,
    env: Mapping[str, str],
    docker_probe: Callable[[], str | None] = docker_answers,
    which: Callable[[str], str | None] = shutil.which,
) -> list[Problem]:
    """Everything the provisioner of ``settings`` lacks, in the order to fix it."""
    if settings.provider == "docker":
        return _docker(docker_probe, "SPKY_POOL_PROVIDER=docker (or SPKY_POOL_DOCKER=1)")
    if settings.provider == "pulumi":
        return _pulumi(settings, env, docker_probe, which)
    return []


def _docker(probe: Callable[[], str | None], who: str) -> list[Problem]:
    why = probe()
    if why is None:
        return []
    return [
        Problem(
            f"{who} runs machines as containers, but no Docker engine answers ({why})",
            "start Docker (or set DOCKER_HOST to one that runs), or use local processes "
            "(SPKY_POOL_PROVIDER=local; dev --machines local)",
        )
    ]


def _pulumi(
    settings: ControllerSettings,
    env: Mapping[str, str],
    docker_probe: Callable[[], str | None],
    which: Callable[[str], str | None],
) -> list[Problem]:
    found: list[Problem] = []
    if not installed("pulumi"):
        found.append(
            Problem(
                "SPKY_POOL_PROVIDER=pulumi runs stacks through the Pulumi SDK, but the pulumi "
                "extra is not installed",
                install_command("pulumi"),
            )
        )
    if which("pulumi") is None:
        found.append(
            Problem(
                "SPKY_POOL_PROVIDER=pulumi runs `pulumi up`, but no pulumi CLI is on PATH",
                "install it (https://www.pulumi.com/docs/install/) or put the engine built "
                "here on PATH: PATH=$(scripts/pulumi-engine --path):$PATH",
            )
        )
    if not settings.project:
        found.append(
            Problem(
                "SPKY_PROJECT is not set",
                "the stack labels its machines with the project, and the guardian reads this "
                "controller's heartbeat under the same name. Set it",
            )
        )
    provider = _stack_provider(settings, found)
    found += _public_url(settings.public_url)
    if provider == "hetzner" and not env.get("HCLOUD_TOKEN"):
        found.append(
            Problem(
                f"stack {settings.pulumi_stack} makes Hetzner servers, but HCLOUD_TOKEN is not set",
                "export HCLOUD_TOKEN with a read/write API token of the Hetzner project",
            )
        )
    if provider == "docker":
        found += _docker(docker_probe, f"stack {settings.pulumi_stack} (sp00ky:provider docker)")
    return found


def _stack_provider(settings: ControllerSettings, found: list[Problem]) -> str | None:
    """The stack's ``sp00ky:provider`` (hetzner when unset), or None when the project or the
    stack's config file cannot be read (a problem is added)."""
    folder = Path(settings.pulumi_dir)
    project_file = folder / "Pulumi.yaml"
    try:
        project = yaml.safe_load(project_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        found.append(
            Problem(
                f"no Pulumi project at {project_file} ({exc.__class__.__name__})",
                "set SPKY_PULUMI_DIR to the directory of this repository's Pulumi.yaml",
            )
        )
        return None
    config_dir = folder / str(project.get("stackConfigDir") or ".")
    stack_file = config_dir / f"Pulumi.{settings.pulumi_stack}.yaml"
    try:
        stack = yaml.safe_load(stack_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        found.append(
            Problem(
                f"stack {settings.pulumi_stack} has no config file {stack_file} "
                f"({exc.__class__.__name__})",
                "set SPKY_PULUMI_STACK to an existing stack (stacks/Pulumi.prod.yaml is "
                "hetzner, stacks/Pulumi.local.yaml docker), or create its file with "
                "sp00ky:provider and sp00ky:configFile",
            )
        )
        return None
    config = stack.get("config") or {}
    return str(config.get("sp00ky:provider") or "hetzner")


def _public_url(url: str) -> list[Problem]:
    """Machines elsewhere dial SPKY_POOL_PUBLIC_URL: it must be set, http(s), and not an
    address that means this host only."""
    if not url:
        return [
            Problem(
                "SPKY_POOL_PUBLIC_URL is not set, so machines would dial this controller at "
                "a loopback address",
                "set it to the URL machines reach the agents' endpoint at, e.g. "
                "https://pool.example.com (a proxy in front of SPKY_POOL_PORT)",
            )
        ]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [
            Problem(
                f"SPKY_POOL_PUBLIC_URL {url!r} is not an http(s) URL",
                "set it to the URL machines reach the agents' endpoint at, e.g. "
                "https://pool.example.com",
            )
        ]
    if _local_only(parts.hostname):
        return [
            Problem(
                f"SPKY_POOL_PUBLIC_URL {url!r} names this host only ({parts.hostname}); "
                "machines elsewhere cannot reach it",
                "use a public name or address of this controller (or of its proxy)",
            )
        ]
    return []


def _local_only(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified
