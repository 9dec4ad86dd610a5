"""Lint rules for sp00ky.yml: one function per rule, each with a stable code.

Rules read the plain data (not the typed model), defensively, so that one pass reports every
problem even when other parts of the file are broken; a value of the wrong type is left to the
JSON Schema. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, get_args

from sp00ky_infra.config.durations import DurationError, parse_duration
from sp00ky_infra.config.errors import Severity
from sp00ky_infra.config.images import EXAMPLE as IMAGE_EXAMPLE
from sp00ky_infra.config.images import ImageReferenceError, parse_image
from sp00ky_infra.config.machine_images import (
    BAKED,
    SELECTOR_EXAMPLE,
    SelectorError,
    has_docker,
    image_kind,
    parse_selector,
)
from sp00ky_infra.config.model import (
    DEFAULT_LEASE,
    DEFAULT_MACHINE_IMAGE,
    DEFAULT_MAX_JOB_DURATION,
    DEFAULT_MAX_LIFETIME,
    DEFAULT_PROVIDER,
    DEFAULT_RETENTION,
    Provider,
    Recycle,
    queue_timeout_seconds,
)
from sp00ky_infra.policy import server_types as catalog
from sp00ky_infra.policy.schedules import (
    POLICIES,
    CronError,
    key_problem,
    parse_cron,
    query_problem,
    selected_columns,
)

Path = tuple[str | int, ...]

LOCATIONS = ("fsn1", "nbg1", "hel1", "ash", "hil", "sin")
PROVIDERS: tuple[str, ...] = get_args(Provider)
RECYCLE: tuple[str, ...] = get_args(Recycle)
X86_TYPE = re.compile(r"^(cx|cpx|ccx)[0-9]{2,3}$")
ARM_TYPE = re.compile(r"^cax[0-9]{2,3}$")
MIN_LEASE_SECONDS = 30.0
POOL_DURATIONS = (
    "idleTimeout",
    "lease",
    "maxJobDuration",
    "maxLifetime",
    "bootTimeout",
)  # queueTimeout also takes a number of seconds: rule SP123
RETENTION_DURATIONS = tuple(DEFAULT_RETENTION)


@dataclass(frozen=True, slots=True)
class Finding:
    path: Path
    message: str


@dataclass(frozen=True, slots=True)
class Rule:
    code: str
    name: str
    summary: str
    severity: Severity
    check: Callable[[Mapping[str, Any]], Iterator[Finding]]


RULES: list[Rule] = []


def rule(
    code: str, name: str, summary: str, severity: Severity = "error"
) -> Callable[[Callable[[Mapping[str, Any]], Iterator[Finding]]], Callable[..., Iterator[Finding]]]:
    def register(
        check: Callable[[Mapping[str, Any]], Iterator[Finding]],
    ) -> Callable[..., Iterator[Finding]]:
        taken = next((r for r in RULES if r.code == code), None)
        if taken is not None:  # two branches picking one free number: caught at import
            raise AssertionError(f"rule code {code} is both {taken.name} and {name}")
        RULES.append(Rule(code, name, summary, severity, check))
        return check

    return register


# --- tolerant views of the plain data ------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pools(data: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, pool in _mapping(data.get("pools")).items():
        yield str(name), _mapping(pool)


def backends(data: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, app in _mapping(data.get("apps")).items():
        app = _mapping(app)
        if app.get("type") == "backend":
            yield str(name), app


def pool_of(backend: Mapping[str, Any]) -> str | None:
    pool = _mapping(backend.get("runOn")).get("pool")
    return pool if isinstance(pool, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(value: Any) -> float | None:
    try:
        return parse_duration(value)
    except DurationError:
        return None


def _autoscale(pool: Mapping[str, Any]) -> bool:
    return pool.get("autoscale") is True


def sized_pools(data: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Pools whose sizing mode is known: an ``autoscale`` that is not true or false (``yes
    please``) is the schema's one error, not a cascade of rules that assumed a fixed pool."""
    for name, pool in pools(data):
        if isinstance(pool.get("autoscale", False), bool):
            yield name, pool


# --- references between pools and backends ----------------------------------------------


