"""The admin API: separate from the agents' endpoint, and authenticated (a bearer token)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from sp00ky_infra import __version__
from sp00ky_infra.client import PayloadTooLarge
from sp00ky_infra.controller import admin, explain, schedules
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.errors import AGENT_STATUS, ControllerError, Unauthorized, http_status
from sp00ky_infra.controller.metrics import CONTENT_TYPE, exposition
from sp00ky_infra.policy import jobs as limits
from sp00ky_infra.store import JobNotFound, StoreError
from sp00ky_infra.store.schedule_views import schedule_view, schedule_views

# What each error answers with; ``http_status`` takes the exception's most specific class
# listed here. Checked in one place, ``problem`` below.
ADMIN_STATUS: Mapping[type[Exception], int] = {
    **AGENT_STATUS,
    admin.NotFound: 404,  # no such pool or machine
    JobNotFound: 404,
    PayloadTooLarge: 413,  # the payload itself, within a body under the body's limit
    StoreError: 409,  # the store refused: a conflict, an invalid job, a full queue
}


def _priority() -> Any:
    return Field(default=None, ge=-limits.PRIORITY_BOUND, le=limits.PRIORITY_BOUND)


def _slots() -> Any:
    return Field(default=None, ge=1, le=limits.MAX_SLOTS)


class StartJob(BaseModel):
    """A manual start's body: `run`'s options. ``queuePriority`` and ``poolSlots`` are the
    docs' names for ``priority`` and ``slots``; give either (both must agree). An unknown
    field is refused (422) rather than dropped. Every number is bounded (docs/jobs.md, "Limits":
    the bounds of policy/jobs.py), so the schema says them and a 422 names the field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    path: str
    payload: Any = None
    priority: int | None = _priority()
    queuePriority: int | None = _priority()  # the docs' spelling
    slots: int | None = _slots()
    poolSlots: int | None = _slots()  # the docs' spelling
    max_retries: int | None = Field(
        default=None, ge=0, le=limits.MAX_RETRIES, description="default: the table's policy (3)"
    )
    retry_strategy: Literal["linear", "exponential"] | None = Field(
        default=None, description="default: the table's policy (linear)"
    )
    delay: int = Field(default=0, ge=0, le=limits.MAX_DELAY_MS, description="milliseconds")
    timeout: float | None = Field(
        default=None, gt=0, le=limits.MAX_TIMEOUT_SECONDS, description="seconds"
    )
    assigned_to: str | None = None
    # seconds or a duration (30m), checked by Client.run like `run --queue-timeout`
    queueTimeout: int | float | str | None = None  # 1800 stays 1800 in messages


