"""Creating jobs from Python: the docs' ``db.run(backend, path, payload, options)``.

    client = Client("sqlite:///.sp00ky/state.db", config="sp00ky.yml")
    job = client.run("renderer", "/render", {"gameId": "g1"}, max_retries=5)

The payload is validated against the backend's OpenAPI spec before any row is written, so a
missing required field is refused at once rather than failing later on a machine.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from sp00ky_infra.config import Backend, Config, Pool
from sp00ky_infra.config.durations import DurationError, format_duration
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE, queue_timeout_seconds
from sp00ky_infra.policy.jobs import (
    MAX_JSON_DEPTH,
    MAX_PAYLOAD_BYTES,
    RetryStrategy,
    bound_problem,
    json_problem,
)
from sp00ky_infra.store import InvalidJob, Job, NewJob, SqlStore, open_store, store_url
from sp00ky_infra.store.capacity import CapacityChanging, KeptCapacity
from sp00ky_infra.store.policies import DEFAULT_MAX_RETRIES, TablePolicy

POLICY_SECONDS = 2.0  # one tick: how stale a client's view of policies and capacities may be


class PayloadTooLarge(InvalidJob):
    """A payload over MAX_PAYLOAD_BYTES as JSON (the admin API answers 413)."""


class Client:
    """Writes jobs into the store, checked against sp00ky.yml and the backends' specs."""

    def __init__(
        self,
        store: str | SqlStore | None = None,
        config: str | Path | Config | None = None,
    ) -> None:
        self.config = config if isinstance(config, Config) else load_config(config)
        # the project's own store by default: .sp00ky/ next to its sp00ky.yml
        beside = Path(self.config.root) / DEFAULT_CONFIG_FILE
        self.store = store if isinstance(store, SqlStore) else open_store(store_url(store, beside))
        self._specs: dict[tuple[str, str], str] = {}  # (root, spec): its path (_spec)
        self._policies: dict[str, TablePolicy] = {}
        self._capacities: dict[str, KeptCapacity] = {}
        self._policies_at = -math.inf

    def close(self) -> None:
        self.store.close()

    def _policy(self, table: str) -> TablePolicy:
        """The table's kept policy (a retune reaches new jobs within POLICY_SECONDS)."""
        self._refresh()
        return self._policies.get(table) or TablePolicy()

    def _capacity(self, pool: str) -> KeptCapacity | None:
        """The pool's kept capacity, as fresh as the policies."""
        self._refresh()
        return self._capacities.get(pool)

    def _refresh(self) -> None:
        """The tables' policies and the pools' capacities, read at most every POLICY_SECONDS."""
        now = time.monotonic()
        if now - self._policies_at > POLICY_SECONDS:
            self._policies = {t: kept.policy for t, kept in self.store.policies.read().items()}
            self._capacities = self.store.capacities.read()
            self._policies_at = now

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def run(
        self,
        backend: str,
        path: str,
        payload: Any = None,
        *,
        max_retries: int | None = None,
        retry_strategy: RetryStrategy | None = None,
        timeout: float | None = None,
        delay: int = 0,
        priority: int | None = None,
        slots: int | None = None,
        assigned_to: str | None = None,
        now: float | None = None,
        queue_priority: int | None = None,
        pool_slots: int | None = None,
        queue_timeout: float | str | None = None,
    ) -> Job:
        """Write a pending job; ``timeout`` in seconds, ``delay`` in milliseconds.

        ``queue_timeout`` (the docs' ``queueTimeout``: seconds, or a duration such as ``30m``)
        is how long the job may wait for a slot; it wins over its pool's ``queueTimeout``.

        ``queue_priority`` and ``pool_slots`` are the docs' names (``queuePriority``,
        ``poolSlots``) for ``priority`` (default 0) and ``slots`` (default 1): give either.
        """
        priority, slots = _checked_options(
            max_retries=DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
            delay=delay,
            timeout=timeout,
            priority=priority,
            queue_priority=queue_priority,
            slots=slots,
            pool_slots=pool_slots,
        )
        _check_json(payload)
        own_wait = None if queue_timeout is None else job_queue_timeout(queue_timeout)
        table, pool = self._destination(backend, path, payload, timeout, slots)
        changing = self._capacity(pool.name) if pool else None
        if changing is not None and changing.draining_from is not None:
            raise CapacityChanging(changing.refusal())
        table_retries, table_strategy = self._policy(table).retries
        max_retries = table_retries if max_retries is None else max_retries
        retry_strategy = retry_strategy or table_strategy
        pool_wait = pool.queue_timeout if pool else None  # the job's own wins
        new = NewJob(
            backend=backend,
            table=table,
            path=path,
            payload=payload,
            max_retries=max_retries,
            retry_strategy=retry_strategy,
            delay_ms=delay,
            timeout=timeout,
            priority=priority,
            slots=slots,
            pool=pool.name if pool else None,
            assigned_to=assigned_to,
            queue_timeout=own_wait if own_wait is not None else pool_wait,
            max_job_duration=pool.max_job_duration if pool else None,
        )
        return self.store.enqueue(
            new, time.time() if now is None else now, max_queued=pool.max_queued if pool else None
        )

    def _destination(
        self, backend: str, path: str, payload: Any, timeout: float | None, slots: int
    ) -> tuple[str, Pool | None]:
        """The backend's outbox table and pool, once the backend, its spec and its pool's
        machines accept the job (InvalidJob naming the first that does not)."""
        target = self._backend(backend)
        if target.method is None:
            raise InvalidJob(
                f"backend: {backend!r} has no outbox method; jobs need "
                "`method: { type: outbox, table: NAME }` on the backend"
            )
        if target.pool is None:
            raise InvalidJob(
                f"backend: {backend!r} has no `runOn: {{ pool: NAME }}`, so no pool would ever "
                "run its jobs and nothing was written; point it at a pool in sp00ky.yml"
            )
        if target.spec:
            check_payload(self._spec(target), backend, path, payload)
        pool = self.config.pools.get(target.pool) if target.pool else None
        if pool is not None:
            _check_fits(pool, target, backend, timeout, slots)
        return target.method.table, pool

    def _spec(self, backend: Backend) -> str:
        """The path of ``backend``'s OpenAPI spec (worked out once a spec: a job's way to its
        machine starts here, and resolving a path touches the file system)."""
        key = (self.config.root, backend.spec or "")
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = self.config.resolve(key[1])
        return spec

    def _backend(self, name: str) -> Backend:
        backend = self.config.backends.get(name)
        if backend is None:
            known = ", ".join(sorted(self.config.backends)) or "none"
            raise InvalidJob(f"backend: no backend {name!r} in sp00ky.yml (backends: {known})")
        return backend


