"""What each provisioner in use needs, checked when the controller starts (not at the first
scale-up, when a missing CLI or token would only open the breaker).

``problems(settings, env, pools)`` returns every problem found, each a ``Problem`` naming the
pools it stops, their provider and what to set; ``dev`` and ``controller`` refuse to start
(exit 2) when there is one. A pool is served by SPKY_POOL_PROVIDER's provisioner when it is
set, else by its own provider's (settings.PROVISIONER_OF):

- local: nothing beyond Python (agents are subprocesses of this one).
- docker: a Docker engine that answers (DOCKER_HOST, else the local socket).
- pulumi (hetzner pools): the pulumi extra (the SDK) and the pulumi CLI on PATH;
  SPKY_PROJECT; the Pulumi project (Pulumi.yaml) and the stack's config file in it; a public
  URL (SPKY_POOL_PUBLIC_URL) that machines elsewhere can reach (not a loopback or
  unspecified address); and what the stack's provider needs: HCLOUD_TOKEN for hetzner, a
  Docker engine for docker (a hetzner pool's stack run on this host).
"""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from sp00ky_infra.config.model import Pool
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
    pools: Mapping[str, Pool],
    docker_probe: Callable[[], str | None] = docker_answers,
    which: Callable[[str], str | None] = shutil.which,
) -> list[Problem]:
    """Everything the provisioners serving ``pools`` lack, in the order to fix it."""
    found: list[Problem] = []
    for provisioner, names in settings.serving(pools).items():
        who = _who(settings, names, pools)
        if provisioner == "docker":
            found += _docker(docker_probe, who)
        elif provisioner == "pulumi":
            found += _pulumi(settings, env, docker_probe, which, who)
    return found


def _who(settings: ControllerSettings, names: list[str], pools: Mapping[str, Pool]) -> str:
    """The pools a problem stops, and why they are served as they are: ``pool render
    (provider hetzner) needs``, ``pools a, b (SPKY_POOL_PROVIDER=docker) need``."""
    why = f"SPKY_POOL_PROVIDER={settings.provider}" if settings.provider else ""
    if not why:
        why = "provider " + ", ".join(sorted({pools[name].provider for name in names}))
    if len(names) == 1:
        return f"pool {names[0]} ({why}) needs"
    return f"pools {', '.join(names)} ({why}) need"


def _docker(
    probe: Callable[[], str | None], who: str, because: str = "its machines are containers"
) -> list[Problem]:
    why = probe()
    if why is None:
        return []
    return [
        Problem(
            f"{who} a Docker engine ({because}), but none answers ({why})",
            "start Docker (or set DOCKER_HOST to one that runs), or use local processes "
            "(SPKY_POOL_PROVIDER=local; dev --machines local)",
        )
    ]


def _pulumi(
    settings: ControllerSettings,
    env: Mapping[str, str],
    docker_probe: Callable[[], str | None],
    which: Callable[[str], str | None],
    who: str,
) -> list[Problem]:
    found: list[Problem] = []
    if not installed("pulumi"):
        found.append(
            Problem(
                f"{who} the Pulumi SDK (a stack makes its machines), but the pulumi extra is "
                "not installed",
                install_command("pulumi"),
            )
        )
    if which("pulumi") is None:
        found.append(
            Problem(
                f"{who} the pulumi CLI (`pulumi up` makes its machines), but none is on PATH",
                "install it (https://www.pulumi.com/docs/install/) or put the engine built "
                "by a checkout's scripts/pulumi-engine on PATH: "
                "PATH=$(scripts/pulumi-engine --path):$PATH",
            )
        )
    if not settings.project:
        found.append(
            Problem(
                f"{who} SPKY_PROJECT, which is not set",
                "the stack labels its machines with the project, and the guardian reads this "
                "controller's heartbeat under the same name. Set it",
            )
        )
    provider = _stack_provider(settings, found, who)
    found += _public_url(settings.public_url, who)
    if provider == "hetzner" and not env.get("HCLOUD_TOKEN"):
        found.append(
            Problem(
                f"{who} HCLOUD_TOKEN (stack {settings.pulumi_stack} makes Hetzner servers), "
                "which is not set",
                "export HCLOUD_TOKEN with a read/write API token of the Hetzner project",
            )
        )
    if provider == "docker":
        because = f"stack {settings.pulumi_stack} is sp00ky:provider docker: containers here"
        found += _docker(docker_probe, who, because)
    return found


def _stack_provider(settings: ControllerSettings, found: list[Problem], who: str) -> str | None:
    """The stack's ``sp00ky:provider`` (hetzner when unset), or None when the project or the
    stack's config file cannot be read (a problem is added)."""
    folder = Path(settings.pulumi_dir)
    project_file = folder / "Pulumi.yaml"
    try:
        project = yaml.safe_load(project_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        found.append(
            Problem(
                f"{who} a Pulumi project, but there is none at {project_file} "
                f"({exc.__class__.__name__})",
                "set SPKY_PULUMI_DIR to a checkout of sp00ky-infra, which holds the Pulumi "
                "program (Pulumi.yaml, __main__.py, stacks/) and its .venv (scripts/venv)",
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
                f"{who} stack {settings.pulumi_stack}, but it has no config file "
                f"{stack_file} ({exc.__class__.__name__})",
                "set SPKY_PULUMI_STACK to an existing stack (stacks/Pulumi.prod.yaml is "
                "hetzner, stacks/Pulumi.local.yaml docker), or create its file with "
                "sp00ky:provider and sp00ky:configFile",
            )
        )
        return None
    config = stack.get("config") or {}
    return str(config.get("sp00ky:provider") or "hetzner")


def _public_url(url: str, who: str) -> list[Problem]:
    """Machines elsewhere dial SPKY_POOL_PUBLIC_URL: it must be set, http(s), and not an
    address that means this host only."""
    if not url:
        return [
            Problem(
                f"{who} SPKY_POOL_PUBLIC_URL, which is not set, so machines would dial this "
                "controller at a loopback address",
                "set it to the URL machines reach the agents' endpoint at, e.g. "
                "https://pool.example.com (a proxy in front of SPKY_POOL_PORT)",
            )
        ]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [
            Problem(
                f"{who} SPKY_POOL_PUBLIC_URL to be an http(s) URL, but it is {url!r}",
                "set it to the URL machines reach the agents' endpoint at, e.g. "
                "https://pool.example.com",
            )
        ]
    if _local_only(parts.hostname):
        return [
            Problem(
                f"{who} SPKY_POOL_PUBLIC_URL to reach this controller, but {url!r} names "
                f"this host only ({parts.hostname}); machines elsewhere cannot reach it",
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
