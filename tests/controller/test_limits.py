"""Size limits: request bodies, payloads and results have documented limits,
answered 413 with a clear message before the body is read whole, on both APIs, /v1/join
included (before any authentication)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from sp00ky_infra.client import Client
from sp00ky_infra.controller import limits
from sp00ky_infra.policy import jobs as policy
from sp00ky_infra.store import InvalidJob
from tests.controllers import (
    ControllerProcess,
    backend_app,
    paused_controller,
    project,
)

FIFTY_MB = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControllerProcess, Client]]:
    with paused_controller(tmp_path_factory.mktemp("limits")) as served:
        yield served


def _raw(url: str, path: str, headers: dict[str, str], body: bytes, finish: bool) -> bytes:
    """Send a request's head and ``body`` but, unless ``finish``, not the rest of what it
    announced; return what the server answers (it must answer without the rest)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )
        sock.sendall(head.encode() + b"\r\n" + body)
        if finish:
            sock.sendall(b"0\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def _chunked(total: int, size: int = 4096) -> bytes:
    piece = f"{size:x}\r\n".encode() + b"x" * size + b"\r\n"
    return piece * (total // size)


def test_a_50_mb_join_is_refused_before_its_body_is_read(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, _ = served
    started = time.monotonic()
    answer = _raw(
        controller.agents_url,
        "/v1/join",
        {"Content-Type": "application/json", "Content-Length": str(FIFTY_MB)},
        b'{"machine": "m1", "token": "',  # ... and nothing more: the 50 MB never come
        finish=False,
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"a join may be at most 16 KiB (16384 bytes); 52428800 bytes declared" in answer
    assert time.monotonic() - started < 5  # answered, not waiting for the body


@pytest.mark.parametrize(
    ("api", "path", "limit"),
    [
        ("agents", "/v1/join", limits.MAX_JOIN_BYTES),
        ("agents", "/v1/machines/m1/poll", limits.MAX_OTHER_BYTES),
        ("admin", "/pools/render/jobs", policy.MAX_PAYLOAD_BYTES + limits.ENVELOPE_BYTES),
    ],
)
def test_a_chunked_body_is_cut_off_at_its_limit(
    served: tuple[ControllerProcess, Client], api: str, path: str, limit: int
) -> None:
    """No Content-Length: the server counts what arrives and answers once past the limit,
    while the client is still sending (the body's end is never sent)."""
    controller, _ = served
    url = controller.agents_url if api == "agents" else controller.admin_url
    answer = _raw(
        url,
        path,
        {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        _chunked(limit + 8192),
        finish=False,
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert f"({limit} bytes); more than {limit} bytes sent".encode() in answer


def test_a_large_admin_start_is_413_and_one_within_the_limit_is_taken(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    before = client.store.counts().get("pending", 0)
    big = {"path": "/render", "payload": {"gameId": "g" * (2 * policy.MAX_PAYLOAD_BYTES)}}
    refused = controller.admin("POST", "/pools/render/jobs", json=big)
    assert refused.status_code == 413, refused.text[:300]
    assert refused.json()["error"].startswith(
        "body: a start (the payload itself: 1 MiB) may be at most 1088 KiB (1114112 bytes); "
    )
    # a body within its limit whose payload is over 1 MiB: refused by the payload's own limit
    over = {"path": "/render", "payload": {"gameId": "g" * (policy.MAX_PAYLOAD_BYTES + 1)}}
    payload = controller.admin("POST", "/pools/render/jobs", json=over)
    assert payload.status_code == 413, payload.text[:300]
    assert payload.json()["error"].startswith("payload: 1048591 bytes as JSON, more than")
    unauthenticated = requests.post(
        f"{controller.admin_url}/pools/render/jobs", data=b"x" * (2 * 1024 * 1024), timeout=30
    )
    assert unauthenticated.status_code == 413  # the size is checked before the token
    fits = {"path": "/render", "payload": {"gameId": "g" * (policy.MAX_PAYLOAD_BYTES - 100)}}
    taken = controller.admin("POST", "/pools/render/jobs", json=fits)
    assert taken.status_code == 202, taken.text[:300]
    assert client.store.counts()["pending"] == before + 1


def test_a_result_over_the_limit_is_413(served: tuple[ControllerProcess, Client]) -> None:
    controller, client = served
    session = controller.join(client, "limits-m1")
    path = f"{controller.agents_url}/v1/machines/limits-m1/jobs/j/attempts/a/result"
    big = {"status": "success", "result": "r" * (policy.MAX_RESULT_BYTES + limits.ENVELOPE_BYTES)}
    answer = requests.post(
        path, json=big, headers={"Authorization": f"Bearer {session}"}, timeout=30
    )
    assert answer.status_code == 413, answer.text[:300]
    assert "a result (the result itself: 1 MiB) may be at most" in answer.json()["error"]
    small = requests.post(
        path,
        json={"status": "success", "result": "r" * 1000},
        headers={"Authorization": f"Bearer {session}"},
        timeout=30,
    )
    assert small.status_code == 409  # within the limit: on to the route (no such attempt)


def test_client_run_refuses_a_payload_over_1_mib(tmp_path: Path, sqlite_url: str) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"renderer": app}
    )
    with Client(sqlite_url, config) as client:
        with pytest.raises(InvalidJob) as refused:
            client.run("renderer", "/render", {"gameId": "g" * policy.MAX_PAYLOAD_BYTES})
        assert str(refused.value).startswith("payload: 1048590 bytes as JSON, more than the limit")
        assert client.store.counts().get("pending", 0) == 0
        client.run("renderer", "/render", {"gameId": "g" * (policy.MAX_PAYLOAD_BYTES - 100)})
