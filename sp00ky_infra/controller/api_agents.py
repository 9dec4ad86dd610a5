"""The pool listener: the agents' endpoint, versioned JSON under /v1 (OpenAPI at
/v1/openapi.json). Machines only ever dial out to it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from sp00ky_infra import __version__
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.errors import AGENT_STATUS, ControllerError, Unauthorized, http_status
from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.controller.limits import Receive, Scope, Send, send_json
from sp00ky_infra.controller.protocol import (
    Ack,
    BootFailure,
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

T = TypeVar("T")

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": Problem, "description": text}
    for code, text in {
        401: "bad join token, session or machine credential",
        409: "stale attempt, a state that does not allow it, or an image not served here",
        410: "the machine is failed or destroyed: shut down",
        503: "not the leader: retry",
    }.items()
}


def _session(authorization: str | None, what: str = "session") -> str:
    # A header's bytes arrive as Latin-1 text: a session is ASCII, anything else is refused
    if not authorization or not authorization.startswith("Bearer ") or not authorization.isascii():
        raise Unauthorized(f"send the {what} as `Authorization: Bearer <{what}>`")
    return authorization.removeprefix("Bearer ").strip()


async def _inline(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return call(*args, **kwargs)


class Polls:
    """The agents' two hot operations, the long-poll and the result, for both ways in: the
    framework's routes and ``HotRoutes``. On an embedded store (SQLite) the event loop makes
    the store calls itself (microseconds each; a thread hand-off cost more than the call);
    on PostgreSQL they go to the thread pool, since a round trip must not hold the loop."""

    def __init__(self, agents: Agents, hub: Hub) -> None:
        self.agents = agents
        self.hub = hub
        self.pools_of: dict[str, str] = {}  # machine -> pool, for the long-polls' wake-ups
        self.call = _inline if agents.store.embedded else run_in_threadpool

    async def poll(self, name: str, authorization: str | None, body: PollRequest) -> bytes:
        agents, controller, hub = self.agents, self.agents.controller, self.hub
        session = _session(authorization)
        if body.beside:
            return await self._beside(name, session, body)
        loop = asyncio.get_running_loop()
        pool = ""
        if body.wait > 0:  # a machine's pool never changes: looked up once, not every poll
            pool = self.pools_of.get(name, "") or await self.call(controller.pool_of, name)
            if pool:  # known machines only, and a bounded memory of them
                if len(self.pools_of) >= 10_000:
                    self.pools_of.clear()
                self.pools_of[name] = pool
        limit = agents.poll_wait(controller.pools[pool]) if pool in controller.pools else 0.0
        deadline = loop.time() + min(body.wait, limit)
        # The first pass takes the results, leases and the machine's last sighting (once a
        # request); the passes after each wake-up only look for cancels, drain and work.
        step: Callable[[str, str, PollRequest], PollReply] = agents.poll
        acks: list[ResultAck] | None = None
        while True:
            woken = hub.waiter(name, pool, offers=body.free_slots > 0)
            try:
                freed = hub.answer_now(name)  # this pass answers, and fills the slot freed
                asked = self._asked(pool, body, freed)
                reply = await self.call(step, name, session, asked)
                claimed = len(reply.assignments)
                # a refill asks for the pool's slots (the store caps the claim): what it
                # claims counts as all its free slots taken, so the next machine is called
                refilled = asked is not body and claimed > 0
                hub.looked(name, pool, claimed, claimed if refilled else asked.free_slots)
                if acks is None:
                    acks, step = reply.results, agents.look
                left = deadline - loop.time()
                if reply.assignments or reply.stop or reply.drain or left <= 0 or freed:
                    reply.results = acks  # the results were recorded by the first pass
                    return reply.model_dump_json().encode()
                await hub.wait(woken, left)
            finally:
                hub.done(name, woken)

    async def _beside(self, name: str, session: str, body: PollRequest) -> bytes:
        """A poll beside the machine's held one: one pass, answered at once, outside the
        hub (the held poll is the machine's waiting one). A slot it leaves unclaimed (no work
        due), or frees for no work now (no ``refill``), makes the held poll answer, so that
        the agent polls again with it."""
        reply = await self.call(self.agents.poll, name, session, body)
        if not body.refill or len(reply.assignments) < body.free_slots:
            self.hub.freed(name)
        return reply.model_dump_json().encode()

    def _asked(self, pool: str, body: PollRequest, freed: bool) -> PollRequest:
        """The poll a pass looks with: after a result posted on its own freed a slot, and
        the agent takes work there (``refill``), with all the pool's slots free: the claim
        is capped by the jobs the store has the machine run, so it fills the freed ones."""
        known = self.agents.controller.pools.get(pool)
        if not (freed and body.refill) or known is None or body.free_slots >= known.slots:
            return body
        return body.model_copy(update={"free_slots": known.slots})

    async def result(
        self, name: str, authorization: str | None, job: str, attempt: str, body: ResultRequest
    ) -> bytes:
        session = _session(authorization)
        status = await self.call(self.agents.result, name, session, job, attempt, body)
        return ResultReply(job_status=status).model_dump_json().encode()


POLL_PATH = re.compile(r"/v1/machines/([^/]+)/poll")
RESULT_PATH = re.compile(r"/v1/machines/([^/]+)/jobs/([^/]+)/attempts/([^/]+)/result")


class HotRoutes:
    """ASGI in front of the agents' app: a poll and a result (all of an agent's traffic under
    load) are parsed, validated and answered here, without the framework's routing,
    dependency solving and response validation (most of a poll's CPU). Same shapes, same
    statuses: 422 ``{"detail": [...]}`` for a body its model refuses, ``{"error": ...}`` with
    the status of ``AGENT_STATUS`` for the controller's refusals. Every other request goes
    to the app."""

    def __init__(self, app: FastAPI, polls: Polls) -> None:
        self.app = app
        self.polls = polls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if (poll := POLL_PATH.fullmatch(path)) is not None:
                await self._serve(scope, receive, send, PollRequest, poll.groups())
                return
            if (result := RESULT_PATH.fullmatch(path)) is not None:
                await self._serve(scope, receive, send, ResultRequest, result.groups())
                return
        await self.app(scope, receive, send)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        model: type[PollRequest] | type[ResultRequest],
        params: tuple[str, ...],
    ) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = dict(scope["headers"])
        kind = headers.get(b"content-type", b"application/json").split(b";")[0].strip()
        authorization = headers.get(b"authorization")
        try:
            if kind != b"application/json" and not kind.endswith(b"+json"):
                raise _not_json(kind)
            request = model.model_validate_json(body)
            header = None if authorization is None else authorization.decode("latin-1")
            if isinstance(request, PollRequest):
                status, answer = 200, await self.polls.poll(params[0], header, request)
            else:
                name, job, attempt = params
                status, answer = 200, await self.polls.result(name, header, job, attempt, request)
        except ValidationError as exc:
            status, answer = 422, _detail(exc)
        except ControllerError as exc:
            status = http_status(exc, AGENT_STATUS)
            answer = json.dumps({"error": str(exc)}).encode()
        await send_json(send, status, answer)


def _not_json(kind: bytes) -> ValidationError:
    return ValidationError.from_exception_data(
        "body",
        [
            {
                "type": "model_attributes_type",
                "loc": (),
                "input": kind.decode("latin-1"),
            }
        ],
    )


def _detail(exc: ValidationError) -> bytes:
    """The framework's 422 (loc, msg, type; each ``loc`` starting at ``body``), without the
    input: it may be bytes that are no text at all."""
    errors = [
        {"loc": ["body", *error["loc"]], "msg": error["msg"], "type": error["type"]}
        for error in exc.errors(include_url=False, include_context=False, include_input=False)
    ]
    return json.dumps({"detail": errors}).encode()


def agents_app(controller: Controller, hub: Hub) -> HotRoutes:
    agents = Agents(controller, hub)
    app = FastAPI(
        title="sp00ky pool listener",
        description="The endpoint pool machines' agents dial: the agent, join, poll, results.",
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
        return agents.join(body.machine, body.token, body.agent)

    @app.post("/v1/machines/{name}/rejoin", responses=ERRORS)
    def rejoin(name: str, body: RejoinRequest) -> JoinReply:
        """After a reboot or a restart: trade the machine credential of the first join for a
        new session (the reply of a join, without a new credential). 401 for another
        credential or an unknown machine, 410 for a failed or destroyed one."""
        return agents.rejoin(name, body.credential, body.agent)

    @app.get(
        "/v1/machines/{name}/agent",
        responses={**ERRORS, 200: {"content": {"application/x-bzip2": {}}}},
        response_class=Response,
    )
    def agent(name: str, authorization: Annotated[str | None, Header()] = None) -> Response:
        """The agent archive (tar.bz2), for the machine's bootstrap to check against the
        sha256 its user-data pins, then install; and for a joined agent that upgrades itself
        to the sha256 of its join or poll reply's `agent`. Authorized by the machine's join
        token (`Authorization: Bearer <join token>`) until the machine joins (the join still
        spends it), then by its session. 401 for a bad token or session, or an unknown
        machine."""
        archive = agents.agent_archive(name, _session(authorization, "join token or session"))
        return Response(archive, media_type="application/x-bzip2")

    @app.post("/v1/machines/{name}/boot-failed", responses=ERRORS)
    def boot_failed(
        name: str, body: BootFailure, authorization: Annotated[str | None, Header()] = None
    ) -> Ack:
        """The bootstrap did not install the agent (its sha256 is not the user-data's, or its
        install failed): the machine failed to boot, for ``reason``. Authorized as the agent
        archive is."""
        agents.boot_failed(name, _session(authorization, "join token"), body.reason)
        return Ack(ok=True)

    @app.post("/v1/machines/{name}/ready", responses=ERRORS)
    def ready(
        name: str, body: ReadyRequest, authorization: Annotated[str | None, Header()] = None
    ) -> Ack:
        """The backend answers its healthcheck (ok), or never will (a failed boot)."""
        agents.ready(name, _session(authorization), body.ok, body.reason)
        return Ack(ok=True)

    polls = Polls(agents, hub)

    @app.post("/v1/machines/{name}/poll", responses=ERRORS, response_model=PollReply)
    async def poll(
        name: str, body: PollRequest, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        """Record the results it carries, renew leases; answer with work, stops and drain,
        waiting up to ``wait`` seconds (at most a third of the lease) when there is nothing to
        say yet. (Served by ``HotRoutes`` in front of this app; declared here for OpenAPI.)"""
        reply = await polls.poll(name, authorization, body)
        return Response(reply, media_type="application/json")

    @app.post(
        "/v1/machines/{name}/jobs/{job}/attempts/{attempt}/result",
        responses=ERRORS,
        response_model=ResultReply,
    )
    async def result(
        name: str,
        job: str,
        attempt: str,
        body: ResultRequest,
        authorization: Annotated[str | None, Header()] = None,
    ) -> Response:
        """What the backend answered for this attempt; refused (409) if it is not current.
        (Served by ``HotRoutes`` in front of this app; declared here for OpenAPI.)"""
        reply = await polls.result(name, authorization, job, attempt, body)
        return Response(reply, media_type="application/json")

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
        chunks = agents.image(name, _session(authorization), image_id)
        return StreamingResponse(chunks, media_type="application/x-tar")

    @app.post("/v1/machines/{name}/drained", responses=ERRORS)
    def drained(name: str, authorization: Annotated[str | None, Header()] = None) -> Ack:
        """The agent finished its jobs after a drain and is leaving."""
        agents.drained(name, _session(authorization))
        return Ack(ok=True)

    return HotRoutes(app, polls)
