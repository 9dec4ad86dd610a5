"""The pool listener: the agents' endpoint, versioned JSON under /v1 (OpenAPI at
/v1/openapi.json). Machines only ever dial out to it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

from fastapi import FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sp00ky_infra import __version__
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.errors import AGENT_STATUS, ControllerError, Unauthorized, http_status
from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.controller.protocol import (
    Ack,
    JoinReply,
    JoinRequest,
    PollReply,
    PollRequest,
    Problem,
    ReadyRequest,
    RejoinRequest,
    ResultAck,
    ResultReply,
    ResultRequest,
)

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": Problem, "description": text}
    for code, text in {
        401: "bad join token, session or machine credential",
        409: "stale attempt, a state that does not allow it, or an image not served here",
        410: "the machine is failed or destroyed: shut down",
        503: "not the leader: retry",
    }.items()
}


def _session(authorization: str | None) -> str:
    # A header's bytes arrive as Latin-1 text: a session is ASCII, anything else is refused
    if not authorization or not authorization.startswith("Bearer ") or not authorization.isascii():
        raise Unauthorized("send the session as `Authorization: Bearer <session>`")
    return authorization.removeprefix("Bearer ").strip()


def agents_app(controller: Controller, hub: Hub) -> FastAPI:
    app = FastAPI(
        title="sp00ky pool listener",
        description="The endpoint pool machines' agents dial: join, poll, results.",
        version=__version__,
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(ControllerError)
    async def problem(_: Request, exc: ControllerError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=http_status(exc, AGENT_STATUS))

    @app.get("/v1/health")
    def health() -> dict[str, object]:
        return {"ok": True, "leader": controller.leader}

    @app.post("/v1/join", responses=ERRORS)
    def join(body: JoinRequest) -> JoinReply:
        """Trade the machine's one-time join token for a session, the backend and its env."""
        return controller.join(body.machine, body.token)

    @app.post("/v1/machines/{name}/rejoin", responses=ERRORS)
    def rejoin(name: str, body: RejoinRequest) -> JoinReply:
        """After a reboot or a restart: trade the machine credential of the first join for a
        new session (the reply of a join, without a new credential). 401 for another
        credential or an unknown machine, 410 for a failed or destroyed one."""
        return controller.rejoin(name, body.credential)

    @app.post("/v1/machines/{name}/ready", responses=ERRORS)
    def ready(
        name: str, body: ReadyRequest, authorization: Annotated[str | None, Header()] = None
    ) -> Ack:
        """The backend answers its healthcheck (ok), or never will (a failed boot)."""
        controller.ready(name, _session(authorization), body.ok, body.reason)
        return Ack(ok=True)

    pools_of: dict[str, str] = {}  # machine -> pool, for the long-polls' wake-ups

    @app.post("/v1/machines/{name}/poll", responses=ERRORS, response_model=PollReply)
    async def poll(
        name: str, body: PollRequest, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        """Record the results it carries, renew leases; answer with work, stops and drain,
        waiting up to ``wait`` seconds (at most a third of the lease) when there is nothing to
        say yet. The reply is serialized once, not validated again on its way out."""
        session = _session(authorization)
        loop = asyncio.get_running_loop()
        pool = ""
        if body.wait > 0:  # a machine's pool never changes: looked up once, not every poll
            pool = pools_of.get(name, "") or await run_in_threadpool(controller.pool_of, name)
            if pool:  # known machines only, and a bounded memory of them
                if len(pools_of) >= 10_000:
                    pools_of.clear()
                pools_of[name] = pool
        limit = controller.poll_wait(controller.pools[pool]) if pool in controller.pools else 0.0
        deadline = loop.time() + min(body.wait, limit)
        renew = True  # results, leases and the machine's last sighting: once a request
        acks: list[ResultAck] = []
        while True:
            woken = hub.waiter(name, pool)
            try:
                reply = await run_in_threadpool(controller.poll, name, session, body, renew=renew)
                if renew:
                    acks, renew = reply.results, False
                left = deadline - loop.time()
                if reply.assignments or reply.stop or reply.drain or left <= 0:
                    reply.results = acks  # the results were recorded by the first pass
                    return Response(reply.model_dump_json(), media_type="application/json")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=left)
            finally:
                hub.done(name, woken)

    @app.post("/v1/machines/{name}/jobs/{job}/attempts/{attempt}/result", responses=ERRORS)
    def result(
        name: str,
        job: str,
        attempt: str,
        body: ResultRequest,
        authorization: Annotated[str | None, Header()] = None,
    ) -> ResultReply:
        """What the backend answered for this attempt; refused (409) if it is not current."""
        status = controller.result(name, _session(authorization), job, attempt, body)
        return ResultReply(job_status=status)

    @app.get(
        "/v1/machines/{name}/images/{image_id}",
        responses={**ERRORS, 200: {"content": {"application/x-tar": {}}}},
        response_class=StreamingResponse,
    )
    def image(
        name: str, image_id: str, authorization: Annotated[str | None, Header()] = None
    ) -> StreamingResponse:
        """The pool's image, built by this controller, as a ``docker save`` tar: streamed
        (never held whole), for the machine to load and check against ``image_id``."""
        chunks = controller.image(name, _session(authorization), image_id)
        return StreamingResponse(chunks, media_type="application/x-tar")

    @app.post("/v1/machines/{name}/drained", responses=ERRORS)
    def drained(name: str, authorization: Annotated[str | None, Header()] = None) -> Ack:
        """The agent finished its jobs after a drain and is leaving."""
        controller.drained(name, _session(authorization))
        return Ack(ok=True)

    return app