@rule("SP101", "run-on-unknown-pool", "every runOn.pool names a declared pool")
def run_on_names_a_pool(data: Mapping[str, Any]) -> Iterator[Finding]:
    declared = {name for name, _ in pools(data)}
    for name, backend in backends(data):
        pool = pool_of(backend)
        if pool is not None and pool not in declared:
            known = ", ".join(sorted(declared)) or "none are declared" + _pools_misspelled(data)
            yield Finding(
                ("apps", name, "runOn", "pool"),
                f"backend {name!r} runs on pool {pool!r}, which is not declared under pools "
                f"(declared: {known}); declare it or fix the name",
            )


def _pools_misspelled(data: Mapping[str, Any]) -> str:
    """A hint when the file has no ``pools`` but a top-level key spelled like it (``pool:``),
    which nothing reads: the pools are there, under a name that is ignored."""
    if "pools" in data:
        return ""
    close = difflib.get_close_matches("pools", [str(key) for key in data], n=1)
    return f"; the top-level `{close[0]}` is not read: did you mean `pools`?" if close else ""


@rule("SP102", "pool-unused", "every pool is used by a backend")
def pool_is_used(data: Mapping[str, Any]) -> Iterator[Finding]:
    used = {pool_of(backend) for _, backend in backends(data)}
    for name, _ in pools(data):
        if name not in used:
            yield Finding(
                ("pools", name),
                f"pool {name!r} is used by no backend; add `runOn: {{ pool: {name} }}` to the "
                "backend that should run on it, or remove the pool",
            )


@rule("SP103", "pool-shared", "a pool is used by exactly one backend")
def pool_has_one_backend(data: Mapping[str, Any]) -> Iterator[Finding]:
    users: dict[str, list[str]] = {}
    for name, backend in backends(data):
        pool = pool_of(backend)
        if pool is not None:
            users.setdefault(pool, []).append(name)
    for pool, names in users.items():
        for name in names[1:]:
            yield Finding(
                ("apps", name, "runOn", "pool"),
                f"pool {pool!r} is already used by backend {names[0]!r}; a machine runs exactly "
                "one backend's image, so give each backend its own pool",
            )


# --- what a pool needs from its backend -----------------------------------------------------