class PolicyChange(BaseModel):
    """A live change of a table's job policy: the fields given change, a null clears one
    (concurrency: no cap; retries: the default)."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = Field(default=None, ge=1)
    max_retries: int | None = Field(default=None, ge=0, le=limits.MAX_RETRIES)
    retry_strategy: Literal["linear", "exponential"] | None = None


def admin_app(controller: Controller) -> FastAPI:
    def authorized(authorization: Annotated[str | None, Header()] = None) -> None:
        expected = f"Bearer {controller.settings.admin_token}".encode()
        # compare bytes: compare_digest refuses str with non-ASCII (a header's bytes arrive as
        # Latin-1 text, so any byte an attacker sends round-trips)
        offered = (authorization or "").encode("latin-1", "replace")
        if not authorization or not hmac.compare_digest(offered, expected):
            raise Unauthorized("send the admin token as `Authorization: Bearer <token>`")

    app = FastAPI(
        title="sp00ky admin API",
        description="Pools: capacity, machines, queue, breaker, incidents; pause, drain, cancel, "
        "reset a breaker. "
        "Schedules: pause, resume.",
        version=__version__,
        dependencies=[Depends(authorized)],
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(ControllerError)
    @app.exception_handler(StoreError)
    async def problem(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=http_status(exc, ADMIN_STATUS))

    @app.get("/pools")
    def pools() -> list[dict[str, Any]]:
        return admin.pools_view(controller)

    @app.get("/pools/{name}")
    def pool(name: str) -> dict[str, Any]:
        return admin.pool_view(controller, name)

    @app.get("/pools/{name}/explain")
    def explain_pool(name: str) -> dict[str, Any]:
        return explain.pool(controller, name)

    @app.get("/jobs/{key}/explain")
    def explain_job(key: str) -> dict[str, Any]:
        return explain.job(controller, key)

    @app.post("/pools/{name}/pause")
    def pause(name: str) -> dict[str, Any]:
        return admin.set_paused(controller, name, True)

    @app.post("/pools/{name}/resume")
    def resume(name: str) -> dict[str, Any]:
        return admin.set_paused(controller, name, False)

    @app.post("/pools/{name}/reset")
    def reset(name: str) -> dict[str, Any]:
        """Close the pool's breaker (after fixing what failed its boots): machines may be
        created again at once; a resume does not close it."""
        return admin.reset_breaker(controller, name)

    def known_schedule(name: str) -> None:
        if name not in controller.config.schedules:
            known = ", ".join(sorted(controller.config.schedules)) or "none"
            raise admin.NotFound(f"no schedule {name!r} (schedules: {known})")

    def schedule_paused(name: str, paused: bool) -> dict[str, Any]:
        known_schedule(name)
        return schedules.set_paused(controller, name, paused)

    @app.get("/schedules")
    def schedule_list() -> list[dict[str, Any]]:
        """Every schedule: cadence, pause, next fire time and totals (`schedules list`)."""
        names = sorted(controller.config.schedules)
        return schedule_views(controller.config, controller.store, names, controller.clock())

    @app.get("/schedules/{name}")
    def schedule_get(name: str, runs: int = Query(default=10, ge=0, le=1000)) -> dict[str, Any]:
        """One schedule with its most recent runs (`schedules get`)."""
        known_schedule(name)
        return schedule_view(controller.config, controller.store, name, controller.clock(), runs)

    @app.post("/schedules/{name}/pause")
    def pause_schedule(name: str) -> dict[str, Any]:
        """Pause a schedule: it makes no fire until resumed (no restart or deploy resumes it)."""
        return schedule_paused(name, True)

    @app.post("/schedules/{name}/resume")
    def resume_schedule(name: str) -> dict[str, Any]:
        """Resume a paused schedule; the fire times it missed while paused are not made."""
        return schedule_paused(name, False)

    @app.post("/machines/{name}/drain")
    def drain(name: str) -> dict[str, Any]:
        return admin.drain_machine(controller, name)

    @app.post("/pools/{name}/queue/{key}/cancel")
    def cancel(name: str, key: str) -> dict[str, Any]:
        return admin.cancel_queued(controller, name, key)

    @app.post("/pools/{name}/jobs", status_code=202)
    def start(name: str, body: StartJob) -> dict[str, Any]:
        job = admin.start_job(controller, name, body.model_dump())
        return {"queued": True, "queueId": job.id, "pool": name}

    @app.get("/jobs/policies")
    def job_policies() -> list[dict[str, Any]]:
        """Each outbox table's job policy (`jobs policy`)."""
        return admin.job_policies(controller)

    @app.patch("/jobs/policies/{table}")
    def retune(table: str, body: PolicyChange) -> dict[str, Any]:
        """Retune a table's job policy live: the next tick admits by it."""
        return admin.retune(controller, table, body.model_dump(exclude_unset=True))

    @app.get("/jobs")
    def jobs(
        status: str | None = None,
        limit: int = Query(default=100, ge=1, le=10_000),
        table: str | None = None,
        pool: str | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs, newest first (`jobs list`), optionally of one status, table or pool."""
        return admin.jobs_view(controller, status, limit, table, pool)

    @app.get("/jobs/{key}")
    def job(key: str) -> dict[str, Any]:
        """One job in full (`jobs get`)."""
        return controller.store.get(key).as_json()

    @app.post("/jobs/{key}/kill")
    def kill(key: str) -> dict[str, Any]:
        return admin.kill_job(controller, key)

    @app.post("/jobs/{key}/retry")
    def retry(key: str) -> dict[str, Any]:
        return admin.retry_job(controller, key)

    @app.get("/metrics", response_class=Response)
    def metrics() -> Response:
        """Prometheus' text format (docs/operations.md, "Metrics")."""
        return Response(exposition(controller), media_type=CONTENT_TYPE)

    @app.get("/stats")
    def stats(since: str | None = None, table: str | None = None) -> dict[str, Any]:
        """The hourly counters retention folds rows into (`jobs stats`): each hour's count
        per table and outcome, and the totals. ``since``: 24h, 2026-11-30 or a unix time."""
        return admin.stats_view(controller, since, table)

    @app.get("/incidents")
    def incidents() -> list[dict[str, Any]]:
        return [incident.as_json() for incident in controller.store.pools.incidents()]

    @app.get("/events")
    def events(limit: int = 50) -> list[dict[str, Any]]:
        return [
            {"id": e.id, "at": e.at, "pool": e.pool, "kind": e.kind, "message": e.message}
            for e in controller.recent_events(limit)
        ]

    return app