def _checked_options(
    *,
    max_retries: int,
    delay: int,
    timeout: float | None,
    priority: int | None,
    queue_priority: int | None,
    slots: int | None,
    pool_slots: int | None,
) -> tuple[int, int]:
    """The job's priority and slots, each under either name, once every option is within its
    bounds (named as the caller gave it)."""
    names = {
        "priority": "queue_priority" if priority is None and queue_priority is not None else "",
        "slots": "pool_slots" if slots is None and pool_slots is not None else "",
    }
    chosen_priority = either(("priority", "queue_priority"), priority, queue_priority, default=0)
    chosen_slots = either(("slots", "pool_slots"), slots, pool_slots, default=1)
    check_options(
        max_retries=max_retries,
        priority=chosen_priority,
        delay_ms=delay,
        slots=chosen_slots,
        timeout=timeout,
        names={field: name for field, name in names.items() if name},
    )
    return chosen_priority, chosen_slots


def _check_json(payload: Any) -> None:
    """InvalidJob unless the payload is JSON; PayloadTooLarge over MAX_PAYLOAD_BYTES."""
    problem = json_problem(payload, "payload")
    if problem is not None:
        raise InvalidJob(problem)
    size = len(json.dumps(payload).encode())
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"payload: {size} bytes as JSON, more than the limit of {MAX_PAYLOAD_BYTES} "
            "(1 MiB); store large inputs elsewhere and pass a reference"
        )


def _check_fits(
    pool: Pool, target: Backend, backend: str, timeout: float | None, slots: int
) -> None:
    """InvalidJob when the job's timeout or slots do not fit the pool's machines."""
    if timeout is not None and timeout > pool.max_job_duration and not target.timeout_overridable:
        raise InvalidJob(
            f"timeout: {format_duration(timeout)} is longer than pool {pool.name}'s "
            f"maxJobDuration ({format_duration(pool.max_job_duration)}); shorten it, "
            f"or set `timeoutOverridable: true` on backend {backend} (a job still "
            "never runs longer than maxJobDuration)"
        )
    if slots > pool.slots:
        raise InvalidJob(
            f"slots: the job asks for {slots} slots but a machine of pool {pool.name!r} "
            f"has {pool.slots}; a job must fit on one machine"
        )