def _pool_backends(data: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, backend in backends(data):
        if pool_of(backend) is not None:
            yield name, backend


@rule("SP104", "pool-backend-outbox", "a pool backend has an outbox method with a table")
def pool_backend_has_outbox(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, backend in _pool_backends(data):
        method = _mapping(backend.get("method"))
        if method.get("type") != "outbox":
            yield Finding(
                ("apps", name, "method", "type"),
                f"backend {name!r} runs on a pool, so it needs `method: {{ type: outbox }}`: "
                "pool machines run outbox jobs",
            )
        if not method.get("table"):
            yield Finding(
                ("apps", name, "method", "table"),
                f"backend {name!r} runs on a pool, so its outbox method needs a `table` "
                "(the job table the pool's jobs are rows of)",
            )


@rule("SP105", "pool-backend-port", "a pool backend has a deploy.port")
def pool_backend_has_port(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, backend in _pool_backends(data):
        if "port" not in _mapping(backend.get("deploy")):
            yield Finding(
                ("apps", name, "deploy", "port"),
                f"backend {name!r} runs on a pool, so it needs `deploy.port`: "
                "the port the agent sends jobs to",
            )


@rule("SP106", "pool-backend-image", "a pool backend has a deploy.image or a deploy.dockerfile")
def pool_backend_has_image(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, backend in _pool_backends(data):
        deploy = _mapping(backend.get("deploy"))
        if not deploy.get("dockerfile") and not deploy.get("image"):
            yield Finding(
                ("apps", name, "deploy", "dockerfile"),
                f"backend {name!r} runs on a pool, so it needs `deploy.image` (from a registry, "
                "REGISTRY/NAME:TAG) or `deploy.dockerfile` (built by the controller): "
                "the image each machine runs",
            )


@rule("SP108", "deploy-image-reference", "deploy.image is REGISTRY/NAME:TAG or @sha256:DIGEST")
def deploy_image_is_a_reference(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, backend in backends(data):
        image = _mapping(backend.get("deploy")).get("image")
        if not isinstance(image, str):
            continue  # absent, or the schema's to report
        try:
            parse_image(image)
        except ImageReferenceError as exc:
            yield Finding(
                ("apps", name, "deploy", "image"),
                f"{image!r} is not an image reference: {exc}; write REGISTRY/NAME:TAG or "
                f"REGISTRY/NAME@sha256:DIGEST, e.g. {IMAGE_EXAMPLE}",
            )


@rule(
    "SP107",
    "pool-backend-healthcheck",
    "a pool backend should have a deploy.healthcheck",
    severity="warning",
)
def pool_backend_has_healthcheck(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, backend in _pool_backends(data):
        deploy = _mapping(backend.get("deploy"))
        if not deploy.get("healthcheck") and not _misspelled("healthcheck", deploy):
            yield Finding(
                ("apps", name, "deploy", "healthcheck"),
                f"backend {name!r} has no `deploy.healthcheck`; it will count as ready as soon "
                "as its port accepts connections. Add a path that answers 2xx once it can work",
            )


def _misspelled(key: str, mapping: Mapping[str, Any]) -> bool:
    """Whether ``mapping`` has a key spelled like ``key`` but not it: the schema names that
    typo (SP001), and a second finding about ``key`` missing would only repeat it."""
    others = [str(each) for each in mapping if each != key]
    return bool(difflib.get_close_matches(key, others, n=1))


# Keys of a pool backend that the docs allow and this project reads nowhere, with why: the
# schema accepts them (a typo of them is still caught), and SP109 says they are ignored.
IGNORED_ON_A_POOL: dict[tuple[str, ...], str] = {
    ("baseUrl",): "the agent calls the backend on 127.0.0.1 at `deploy.port`",
    ("method", "schema"): "the table's SurrealQL file is applied by `spky deploy`; this project's "
    "store defines its own job tables",
    ("deploy", "timeout"): "it is the core-host job runner's setting; on a pool a job's deadline "
    "is the pool's `maxJobDuration`",
}


@rule(
    "SP109",
    "pool-backend-ignored-key",
    "keys the docs allow on a pool backend but this project ignores are named",
    severity="warning",
)
def pool_backend_ignored_keys(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, backend in _pool_backends(data):
        for keys, why in IGNORED_ON_A_POOL.items():
            *parents, key = keys
            block = backend
            for parent in parents:
                block = _mapping(block.get(parent))
            if key in block:
                dotted = ".".join(keys)
                yield Finding(
                    ("apps", name, *keys),
                    f"`{dotted}` is allowed by the docs but ignored on a pool backend: {why}",
                )


# --- a backend's env (its sources: config/env_sources.py) -------------------------------------

PLATFORM_ENV = (
    "PORT",
    "SPKY_ENV",
    "SPKY_DB_NS",
    "SPKY_DB_NAME",
)  # the Machine pools docs, "Environment"
SECRET_NAME = re.compile(r"(?i)(secret|token|passw(or)?d|api_?key|private_?key|credential)")


def _env_entries(data: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    for name, backend in backends(data):
        for key, value in _mapping(backend.get("env")).items():
            yield name, str(key), value


@rule("SP140", "env-name", "a backend's env does not set what the machine sets itself")
def env_names(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, key, _ in _env_entries(data):
        if key in PLATFORM_ENV or key.startswith("SPKY_AGENT_"):
            yield Finding(
                ("apps", name, "env", key), f"{key} is set by the machine itself; use another name"
            )


@rule("SP141", "env-vault", "vault references are refused until they are supported")
def env_vault_refused(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, key, value in _env_entries(data):
        if isinstance(value, Mapping) and "vault" in value:
            yield Finding(
                ("apps", name, "env", key, "vault"),
                "vault references are not supported yet; put the secret in the controller's "
                "environment ({fromEnv: NAME}) or in a file on it ({fromFile: PATH}), both "
                "resolved on the controller at deploy",
            )


@rule(
    "SP142",
    "env-inline-secret",
    "a secret-sounding env value is a reference, not written in sp00ky.yml",
    severity="warning",
)
def env_inline_secret(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, key, value in _env_entries(data):
        if SECRET_NAME.search(key) and isinstance(value, str) and value:
            yield Finding(
                ("apps", name, "env", key),
                f"{key} looks like a secret written in sp00ky.yml; use {{fromEnv: {key}}} "
                "or {fromFile: PATH} so that it stays on the controller",
            )


# --- sizing ------------------------------------------------------------------------------------


@rule("SP110", "autoscale-max", "autoscale: true has a max of at least 1")
def autoscale_has_max(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in sized_pools(data):
        if not _autoscale(pool):
            continue
        if "max" not in pool:
            yield Finding(
                ("pools", name, "max"),
                f"pool {name!r} autoscales, so it needs `max` (at least 1): the ceiling on "
                "machines, and so the bill",
            )
        elif (top := _int(pool["max"])) is not None and top < 1:
            yield Finding(
                ("pools", name, "max"),
                f"max is {top}, but an autoscaling pool needs max of at least 1",
            )


@rule("SP111", "min-above-max", "min is not above max")
def min_not_above_max(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in sized_pools(data):
        low, top = _int(pool.get("min", 0)), _int(pool.get("max"))
        if _autoscale(pool) and low is not None and top is not None and low > top:
            yield Finding(
                ("pools", name, "min"),
                f"min ({low}) is above max ({top}); lower min or raise max",
            )


@rule("SP112", "buffer-above-max", "buffer is not above max")
def buffer_not_above_max(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in sized_pools(data):
        buffer, top = _int(pool.get("buffer", 0)), _int(pool.get("max"))
        if _autoscale(pool) and buffer is not None and top is not None and buffer > top:
            yield Finding(
                ("pools", name, "buffer"),
                f"buffer ({buffer}) is above max ({top}); the pool could never hold that many "
                "warm machines. Lower buffer or raise max",
            )


@rule("SP113", "fixed-pool-min", "a fixed pool has min of at least 1")
def fixed_pool_has_min(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in sized_pools(data):
        low = _int(pool.get("min", 0))
        if not _autoscale(pool) and low is not None and low < 1:
            yield Finding(
                ("pools", name, "min"),
                f"pool {name!r} is fixed (no autoscale), so it always runs exactly `min` machines "
                f"and min must be at least 1 (it is {low}); set min, or `autoscale: true` with "
                "a max",
            )


@rule("SP114", "fixed-pool-max-buffer", "a fixed pool has no max or buffer")
def fixed_pool_has_no_max_or_buffer(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in sized_pools(data):
        if _autoscale(pool):
            continue
        for key in ("max", "buffer"):
            if key in pool:
                yield Finding(
                    ("pools", name, key),
                    f"pool {name!r} is fixed (no autoscale), so `{key}` has no effect; remove it, "
                    "or set `autoscale: true`",
                )


@rule("SP115", "slots-min", "slots is at least 1")
def slots_at_least_one(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        slots = _int(pool.get("slots", 1))
        if slots is not None and slots < 1:
            yield Finding(
                ("pools", name, "slots"),
                f"slots is {slots}; a machine runs at least 1 job at a time",
            )


# --- durations -------------------------------------------------------------------------------


@rule("SP120", "duration", "every duration parses")
def durations_parse(data: Mapping[str, Any]) -> Iterator[Finding]:
    places: list[tuple[Path, Any]] = []
    for name, pool in pools(data):
        places += [(("pools", name, key), pool[key]) for key in POOL_DURATIONS if key in pool]
    retention = _mapping(data.get("retention"))
    places += [
        (("retention", key), retention[key]) for key in RETENTION_DURATIONS if key in retention
    ]
    for path, value in places:
        try:
            parse_duration(value)
        except DurationError as exc:
            yield Finding(path, str(exc))


@rule("SP121", "lease-min", "lease is at least 30 seconds")
def lease_at_least_30s(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        seconds = _seconds(pool.get("lease", DEFAULT_LEASE))
        if seconds is not None and seconds < MIN_LEASE_SECONDS:
            yield Finding(
                ("pools", name, "lease"),
                f"lease is {pool['lease']}; it must be at least 30s so that polls can renew it",
            )


@rule("SP122", "lifetime-below-job", "maxLifetime is not shorter than maxJobDuration")
def lifetime_covers_a_job(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        lifetime = _seconds(pool.get("maxLifetime", DEFAULT_MAX_LIFETIME))
        job = _seconds(pool.get("maxJobDuration", DEFAULT_MAX_JOB_DURATION))
        if lifetime is not None and job is not None and lifetime < job:
            yield Finding(
                ("pools", name, "maxLifetime"),
                f"maxLifetime ({pool.get('maxLifetime', DEFAULT_MAX_LIFETIME)}) is shorter than "
                f"maxJobDuration ({pool.get('maxJobDuration', DEFAULT_MAX_JOB_DURATION)}); a "
                "machine must be able to finish its longest job. Raise maxLifetime or lower "
                "maxJobDuration",
            )


@rule("SP123", "queue-timeout", "queueTimeout is a positive number of seconds or a duration")
def queue_timeout_is_positive(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        value = pool.get("queueTimeout")
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            continue  # absent, or of a wrong type: the schema says so
        try:
            queue_timeout_seconds(pool["queueTimeout"])
        except DurationError as exc:
            yield Finding(("pools", name, "queueTimeout"), str(exc))


@rule("SP124", "idle-timeout-zero", "idleTimeout 0 drains a surplus machine once it is idle",
      "warning")  # fmt: skip
def idle_timeout_zero_is_said(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        if "idleTimeout" not in pool or _seconds(pool["idleTimeout"]) != 0:
            continue
        kept = (
            " (on Hetzner, once its paid hour is nearly over: keepPaidHours)"
            if pool.get("provider", DEFAULT_PROVIDER) == "hetzner"
            and pool.get("keepPaidHours", True) is not False
            else ""
        )
        yield Finding(
            ("pools", name, "idleTimeout"),
            f"idleTimeout {pool['idleTimeout']} drains a machine above min and buffer at the "
            f"first tick it has no job{kept}, so a job that comes later waits for a boot; give "
            "it the gap between jobs you expect (e.g. 5m) to keep such a machine warm for them",
        )


# --- limitations, machine shape, providers --------------------------------------------------


@rule("SP130", "cluster-mode", "pools need mode: cluster")
def pools_need_cluster_mode(data: Mapping[str, Any]) -> Iterator[Finding]:
    if any(True for _ in pools(data)) and data.get("mode") != "cluster":
        yield Finding(
            ("mode",),
            f"pools are run by the scheduler, so the project needs `mode: cluster` "
            f"(mode is {data.get('mode', 'unset')!r})",
        )


def _server_type_finding(path: Path, value: Any) -> Iterator[Finding]:
    if not isinstance(value, str):
        return
    if ARM_TYPE.match(value):
        yield Finding(
            path,
            f"{value!r} is an Arm (CAX) server type; the backend image is built for linux/amd64, "
            "so use an x86 type from the CX, CPX or CCX lines (for example cx33)",
        )
    elif not X86_TYPE.match(value):
        yield Finding(
            path,
            f"{value!r} is not a Hetzner Cloud x86 server type; use one from the CX, CPX or CCX "
            "lines (for example cx33, cpx42, ccx23)",
        )


@rule("SP131", "server-type-x86", "machine types are Hetzner x86 types (no Arm CAX)")
def server_types_are_x86(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        machine = _mapping(pool.get("machine"))
        if "type" in machine:
            yield from _server_type_finding(("pools", name, "machine", "type"), machine["type"])
        fallbacks = machine.get("types")
        if isinstance(fallbacks, list):
            for index, value in enumerate(fallbacks):
                yield from _server_type_finding(("pools", name, "machine", "types", index), value)


@rule("SP132", "location", "locations are fsn1, nbg1, hel1, ash, hil or sin")
def locations_are_known(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        locations = _mapping(pool.get("machine")).get("locations")
        if not isinstance(locations, list):
            continue
        for index, value in enumerate(locations):
            if value not in LOCATIONS:
                yield Finding(
                    ("pools", name, "machine", "locations", index),
                    f"{value!r} is not a Hetzner location; use one of {', '.join(LOCATIONS)}",
                )


@rule("SP133", "provider", "provider is hetzner or docker")
def provider_is_known(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        if "provider" in pool and pool["provider"] not in PROVIDERS:
            yield Finding(
                ("pools", name, "provider"),
                f"provider {pool['provider']!r} is not supported; use `hetzner` (a VM per "
                "machine) or `docker` (a container per machine). Hetzner is the only cloud",
            )


@rule("SP134", "recycle", "recycle is job or never")
def recycle_is_known(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        if "recycle" in pool and pool["recycle"] not in RECYCLE:
            yield Finding(
                ("pools", name, "recycle"),
                f"recycle {pool['recycle']!r} is not known; use `job` (a fresh backend process "
                "for every job, the default) or `never` (keep the process up)",
            )


def _machine_types(data: Mapping[str, Any]) -> Iterator[tuple[Path, str]]:
    """Every x86-looking server type a pool names (SP131 speaks of the others)."""
    for name, pool in pools(data):
        machine = _mapping(pool.get("machine"))
        if isinstance(machine.get("type"), str):
            yield ("pools", name, "machine", "type"), machine["type"]
        fallbacks = machine.get("types")
        for index, value in enumerate(fallbacks if isinstance(fallbacks, list) else ()):
            if isinstance(value, str):
                yield ("pools", name, "machine", "types", index), value


def _price_hint(data: Mapping[str, Any], value: str) -> str:
    known = catalog.server_type(value)
    if value in _mapping(data.get("prices")) or (known is not None and known.prices):
        return ""
    return (
        f"; no price is known for it, so its cost shows as unknown: give one under `prices:`, "
        f"e.g. `prices: {{{value}: {{hourly: 0.0104, monthly: 6.49}}}}` (EUR, net)"
    )


@rule("SP135", "server-type-known", "machine types are current Hetzner server types")
def server_types_are_known(data: Mapping[str, Any]) -> Iterator[Finding]:
    for path, value in _machine_types(data):
        if not X86_TYPE.match(value) or value in catalog.SERVER_TYPES:
            continue
        if catalog.is_deprecated(value):
            continue  # SP136
        closest = catalog.closest(value)
        yield Finding(
            path,
            f"{value!r} is not a Hetzner Cloud server type known here (catalog of "
            f"{catalog.CATALOG_DATE}); the closest current ones: {', '.join(closest) or 'none'}",
        )


@rule(
    "SP136", "server-type-deprecated", "a deprecated server type is named with its replacement",
    "warning",
)  # fmt: skip
def server_types_are_current(data: Mapping[str, Any]) -> Iterator[Finding]:
    for path, value in _machine_types(data):
        if not catalog.is_deprecated(value):
            continue
        instead = catalog.replacements(value) or tuple(catalog.closest(value))
        yield Finding(
            path,
            f"{value!r} is deprecated by Hetzner (no longer sold to new servers); use "
            f"{' or '.join(instead)}" + _price_hint(data, value),
        )


@rule("SP137", "server-type-location", "each location sells the pool's server types", "warning")
def server_types_are_sold_there(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        machine = _mapping(pool.get("machine"))
        locations = machine.get("locations")
        kinds = [t for _, t in _machine_types({"pools": {name: pool}}) if catalog.offered(t)]
        for index, value in enumerate(locations if isinstance(locations, list) else ()):
            missing = [t for t in kinds if value in LOCATIONS and value not in catalog.offered(t)]
            if missing:
                yield Finding(
                    ("pools", name, "machine", "locations", index),
                    f"{value!r} does not sell "
                    + ", ".join(f"{t} (sold in {', '.join(catalog.offered(t))})" for t in missing)
                    + "; a machine of that type cannot be made there",
                )


def _machine_images(data: Mapping[str, Any]) -> Iterator[tuple[Path, str]]:
    """Every non-empty ``machine.image`` of a Hetzner pool written as a string (the schema
    speaks of others; a docker pool's machines are containers, which boot no image of it)."""
    for name, pool in pools(data):
        if pool.get("provider", DEFAULT_PROVIDER) != "hetzner":
            continue
        value = _mapping(pool.get("machine")).get("image")
        if isinstance(value, str) and value:
            yield ("pools", name, "machine", "image"), value


@rule("SP138", "machine-image", "machine.image is an image name, a snapshot id or a selector")
def machine_images_are_images(data: Mapping[str, Any]) -> Iterator[Finding]:
    for path, value in _machine_images(data):
        if image_kind(value) is not None:
            continue
        why = ""
        if any(mark in value for mark in "=!(,"):  # meant as a selector: say which term
            try:
                parse_selector(value)
            except SelectorError as exc:
                why = f" ({exc})"
        yield Finding(
            path,
            f"{value!r} is not an image a Hetzner server can boot{why}; give an image name "
            f"({DEFAULT_MACHINE_IMAGE}, debian-12), a snapshot id (its digits) or a label "
            f"selector of snapshots ({SELECTOR_EXAMPLE}: the newest one that matches)",
        )


@rule("SP139", "machine-image-docker", "machine.image has Docker, or boots the slow way", "warning")
def machine_images_have_docker(data: Mapping[str, Any]) -> Iterator[Finding]:
    for path, value in _machine_images(data):
        if has_docker(value) is False:
            yield Finding(
                path,
                f"image {value!r} has no Docker: each machine installs docker.io with apt at "
                "boot before its agent starts, about 30 s more on Hetzner (assumed); use "
                f"{DEFAULT_MACHINE_IMAGE} (the default) or a snapshot with Docker",
            )


@rule("SP150", "machine-image-baked", "machine.image: baked is for Hetzner pools only")
def baked_images_are_hetzner(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, pool in pools(data):
        provider = pool.get("provider", DEFAULT_PROVIDER)
        if provider == "hetzner" or _mapping(pool.get("machine")).get("image") != BAKED:
            continue
        yield Finding(
            ("pools", name, "machine", "image"),
            f"`{BAKED}` is a Hetzner snapshot the controller makes for the pool, but pool "
            f"{name!r} has provider {provider!r}, whose machines boot no image of it; remove "
            "machine.image, or give the pool `provider: hetzner`",
        )


# --- schedules ---------------------------------------------------------------------------------

MIN_INTERVAL_SECONDS = 1.0


def schedules(data: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, schedule in _mapping(data.get("schedules")).items():
        yield str(name), _mapping(schedule)


def _did_you_mean(value: Any, known: list[str]) -> str:
    close = difflib.get_close_matches(str(value), known, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known: {', '.join(known)}" if known else ""


@rule("SP160", "schedule-cadence", "a schedule has cron or every, not both")
def schedule_has_one_cadence(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        given = [key for key in ("cron", "every") if key in schedule]
        if len(given) == 2:
            yield Finding(
                ("schedules", name, "every"),
                f"schedule {name!r} has both cron and every; keep one (cron for times of day, "
                "every for an interval)",
            )
        elif not given:
            yield Finding(
                ("schedules", name),
                f'schedule {name!r} has no cadence; add `cron: "0 3 * * *"` (03:00 UTC daily) '
                "or `every: 5m`",
            )


@rule("SP161", "schedule-cron", "a schedule's cron expression parses")
def schedule_cron_parses(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        if "cron" not in schedule:
            continue
        try:
            parse_cron(schedule["cron"])
        except CronError as exc:
            where = f"the {exc.field} field of {schedule['cron']!r}: " if exc.field else ""
            yield Finding(("schedules", name, "cron"), f"{where}{exc}")


@rule("SP162", "schedule-durations", "a schedule's interval and history windows parse")
def schedule_durations_parse(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        if "every" in schedule:
            try:
                seconds = parse_duration(schedule["every"])
            except DurationError as exc:
                yield Finding(("schedules", name, "every"), str(exc))
            else:
                if seconds < MIN_INTERVAL_SECONDS:
                    yield Finding(
                        ("schedules", name, "every"),
                        f"every {schedule['every']!r} is shorter than 1s; use 1s or more",
                    )
        history = _mapping(schedule.get("history"))
        for key in ("success", "failed"):
            if key in history:
                try:
                    parse_duration(history[key])
                except DurationError as exc:
                    yield Finding(("schedules", name, "history", key), str(exc))


@rule("SP163", "schedule-backend", "a schedule's backend is declared and runs jobs on a pool")
def schedule_backend_runs_jobs(data: Mapping[str, Any]) -> Iterator[Finding]:
    declared = dict(backends(data))
    for name, schedule in schedules(data):
        backend = schedule.get("backend")
        if not isinstance(backend, str):
            continue
        path = ("schedules", name, "backend")
        if backend not in declared:
            yield Finding(
                path,
                f"schedule {name!r} names backend {backend!r}, which is not a backend app"
                + _did_you_mean(backend, sorted(declared)),
            )
            continue
        app = declared[backend]
        method = _mapping(app.get("method"))
        if method.get("type") != "outbox" or not method.get("table"):
            yield Finding(
                path,
                f"backend {backend!r} has no outbox table for the schedule's jobs; give it "
                "`method: { type: outbox, table: job }`",
            )
        elif pool_of(app) is None:
            yield Finding(
                path,
                f"backend {backend!r} runs on no pool, so schedule {name!r}'s jobs could never "
                "run; give the backend `runOn: { pool: NAME }`",
            )


@rule("SP164", "schedule-route", "a schedule's route is a path")
def schedule_route_is_a_path(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        route = schedule.get("route")
        if isinstance(route, str) and not route.startswith("/"):
            yield Finding(
                ("schedules", name, "route"),
                f"route {route!r} is not a path; write it as the backend's spec does, "
                f"like /{route.lstrip('/')}",
            )


@rule("SP165", "schedule-concurrency", "a schedule's concurrency is skip, replace or allow")
def schedule_concurrency_is_known(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        policy = schedule.get("concurrency")
        if "concurrency" in schedule and policy not in POLICIES:
            yield Finding(
                ("schedules", name, "concurrency"),
                f"concurrency {policy!r} is not a policy; use skip (the default), replace or "
                "allow" + _did_you_mean(policy, list(POLICIES)),
            )


@rule("SP166", "schedule-for-each-query", "a fan-out's query is a single SELECT")
def schedule_for_each_query_is_a_select(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        if "forEach" not in schedule:
            continue
        query = _mapping(schedule["forEach"]).get("query")
        problem = query_problem(query) if isinstance(query, str) else None  # else the schema's
        if problem is not None:
            yield Finding(("schedules", name, "forEach", "query"), problem)


@rule("SP168", "schedule-for-each-key", "a fan-out's key is a column of its query's rows")
def schedule_for_each_key_is_a_column(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        if "forEach" not in schedule:
            continue
        for_each = _mapping(schedule["forEach"])
        key, query = for_each.get("key"), for_each.get("query")
        problem = key_problem(key) if key is not None else None  # a missing key: the schema's
        if problem is None and isinstance(query, str) and query_problem(query) is None:
            columns = selected_columns(query)
            if columns is not None and key not in columns:
                problem = (
                    f"key {key!r} is not a column of the query's rows ({', '.join(columns)})"
                    + _did_you_mean(key, list(columns))
                )
        if problem is not None:
            yield Finding(("schedules", name, "forEach", "key"), problem)


@rule("SP169", "schedule-for-each-payload", "a fan-out's payload is an object, or none")
def schedule_for_each_payload_is_an_object(data: Mapping[str, Any]) -> Iterator[Finding]:
    for name, schedule in schedules(data):
        payload = schedule.get("payload")
        if "forEach" in schedule and payload is not None and not isinstance(payload, Mapping):
            key = _mapping(schedule["forEach"]).get("key", "id")
            yield Finding(
                ("schedules", name, "payload"),
                f"a fan-out's payload must be an object: each row's job gets its {key} added "
                f"to it; write `payload: {{ ... }}` or leave it out",
            )


# --- a file shared with the wider platform -------------------------------------------------------
# sp00ky.yml also configures the wider platform, so what this project does not read is named
# (a warning: the file is shared), never dropped in silence. Files a pool backend names are
# checked by config/files.py (it reads the file system), which `lint` runs with these.

# The top-level keys this project reads; the schema describes each (tests/config keep the two
# lists and the schema's top-level properties the same).
READ_KEYS = ("mode", "pools", "apps", "retention", "schedules", "prices")
# Top-level keys the platform's docs give sp00ky.yml and nothing here reads.
PLATFORM_KEYS = ("jobs", "state", "workflows", "slug")
# What to do about a backend without `spec`: lint's warning and `run`'s end with it.
SPEC_FIX = (
    "give the backend `spec: PATH` (its OpenAPI document, relative to sp00ky.yml) so that a "
    "payload is checked before its job is written"
)


@rule("SP170", "top-level-unused", "a top-level key sp00ky-infra does not read is named, once",
      "warning")  # fmt: skip
def top_level_keys_unused(data: Mapping[str, Any]) -> Iterator[Finding]:
    for key in data:
        name = str(key)
        if name in READ_KEYS:
            continue
        if name in PLATFORM_KEYS:
            yield Finding(
                (name,),
                f"`{name}` is not used by sp00ky-infra: the wider platform reads it, and it is "
                "ignored here; keep it if the platform reads this file too",
            )
            continue
        close = difflib.get_close_matches(name, READ_KEYS, n=1)
        hint = (
            f"did you mean {close[0]!r}?"
            if close
            else f"remove it, or use a key read here: {', '.join(READ_KEYS)}"
        )
        yield Finding(
            (name,),
            f"`{name}` is not used by sp00ky-infra, nor a key the platform documents, so it is "
            f"ignored; {hint}",
        )


@rule("SP172", "pool-backend-spec", "a pool backend has a spec, or its payloads go unchecked",
      "warning")  # fmt: skip
def pool_backend_has_spec(data: Mapping[str, Any]) -> Iterator[Finding]:
    unchecked = [name for name, backend in _pool_backends(data) if not backend.get("spec")]
    for name in unchecked:  # as `run` reads it: an empty spec checks nothing either
        yield Finding(
            ("apps", name, "spec"),
            f"backend {name!r} has no `spec`, so its jobs' payloads go unchecked: `run`, "
            "schedules and the admin API write any JSON payload, and only the backend finds "
            f"a wrong one, on a machine; {SPEC_FIX}",
        )


def run_rules(data: Any) -> Iterator[tuple[Rule, Finding]]:
    """Every finding of every rule, in rule order."""
    mapping = _mapping(data)
    for each in RULES:
        for finding in each.check(mapping):
            yield each, finding
