"""What a request to either API may carry, checked before any route (or auth) sees it.

``InputLimits`` is an ASGI middleware around each app:

- **Size** (docs/jobs.md, "Limits"): a body larger than its route's limit is answered 413 with a
  message naming the limit, before it is read whole: at once from ``Content-Length``, and
  for a chunked body as soon as the bytes received pass the limit. ``/v1/join`` and
  ``/rejoin`` take a few KiB (they come before any authentication); an agent's result and an
  admin start (which carries the payload) take the payload and result limit plus room for
  their other fields; every other request is small.
- **JSON**: a JSON body with NaN or an infinity anywhere, or nested deeper
  than ``MAX_JSON_DEPTH`` inside any of its fields, is answered 422 naming the field. So the
  store is never handed what ``jobs list --json`` could not print as JSON, and no parser
  recurses into a 60,000-deep document.

The body read here is handed on to the app unchanged (read once, replayed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from sp00ky_infra.policy.jobs import (
    MAX_JSON_DEPTH,
    MAX_PAYLOAD_BYTES,
    MAX_RESULT_BYTES,
    json_problem,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KiB = 1024
MiB = 1024 * KiB
ENVELOPE_BYTES = 64 * KiB  # a start's or a result's other fields beside the payload/result
MAX_JOIN_BYTES = 16 * KiB  # /v1/join and /rejoin: read before any authentication
MAX_OTHER_BYTES = 256 * KiB  # every other request (a poll lists at most a machine's jobs)


@dataclass(frozen=True, slots=True)
class Rule:
    """Requests whose path matches ``pattern`` may carry at most ``max_bytes``."""

    pattern: re.Pattern[str]
    max_bytes: int
    what: str


AGENTS_RULES = (
    Rule(re.compile(r"^/v1/join$"), MAX_JOIN_BYTES, "a join"),
    Rule(re.compile(r"^/v1/machines/[^/]+/rejoin$"), MAX_JOIN_BYTES, "a rejoin"),
    Rule(
        re.compile(r"^/v1/machines/[^/]+/jobs/[^/]+/attempts/[^/]+/result$"),
        MAX_RESULT_BYTES + ENVELOPE_BYTES,
        f"a result (the result itself: {MAX_RESULT_BYTES // MiB} MiB)",
    ),
)
ADMIN_RULES = (
    Rule(
        re.compile(r"^/pools/[^/]+/jobs$"),
        MAX_PAYLOAD_BYTES + ENVELOPE_BYTES,
        f"a start (the payload itself: {MAX_PAYLOAD_BYTES // MiB} MiB)",
    ),
)


def limit_for(path: str, rules: tuple[Rule, ...]) -> tuple[int, str]:
    for rule in rules:
        if rule.pattern.match(path):
            return rule.max_bytes, rule.what
    return MAX_OTHER_BYTES, "a request"


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // KiB} KiB"


def body_problem(body: bytes) -> str | None:
    """Why a JSON request body is refused (NaN, an infinity, too deep), naming the field;
    None when it is fine or not JSON at all (the app answers malformed JSON itself)."""
    try:
        value = json.loads(body)
    except RecursionError:
        return f"body: nested deeper than {MAX_JSON_DEPTH} levels of objects and arrays; flatten it"
    except ValueError:  # malformed: the app's own 422 says where
        return None
    if isinstance(value, dict):  # a field's depth counts from the field
        for key, field in value.items():
            problem = json_problem(field, key)
            if problem is not None:
                return problem
        return None
    return json_problem(value, "")


class InputLimits:
    """The ASGI middleware: size limits per route, then the JSON checks (module docstring)."""

    def __init__(self, app: ASGIApp, rules: tuple[Rule, ...] = ()) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit, what = limit_for(scope["path"], self.rules)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _answer(send, 400, "Content-Length: not a number of bytes")
                return
            if length > limit:
                await _answer(send, 413, _too_large(what, limit, f"{length} bytes declared"))
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # a chunked body (or one longer than it said): stop reading
                await _answer(send, 413, _too_large(what, limit, f"more than {limit} bytes sent"))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and b"json" in headers.get(b"content-type", b"application/json"):
            problem = body_problem(body)
            if problem is not None:
                await _answer(send, 422, problem)
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _too_large(what: str, limit: int, seen: str) -> str:
    return f"body: {what} may be at most {_size(limit)} ({limit} bytes); {seen}"


async def _answer(send: Send, status: int, error: str) -> None:
    # the body may not have been read whole: the connection cannot carry another request
    await send_json(send, status, json.dumps({"error": error}).encode(), close=True)


async def send_json(send: Send, status: int, body: bytes, close: bool = False) -> None:
    """Answer an ASGI request with ``body``, JSON already encoded."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
