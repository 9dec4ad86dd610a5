"""The typed, frozen configuration: what the rest of the program reads. Pure: no I/O.

Durations are seconds (float). Defaults cite the product docs (Machine pools, Jobs, Resource
pools); where the docs give none the choice is written in sp00ky.schema.json's
descriptions, and tests/config/test_config_model.py checks the two agree.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from types import MappingProxyType
from typing import Any, Literal

from sp00ky_infra.config.durations import DurationError, format_duration, parse_duration
from sp00ky_infra.policy.cost import Price
from sp00ky_infra.policy.jobs import RetryStrategy
from sp00ky_infra.policy.schedules import (
    DEFAULT_FOR_EACH_MAX_ROWS,
    DEFAULT_FOR_EACH_TIMEOUT,
    DEFAULT_POLICY,
    Cadence,
    ConcurrencyPolicy,
    Interval,
    parse_cron,
)

Provider = Literal["hetzner", "docker"]
Recycle = Literal["job", "never"]
Mode = Literal["single", "cluster"]

DEFAULT_CONFIG_FILE = "sp00ky.yml"  # every command reads ./sp00ky.yml unless told otherwise
DEFAULT_MODE: Mode = "single"
DEFAULT_PROVIDER: Provider = "hetzner"  # Machine pools docs, "Providers"
DEFAULT_SERVER_TYPE = "cx33"  # Machine pools docs, "Machine shape"
# Hetzner's Docker CE app image (hetznercloud/apps, apps/hetzner/docker-ce: created with
# "image": "docker-ce"): Docker is installed, so a machine installs no package at boot
DEFAULT_MACHINE_IMAGE = "docker-ce"
DEFAULT_MIN = 0  # Machine pools docs: "min: 0 ... nothing runs while there is no work"
DEFAULT_BUFFER = 0
DEFAULT_RECYCLE: Recycle = "job"  # Machine pools docs, "Machine lifecycle": "job (the default)"
DEFAULT_SLOTS = 1  # Machine pools docs, "Machine shape"
DEFAULT_LEASE = "90s"  # Machine pools docs, "When things go wrong"
DEFAULT_MAX_JOB_DURATION = "8h"  # Machine pools docs, "The contract"
DEFAULT_MAX_LIFETIME = "24h"  # Machine pools docs, "Machine lifecycle"
DEFAULT_IDLE_TIMEOUT = "5m"  # no default in the docs; their example's value
DEFAULT_BOOT_TIMEOUT = "10m"  # no default in the docs; a boot takes about a minute
DEFAULT_MAX_QUEUED = 1000  # Resource pools docs
DEFAULT_QUEUE_TIMEOUT = "1h"  # Resource pools docs: queueTimeout 3600
DEFAULT_RETENTION = {"success": "6h", "failed": "14d", "runSuccess": "24h", "runFailed": "30d"}


def queue_timeout_seconds(value: Any) -> float:
    """A queueTimeout as the docs write it, in seconds: a number of seconds (``1800``, or
    ``"1800"`` as a command line gives it) or a duration (``30m``); finite and above zero
    (the Resource pools docs: "Maximum wait in seconds; a finite positive number"). Raises
    DurationError saying how to write one."""
    how = "give a positive number of seconds (1800) or a duration (30m)"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DurationError(f"queueTimeout {value!r} is not a wait; {how}")
    seconds: float
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = parse_duration(text)
            except DurationError:
                raise DurationError(f"queueTimeout {value!r} is not a wait; {how}") from None
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise DurationError(
            f"queueTimeout is {value!r}, but a job must be able to wait for a slot; {how}"
        )
    return seconds


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class MachineShape:
    type: str = DEFAULT_SERVER_TYPE
    locations: tuple[str, ...] = ()
    fallback_types: tuple[str, ...] = ()
    image: str = DEFAULT_MACHINE_IMAGE  # a name, a snapshot id or a label selector


def _machine_material(pool: Pool) -> dict[str, Any]:
    """The machine's part of a revision: the default image is left out, so that machines made
    before the image could be chosen keep their revision (no deploy replaces them for it)."""
    shape = asdict(pool.machine)
    if shape["image"] == DEFAULT_MACHINE_IMAGE:
        del shape["image"]
    return {"provider": pool.provider, **shape}


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    provider: Provider = DEFAULT_PROVIDER
    machine: MachineShape = MachineShape()
    min: int = DEFAULT_MIN
    max: int | None = None
    autoscale: bool = False
    buffer: int = DEFAULT_BUFFER
    slots: int = DEFAULT_SLOTS
    idle_timeout: float = parse_duration(DEFAULT_IDLE_TIMEOUT)
    lease: float = parse_duration(DEFAULT_LEASE)
    max_job_duration: float = parse_duration(DEFAULT_MAX_JOB_DURATION)
    max_lifetime: float = parse_duration(DEFAULT_MAX_LIFETIME)
    recycle: Recycle = DEFAULT_RECYCLE
    boot_timeout: float = parse_duration(DEFAULT_BOOT_TIMEOUT)
    max_queued: int = DEFAULT_MAX_QUEUED
    queue_timeout: float = parse_duration(DEFAULT_QUEUE_TIMEOUT)
    pack_jobs: bool = True  # a due job goes to the machine that ran work most recently
    keep_paid_hours: bool = True  # an idle surplus machine drains just before its next hour

    @property
    def limit(self) -> int:
        """The pool's size limit: max when it autoscales, min when fixed (the guardian's cap)."""
        return (self.max or 0) if self.autoscale else self.min


@dataclass(frozen=True, slots=True)
class OutboxMethod:
    table: str
    schema: str | None = None
    concurrency: int | None = None  # None: only the pool's capacity caps it
    max_retries: int | None = None  # a new job's that sets none; None: the store's default, 3
    retry_strategy: RetryStrategy | None = None  # likewise; None: linear


@dataclass(frozen=True, slots=True)
class Deploy:
    dockerfile: str | None = None
    image: str | None = None  # REGISTRY/NAME:TAG or @sha256:...; wins over dockerfile
    port: int | None = None
    healthcheck: str | None = None
    command: tuple[str, ...] = ()


EnvSourceKind = Literal["fromEnv", "fromFile", "vault"]
ENV_SOURCE_KINDS: tuple[EnvSourceKind, ...] = ("fromEnv", "fromFile", "vault")


@dataclass(frozen=True, slots=True)
class EnvReference:
    """A value of a backend's env: that is not written in sp00ky.yml but resolved on the
    controller at deploy (``config.env_sources``): a variable of the controller's environment
    (``fromEnv``), a file on the controller (``fromFile``), or a vault secret (``vault``,
    refused until supported). Only the reference is kept here, never the value."""

    kind: EnvSourceKind
    source: str

    def describe(self) -> str:
        return f"{self.kind}: {self.source}"


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    pool: str | None = None
    spec: str | None = None
    base_url: str | None = None
    method: OutboxMethod | None = None
    deploy: Deploy = Deploy()
    env: Mapping[str, str] = field(default_factory=lambda: _frozen({}))  # inline values only
    env_references: Mapping[str, EnvReference] = field(default_factory=lambda: MappingProxyType({}))
    env_files: tuple[str, ...] = ()  # envFile: KEY=VALUE files read on the controller
    timeout_overridable: bool = False

    def revision(self, pool: Pool, image: str | None = None) -> str:
        """Hash of what a machine runs (its ``sp00ky/revision`` label): the image, command, env,
        port and healthcheck, the machine's provider, type, locations and image, its slots and
        recycle policy. An image given as a label selector counts as written: a newer
        snapshot that matches it is booted by the machines made after it, and replaces none
        of those running.

        ``image`` is what the deploy pinned the image to, passed in by the controller, which
        resolves it once per deploy (this model does no I/O): a registry image's digest
        reference, or the id of the image built from deploy.dockerfile. So a tag moved to a
        new digest, or a rebuilt image, means new machines. Without it (lint, a preview) only
        the configured reference counts.

        A machine whose revision differs from the config's is drained and replaced, so sizing
        and timing settings (min, max, buffer, autoscale, idleTimeout, maxLifetime, lease,
        bootTimeout, maxJobDuration, the queue's) are left out: they apply to running machines.
        """
        material = {
            "deploy": asdict(self.deploy),
            "env": dict(sorted(self.env.items())),
            "machine": _machine_material(pool),
            "slots": pool.slots,
            "recycle": pool.recycle,
        }
        # The references and files, never the values they resolve to: a revision is a label
        # and a log line (a rotated secret reaches the machines created after the next deploy)
        if self.env_references:
            material["envReferences"] = {
                key: ref.describe() for key, ref in sorted(self.env_references.items())
            }
        if self.env_files:
            material["envFiles"] = list(self.env_files)
        if image is not None:
            material["image"] = image
        digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
        return digest[:12]


@dataclass(frozen=True, slots=True)
class Retention:
    success: float = parse_duration(DEFAULT_RETENTION["success"])
    failed: float = parse_duration(DEFAULT_RETENTION["failed"])
    run_success: float = parse_duration(DEFAULT_RETENTION["runSuccess"])
    run_failed: float = parse_duration(DEFAULT_RETENTION["runFailed"])
    max_rows: int = 0  # 0: off


@dataclass(frozen=True, slots=True)
class ForEach:
    """``schedules.NAME.forEach``: one job per row of ``query``, each row named by its ``key``
    column's value; the query runs read-only, within ``timeout`` seconds and ``max_rows`` rows."""

    query: str
    key: str
    max_rows: int = DEFAULT_FOR_EACH_MAX_ROWS
    timeout: float = DEFAULT_FOR_EACH_TIMEOUT


@dataclass(frozen=True, slots=True)
class Schedule:
    """``schedules.NAME``: a job written into ``backend``'s outbox table at every fire
    (the Jobs docs, "Scheduled and multi-step work"); the cadence is read in UTC."""

    name: str
    backend: str
    route: str
    cadence: Cadence
    payload: Any = None
    concurrency: ConcurrencyPolicy = DEFAULT_POLICY
    history_success: float | None = None  # overrides retention.runSuccess for this schedule
    history_failed: float | None = None  # overrides retention.runFailed
    for_each: ForEach | None = None  # a fan-out: one job per row of a query

    @property
    def cadence_text(self) -> str:
        """The cadence as the file writes it: ``cron 0 3 * * *`` or ``every 1m``."""
        if isinstance(self.cadence, Interval):
            return f"every {format_duration(self.cadence.seconds)}"
        return f"cron {self.cadence.text}"


@dataclass(frozen=True, slots=True)
class Config:
    mode: Mode = DEFAULT_MODE
    pools: Mapping[str, Pool] = field(default_factory=lambda: MappingProxyType({}))
    backends: Mapping[str, Backend] = field(default_factory=lambda: MappingProxyType({}))
    retention: Retention = Retention()
    prices: Mapping[str, Price] = field(default_factory=lambda: MappingProxyType({}))
    schedules: Mapping[str, Schedule] = field(default_factory=lambda: MappingProxyType({}))
    root: str = "."  # the directory of sp00ky.yml; relative paths resolve against it

    def backend_for(self, pool: str) -> Backend:
        """The one backend that runs on ``pool`` (lint guarantees there is exactly one)."""
        for backend in self.backends.values():
            if backend.pool == pool:
                return backend
        raise KeyError(f"no backend runs on pool {pool!r}")

    def resolve(self, relative: str) -> str:
        return str(PurePath(self.root, relative))


def build_config(data: Mapping[str, Any], root: str = ".") -> Config:
    """Typed values from data that passed the schema and every lint rule."""
    pools = {name: _pool(name, raw) for name, raw in (data.get("pools") or {}).items()}
    backends = {
        name: _backend(name, raw)
        for name, raw in (data.get("apps") or {}).items()
        if raw.get("type") == "backend"
    }
    return Config(
        mode=data.get("mode", DEFAULT_MODE),
        pools=MappingProxyType(pools),
        backends=MappingProxyType(backends),
        retention=_retention(data.get("retention") or {}),
        prices=MappingProxyType(
            {
                server_type: Price(float(raw["hourly"]), float(raw["monthly"]), "sp00ky.yml")
                for server_type, raw in (data.get("prices") or {}).items()
            }
        ),
        schedules=MappingProxyType(
            {name: _schedule(name, raw) for name, raw in (data.get("schedules") or {}).items()}
        ),
        root=root,
    )


def _pool(name: str, raw: Mapping[str, Any]) -> Pool:
    machine = raw.get("machine") or {}
    return Pool(
        name=name,
        provider=raw.get("provider", DEFAULT_PROVIDER),
        machine=MachineShape(
            type=machine.get("type", DEFAULT_SERVER_TYPE),
            locations=tuple(machine.get("locations", ())),
            fallback_types=tuple(machine.get("types", ())),
            image=str(machine.get("image", DEFAULT_MACHINE_IMAGE)),
        ),
        min=raw.get("min", DEFAULT_MIN),
        max=raw.get("max"),
        autoscale=raw.get("autoscale", False),
        buffer=raw.get("buffer", DEFAULT_BUFFER),
        slots=raw.get("slots", DEFAULT_SLOTS),
        idle_timeout=parse_duration(raw.get("idleTimeout", DEFAULT_IDLE_TIMEOUT)),
        lease=parse_duration(raw.get("lease", DEFAULT_LEASE)),
        max_job_duration=parse_duration(raw.get("maxJobDuration", DEFAULT_MAX_JOB_DURATION)),
        max_lifetime=parse_duration(raw.get("maxLifetime", DEFAULT_MAX_LIFETIME)),
        recycle=raw.get("recycle", DEFAULT_RECYCLE),
        boot_timeout=parse_duration(raw.get("bootTimeout", DEFAULT_BOOT_TIMEOUT)),
        max_queued=raw.get("maxQueued", DEFAULT_MAX_QUEUED),
        queue_timeout=queue_timeout_seconds(raw.get("queueTimeout", DEFAULT_QUEUE_TIMEOUT)),
        pack_jobs=raw.get("packJobs", True),
        keep_paid_hours=raw.get("keepPaidHours", True),
    )


def _backend(name: str, raw: Mapping[str, Any]) -> Backend:
    method = raw.get("method") or {}
    deploy = raw.get("deploy") or {}
    command = deploy.get("command", ())
    if isinstance(command, str):
        command = shlex.split(command)
    raw_env = raw.get("env") or {}
    env = {str(key): _env_value(value) for key, value in raw_env.items() if not _is_ref(value)}
    references = {
        str(key): EnvReference(kind, str(value[kind]))
        for key, value in raw_env.items()
        if _is_ref(value)
        for kind in ENV_SOURCE_KINDS
        if kind in value
    }
    env_file = raw.get("envFile") or ()
    return Backend(
        name=name,
        pool=(raw.get("runOn") or {}).get("pool"),
        spec=raw.get("spec"),
        base_url=raw.get("baseUrl"),
        method=(
            OutboxMethod(
                table=method["table"],
                schema=method.get("schema"),
                concurrency=method.get("concurrency"),
                max_retries=method.get("maxRetries"),
                retry_strategy=method.get("retryStrategy"),
            )
            if method.get("type") == "outbox" and method.get("table")
            else None
        ),
        deploy=Deploy(
            dockerfile=deploy.get("dockerfile"),
            image=deploy.get("image"),
            port=deploy.get("port"),
            healthcheck=deploy.get("healthcheck"),
            command=tuple(command),
        ),
        env=_frozen(env),
        env_references=MappingProxyType(references),
        env_files=(env_file,) if isinstance(env_file, str) else tuple(env_file),
        timeout_overridable=raw.get("timeoutOverridable", False),
    )


def _is_ref(value: Any) -> bool:
    return isinstance(value, Mapping)


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _retention(raw: Mapping[str, Any]) -> Retention:
    def window(key: str) -> float:
        return parse_duration(raw.get(key, DEFAULT_RETENTION[key]))

    return Retention(
        success=window("success"),
        failed=window("failed"),
        run_success=window("runSuccess"),
        run_failed=window("runFailed"),
        max_rows=raw.get("maxRows", 0),
    )


def _schedule(name: str, raw: Mapping[str, Any]) -> Schedule:
    history = raw.get("history") or {}
    cadence: Cadence = (
        parse_cron(raw["cron"]) if "cron" in raw else Interval(parse_duration(raw["every"]))
    )
    return Schedule(
        name=name,
        backend=raw["backend"],
        route=raw["route"],
        cadence=cadence,
        payload=raw.get("payload"),
        concurrency=raw.get("concurrency", DEFAULT_POLICY),
        history_success=parse_duration(history["success"]) if "success" in history else None,
        history_failed=parse_duration(history["failed"]) if "failed" in history else None,
        for_each=_for_each(raw["forEach"]) if "forEach" in raw else None,
    )


def _for_each(raw: Mapping[str, Any]) -> ForEach:
    return ForEach(
        query=raw["query"],
        key=raw["key"],
        max_rows=raw.get("maxRows", DEFAULT_FOR_EACH_MAX_ROWS),
        timeout=parse_duration(raw["timeout"]) if "timeout" in raw else DEFAULT_FOR_EACH_TIMEOUT,
    )