def check_options(
    *,
    max_retries: int,
    priority: int,
    delay_ms: int,
    slots: int,
    timeout: float | None,
    names: dict[str, str] | None = None,
) -> None:
    """Raise InvalidJob naming the first option out of its bounds (docs/jobs.md, "Limits")."""
    for field, value in (
        ("max_retries", max_retries),
        ("priority", priority),
        ("delay", delay_ms),
        ("slots", slots),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            name = (names or {}).get(field, field)
            raise InvalidJob(f"{name}: must be a whole number, not {value!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise InvalidJob(f"timeout: must be a number of seconds, not {timeout!r}")
    problem = bound_problem(
        max_retries=max_retries,
        priority=priority,
        delay_ms=delay_ms,
        slots=slots,
        timeout=timeout,
        names=names,
    )
    if problem is not None:
        raise InvalidJob(problem)


def job_queue_timeout(value: float | str) -> float:
    """A job's own queueTimeout in seconds, or InvalidJob saying how to write one."""
    try:
        return queue_timeout_seconds(value)
    except DurationError as exc:
        raise InvalidJob(f"queue_timeout: {exc}") from exc


def either(names: tuple[str, str], first: int | None, second: int | None, default: int) -> int:
    """One setting given under today's name or the docs' (``priority`` / ``queuePriority``):
    either, or both with the same value; two different values are refused, naming both."""
    if first is not None and second is not None and first != second:
        raise InvalidJob(
            f"{names[0]} ({first}) and {names[1]} ({second}) are two names for one setting "
            "and disagree; give one of them"
        )
    for value in (first, second):
        if value is not None:
            return value
    return default


def _spec_version(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError as exc:
        raise InvalidJob(f"spec: cannot read the backend's OpenAPI spec {path}: {exc}") from exc


@functools.lru_cache(maxsize=64)
def _parse_spec(path: str, modified: int) -> dict[str, Any]:
    """Parsed once per version of the file (``modified`` is part of the cache key)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidJob(f"spec: cannot read the backend's OpenAPI spec {path}: {exc}") from exc
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidJob(f"spec: {path} is not valid YAML or JSON: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("paths"), dict):
        raise InvalidJob(f"spec: {path} has no `paths`; is it an OpenAPI document?")
    return spec


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


def check_payload(spec_path: str, backend: str, path: str, payload: Any) -> None:
    """Raise InvalidJob naming every field of ``payload`` that the spec's POST body refuses."""
    modified = _spec_version(spec_path)
    spec = _parse_spec(spec_path, modified)
    operation = (spec["paths"].get(path) or {}).get("post")
    if operation is None:
        routes = ", ".join(
            route for route, ops in spec["paths"].items() if isinstance(ops, dict) and "post" in ops
        )
        raise InvalidJob(
            f"path: backend {backend}'s spec has no POST {path}; "
            f"its POST routes: {routes or 'none'}"
        )
    body = (operation.get("requestBody") or {}).get("content", {}).get("application/json")
    if body is None or "schema" not in body:
        return
    if payload is None and (operation.get("requestBody") or {}).get("required"):
        raise InvalidJob(
            f"payload: refused by backend {backend}'s spec (POST {path}): a payload is "
            "required and none was given; pass one (run --payload JSON)"
        )
    validator = _payload_validator(spec_path, modified, path)
    problems = sorted(validator.iter_errors(payload), key=lambda e: list(map(str, e.path)))
    if problems:
        lines = "; ".join(_describe(error) for error in problems)
        raise InvalidJob(f"payload: refused by backend {backend}'s spec (POST {path}): {lines}")


@functools.lru_cache(maxsize=256)
def _payload_validator(spec_path: str, modified: int, path: str) -> Draft202012Validator:
    """The validator of POST ``path``'s body, made once per version of the spec (a job's
    ``run`` validates its payload, and making a validator, with its schema reached through a
    $ref, costs several times one validation); its errors name the fields."""
    return Draft202012Validator(_payload_document(spec_path, modified, path))


def _payload_document(spec_path: str, modified: int, path: str) -> Any:
    """What POST ``path``'s body is validated against: its schema, or, where the schema has
    $refs of its own, the whole spec as the root resource, so that $refs into
    #/components/... resolve (unknown top-level keys such as openapi and paths are
    ignored)."""
    spec = _parse_spec(spec_path, modified)
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    text = json.dumps(schema)
    if '"$ref"' not in text and '"$dynamicRef"' not in text:
        return schema
    pointer = _pointer(
        "paths", path, "post", "requestBody", "content", "application/json", "schema"
    )
    return {**spec, "$ref": pointer}


def _describe(error: ValidationError) -> str:
    where = "payload" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    expected: Any = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in expected if name not in error.instance]
        return ", ".join(f"{where}.{name} is required" for name in missing)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set((error.schema or {}).get("properties", {}))  # type: ignore[union-attr]
        extra = sorted(set(error.instance) - allowed)
        return ", ".join(f"{where}.{name} is not a field of this route" for name in extra)
    return f"{where}: {error.message}"


def payload_from_text(text: str | None) -> Any:
    """``--payload`` text as JSON, with an error that names the option."""
    if text is None:
        return None
    try:
        payload = json.loads(text)  # NaN and Infinity parse: json_problem names where
    except json.JSONDecodeError as exc:
        raise InvalidJob(f"--payload: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    except RecursionError as exc:
        raise InvalidJob(
            f"--payload: nested deeper than {MAX_JSON_DEPTH} levels of objects and arrays; "
            "flatten it"
        ) from exc
    except ValueError as exc:  # an integer of over 4300 digits
        raise InvalidJob(f"--payload: {exc}") from exc
    problem = json_problem(payload, "payload")
    if problem is not None:
        raise InvalidJob(f"--payload: {problem}")
    return payload
