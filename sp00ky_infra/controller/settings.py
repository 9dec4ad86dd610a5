"""The controller's settings: one home each, read from the environment, documented defaults.

Names follow the docs' self-hosting section (SPKY_POOL_PORT, SPKY_POOL_PUBLIC_URL,
SPKY_POOL_SECRET, SPKY_POOL_DOCKER, SPKY_POOL_DOCKER_NETWORK) plus this project's own.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from sp00ky_infra.config.durations import DurationError, parse_duration
from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE, Pool
from sp00ky_infra.config.project import default_store_url
from sp00ky_infra.config.project import state_dir as project_state_dir
from sp00ky_infra.controller.errors import ControllerError
from sp00ky_infra.controller.registry import default_auth_file
from sp00ky_infra.policy.breaker import FIRST_PAUSE_SECONDS, MAX_PAUSE_SECONDS
from sp00ky_infra.policy.cost import HOUR, Billing
from sp00ky_infra.shared.tokens import JOIN_TTL_SECONDS
from sp00ky_infra.store import store_url

DEFAULT_POOL_PORT = 9669  # the docs' example
DEFAULT_ADMIN_PORT = 9670
DEFAULT_TICK_SECONDS = 2.0  # Machine pools docs: "evaluated every two seconds"
MAX_POLL_WAIT_SECONDS = 20.0  # a long-poll waits up to ~20 s for work
PRUNE_EVERY_SECONDS = 60.0
ORPHANS_EVERY_SECONDS = 300.0  # controller/orphans.py: waiting jobs no pool takes
SWEEP_EVERY_SECONDS = 300.0  # controller/sweep.py: the project's servers no machine row holds
SWEEP_GRACE_SECONDS = 600.0  # far longer than a create (about a minute on Hetzner)
TIMING_KEYS = {
    "lease": "lease",
    "idleTimeout": "idle_timeout",
    "bootTimeout": "boot_timeout",
    "maxLifetime": "max_lifetime",
    "maxJobDuration": "max_job_duration",
}
# What serves a pool's provider (sp00ky.yml's pool.provider) when SPKY_POOL_PROVIDER is unset:
# hetzner pools are the Pulumi stack's, docker pools containers on this host's engine.
PROVISIONER_OF = {"hetzner": "pulumi", "docker": "docker"}
OVERRIDES = ("local", "docker")  # SPKY_POOL_PROVIDER: every pool on this, whatever the file says


class SettingsError(ControllerError, ValueError):
    """A setting is missing or malformed; the message names the variable. Still a
    ValueError, as it was before the controller had one exception root."""


@dataclass(frozen=True, slots=True)
class Timings:
    """Overrides of sp00ky.yml's pool durations, for tests and demos (SPKY_POOL_TIMINGS,
    e.g. ``lease=3s,idleTimeout=2s``). Production leaves them unset."""

    lease: float | None = None
    idle_timeout: float | None = None
    boot_timeout: float | None = None
    max_lifetime: float | None = None
    max_job_duration: float | None = None

    @classmethod
    def parse(cls, text: str, name: str = "SPKY_POOL_TIMINGS") -> Timings:
        values: dict[str, float] = {}
        for part in filter(None, (piece.strip() for piece in text.split(","))):
            key, _, value = part.partition("=")
            if key not in TIMING_KEYS:
                raise SettingsError(f"{name}: unknown timing {key!r}; use {', '.join(TIMING_KEYS)}")
            try:
                values[TIMING_KEYS[key]] = parse_duration(value)
            except DurationError as exc:
                raise SettingsError(f"{name}: {key}: {exc}") from exc
        return cls(**values)

    def apply(self, pool: Pool) -> Pool:
        changes = {
            name: getattr(self, name)
            for name in TIMING_KEYS.values()
            if getattr(self, name) is not None
        }
        return replace(pool, **changes) if changes else pool


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    config_path: str = DEFAULT_CONFIG_FILE
    store_url: str = field(default_factory=store_url)
    pool_host: str = "127.0.0.1"  # SPKY_POOL_HOST: where the agents' endpoint listens
    pool_port: int = DEFAULT_POOL_PORT  # SPKY_POOL_PORT
    public_url: str = ""  # SPKY_POOL_PUBLIC_URL: as a machine reaches it (default: local)
    secret: str = ""  # SPKY_POOL_SECRET: signs join tokens; keep it stable
    admin_host: str = "127.0.0.1"  # SPKY_ADMIN_HOST
    admin_port: int = DEFAULT_ADMIN_PORT  # SPKY_ADMIN_PORT
    admin_token: str = ""  # SPKY_ADMIN_TOKEN (default: generated into .sp00ky/admin-token)
    # SPKY_POOL_PROVIDER: local | docker runs every pool on it (SPKY_POOL_DOCKER=1: docker);
    # "" (from_env's default): each pool on its own provider (PROVISIONER_OF)
    provider: str = "local"
    docker_network: str = ""  # SPKY_POOL_DOCKER_NETWORK
    tick: float = DEFAULT_TICK_SECONDS  # SPKY_TICK
    poll_wait: float = MAX_POLL_WAIT_SECONDS
    max_machines: int | None = None  # SPKY_POOL_MAX_MACHINES: the project's cap, all pools
    breaker_first_pause: float = FIRST_PAUSE_SECONDS  # SPKY_BREAKER_PAUSE, doubling ...
    breaker_max_pause: float = MAX_PAUSE_SECONDS  # ... up to SPKY_BREAKER_MAX_PAUSE
    join_ttl: float = JOIN_TTL_SECONDS
    prune_every: float = PRUNE_EVERY_SECONDS
    orphans_every: float = ORPHANS_EVERY_SECONDS
    # SPKY_SWEEP_EVERY: how often controller/sweep.py looks for servers no row holds ...
    sweep_every: float = SWEEP_EVERY_SECONDS
    sweep_grace: float = SWEEP_GRACE_SECONDS  # ... SPKY_SWEEP_GRACE: once older than this
    timings: Timings = field(default_factory=Timings)
    controller_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    state_dir: str = ".sp00ky"  # from_env: .sp00ky next to config_path (config/project.py)
    project: str = ""  # SPKY_PROJECT: with HCLOUD_TOKEN set, the guardian's heartbeat is stamped
    heartbeat_every: float = 60.0  # SPKY_HEARTBEAT: how often (the guardian allows 30 minutes)
    pulumi_stack: str = "prod"  # SPKY_PULUMI_STACK: the stack the pulumi provisioner updates
    pulumi_dir: str = "."  # SPKY_PULUMI_DIR: the Pulumi project (where Pulumi.yaml is)
    # SPKY_POOL_IMAGES=1: settle each pool's image at start (resolve deploy.image, build and
    # serve deploy.dockerfile). Always on for VMs (pulumi), whose agents fetch the image; off
    # by default for local machines (processes) and docker machines (the image is baked in).
    pool_images: bool = False
    # SPKY_REGISTRY_AUTH: a docker config.json with the registries' credentials (default:
    # $DOCKER_CONFIG/config.json or ~/.docker/config.json, when there is one)
    registry_auth: str = ""
    # SPKY_BILLING_HOUR: the length of a billed hour, for a rehearsal or a test to see a paid
    # hour end; set, it bills every provider's machines (they keep paid hours as Hetzner's do)
    billing_hour: float | None = None
    stack_provider: str = "hetzner"  # what a pulumi stack's machines are (its sp00ky:provider)

    @property
    def billing(self) -> Billing | None:
        """How the machines of this controller's one provisioner (SPKY_POOL_PROVIDER) are
        billed; each pool's, when each is on its own provider: ``billing_for``."""
        return self.billing_for(self.provider)

    def billing_for(self, provisioner: str) -> Billing | None:
        """How a provisioner's machines are billed: Hetzner's per started hour (pulumi, on a
        hetzner stack); local and docker machines cost nothing, unless SPKY_BILLING_HOUR
        says otherwise."""
        provider = self.stack_provider if provisioner == "pulumi" else provisioner
        if provider != "hetzner" and self.billing_hour is None:
            return None
        return Billing.of(provider, self.tick, self.billing_hour or HOUR)

    def provisioner_for(self, pool: Pool) -> str:
        """What makes ``pool``'s machines: SPKY_POOL_PROVIDER's, else its provider's."""
        return self.provider or PROVISIONER_OF[pool.provider]

    def serving(self, pools: Mapping[str, Pool]) -> dict[str, list[str]]:
        """Each provisioner in use (local, docker, pulumi) and the pools it serves."""
        found: dict[str, list[str]] = {}
        for name, pool in pools.items():
            found.setdefault(self.provisioner_for(pool), []).append(name)
        return found

    def settles_images(self, pools: Mapping[str, Pool]) -> bool:
        """Whether machines fetch their backend's image, so the controller settles it: VMs
        (the Pulumi stack's) always do."""
        return self.pool_images or "pulumi" in self.serving(pools)

    @property
    def agents_url(self) -> str:
        return self.public_url or f"http://{self.pool_host}:{self.pool_port}"

    def pool(self, pool: Pool) -> Pool:
        """The pool with this controller's timing overrides applied."""
        return self.timings.apply(pool)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, **overrides: object
    ) -> ControllerSettings:
        env = os.environ if env is None else env
        values: dict[str, object] = {
            "config_path": env.get("SPKY_CONFIG") or DEFAULT_CONFIG_FILE,
            "store_url": env.get("SPKY_STORE") or "",
            "pool_host": env.get("SPKY_POOL_HOST", "127.0.0.1"),
            "pool_port": _int(env, "SPKY_POOL_PORT", DEFAULT_POOL_PORT),
            "public_url": env.get("SPKY_POOL_PUBLIC_URL", ""),
            "secret": env.get("SPKY_POOL_SECRET", ""),
            "admin_host": env.get("SPKY_ADMIN_HOST", "127.0.0.1"),
            "admin_port": _int(env, "SPKY_ADMIN_PORT", DEFAULT_ADMIN_PORT),
            "admin_token": env.get("SPKY_ADMIN_TOKEN", ""),
            "provider": _provider(env),
            "docker_network": env.get("SPKY_POOL_DOCKER_NETWORK", ""),
            "tick": _seconds(env, "SPKY_TICK", DEFAULT_TICK_SECONDS),
            "max_machines": _int(env, "SPKY_POOL_MAX_MACHINES", None),
            "breaker_first_pause": _seconds(env, "SPKY_BREAKER_PAUSE", FIRST_PAUSE_SECONDS),
            "breaker_max_pause": _seconds(env, "SPKY_BREAKER_MAX_PAUSE", MAX_PAUSE_SECONDS),
            "timings": Timings.parse(env.get("SPKY_POOL_TIMINGS", "")),
            "project": env.get("SPKY_PROJECT", ""),
            "heartbeat_every": _seconds(env, "SPKY_HEARTBEAT", 60.0),
            "sweep_every": _seconds(env, "SPKY_SWEEP_EVERY", SWEEP_EVERY_SECONDS),
            "sweep_grace": _seconds(env, "SPKY_SWEEP_GRACE", SWEEP_GRACE_SECONDS),
            "pulumi_stack": env.get("SPKY_PULUMI_STACK", "prod"),
            "pulumi_dir": env.get("SPKY_PULUMI_DIR", "."),
            "pool_images": env.get("SPKY_POOL_IMAGES") == "1",
            "registry_auth": default_auth_file(env),
            "billing_hour": _seconds(env, "SPKY_BILLING_HOUR", 0.0) or None,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        # one store per project: its state directory is next to its sp00ky.yml
        values["store_url"] = values["store_url"] or default_store_url(str(values["config_path"]))
        values.setdefault("state_dir", str(project_state_dir(str(values["config_path"]))))
        settings = cls(**values)  # type: ignore[arg-type]
        if settings.provider not in ("", *OVERRIDES):
            raise SettingsError(
                f"SPKY_POOL_PROVIDER: {settings.provider!r} is not a provisioner; use local or "
                "docker to run every pool on it, or leave it unset: each pool on its own provider"
            )
        return settings

    def with_secrets(self) -> ControllerSettings:
        """Fill in a generated admin token (kept in the state dir for the CLI) and, for local
        machines only, a generated pool secret; machines elsewhere need a stable one."""
        admin_token = self.admin_token or read_or_create_token(Path(self.state_dir) / "admin-token")
        secret = self.secret
        if not secret:
            if self.provider != "local":
                raise SettingsError(
                    "SPKY_POOL_SECRET is not set; machines' join tokens are signed with it. "
                    "Set a long random string and keep it stable"
                )
            secret = secrets.token_urlsafe(32)
        return replace(self, admin_token=admin_token, secret=secret)


def _provider(env: Mapping[str, str]) -> str:
    """SPKY_POOL_PROVIDER's override; pulumi (what the stack was named before each pool had
    its own provider) is the same as unset: hetzner pools are the stack's."""
    if env.get("SPKY_POOL_DOCKER") == "1":
        return "docker"
    provider = env.get("SPKY_POOL_PROVIDER", "")
    return "" if provider == "pulumi" else provider


def read_or_create_token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        return token


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = env.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError as exc:
        raise SettingsError(f"{name}: {text!r} is not a whole number") from exc


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    if not text:
        return default
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise SettingsError(f"{name}: {exc}") from exc
