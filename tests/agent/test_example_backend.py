"""The example backend as a real process on loopback: health, jobs, its log, SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from jsonschema import Draft202012Validator

from tests.helpers import ROOT

SERVER = ROOT / "examples" / "backend" / "server.py"


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    log = tmp_path / "backend.jsonl"
    env = {**os.environ, "PORT": "0", "BACKEND_LOG": str(log), "RENDER_SECONDS": "0"}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"listening on 127\.0\.0\.1:(\d+) pid=(\d+)", first)
        assert match, first
        yield f"http://127.0.0.1:{match.group(1)}", log, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_a_job_whose_client_leaves_stops_its_work_and_says_so(
    backend: tuple[str, Path, subprocess.Popen[str]],
) -> None:
    """As the agent drops a killed job's request: the connection is shut under the POST."""
    url, log, _ = backend
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=5)
    body = json.dumps({"gameId": "killed", "seconds": 30})
    conn.request("POST", "/render", body=body, headers={"X-Sp00ky-Attempt": "a-1"})
    time.sleep(0.2)
    left_at = time.time()
    conn.close()

    def closed() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        return [line for line in lines if line["event"] == "closed"]

    deadline = time.monotonic() + 5
    while not closed() and time.monotonic() < deadline:
        time.sleep(0.02)
    (line,) = closed()
    assert line["attempt"] == "a-1" and line["t"] - left_at < 1 and line["left"] > 25
    # the backend serves on
    assert requests.post(f"{url}/render", json={"gameId": "next"}, timeout=5).status_code == 200


def test_health_and_a_job(backend: tuple[str, Path, subprocess.Popen[str]]) -> None:
    url, log, proc = backend
    health = requests.get(f"{url}/health", timeout=5)
    assert health.status_code == 200 and health.json()["pid"] == proc.pid
    answer = requests.post(
        f"{url}/render",
        json={"gameId": "g1", "format": "gif"},
        headers={"X-Sp00ky-Attempt": "a-1"},
        timeout=5,
    )
    assert answer.status_code == 200
    assert answer.json() == {
        "url": "https://renders.example.invalid/g1.gif",
        "pid": proc.pid,
        "calls": 1,
    }
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["event"], e.get("attempt")) for e in events] == [
        ("boot", None),
        ("start", "a-1"),
        ("end", "a-1"),
    ]


def test_bad_payloads_and_routes(backend: tuple[str, Path, subprocess.Popen[str]]) -> None:
    url, _, _ = backend
    assert requests.post(f"{url}/render", json={}, timeout=5).status_code == 422
    assert requests.post(f"{url}/render", data=b"{", timeout=5).status_code == 400
    failed = requests.post(f"{url}/render", json={"gameId": "g", "fail": True}, timeout=5)
    assert failed.status_code == 500 and "asked to" in failed.json()["error"]
    assert requests.post(f"{url}/nope", json={}, timeout=5).status_code == 404


def test_one_connection_serves_many_requests(
    backend: tuple[str, Path, subprocess.Popen[str]],
) -> None:
    url, _, _ = backend
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        sockets = set()
        for _ in range(3):
            conn.request("GET", "/health")
            answer = conn.getresponse()
            assert answer.status == 200 and json.loads(answer.read())["ok"] is True
            sockets.add(id(conn.sock))
        assert len(sockets) == 1, "the backend closed a keep-alive connection"
    finally:
        conn.close()


def test_sigterm_stops_it(backend: tuple[str, Path, subprocess.Popen[str]]) -> None:
    _, _, proc = backend
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_sigterm_while_it_holds_its_log_stops_it(tmp_path: Path) -> None:
    """The signal lands while the backend writes its log (the log a FIFO no one reads yet, so
    the write waits with the log's lock held): it still logs its stop and exits."""
    fifo = tmp_path / "backend.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PORT": "0", "BACKEND_LOG": str(fifo), "RENDER_SECONDS": "0"}
    proc = subprocess.Popen([sys.executable, str(SERVER)], env=env, stdout=subprocess.PIPE)
    events: list[str] = []

    def read_two_writes() -> None:
        for _ in range(2):  # "boot", then "stop": each write opens the FIFO anew
            with open(fifo, encoding="utf-8") as reader:
                events.extend(json.loads(line)["event"] for line in reader)

    try:
        assert proc.stdout is not None and b"listening" in proc.stdout.readline()
        time.sleep(0.2)  # its "boot" line now waits for a reader, the lock held
        proc.send_signal(signal.SIGTERM)
        reader = threading.Thread(target=read_two_writes, daemon=True)
        reader.start()
        assert proc.wait(timeout=10) == 0
        reader.join(timeout=10)
        assert events == ["boot", "stop"]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_openapi_spec_requires_game_id() -> None:
    spec = yaml.safe_load((ROOT / "examples" / "backend" / "openapi.yml").read_text())
    body = spec["paths"]["/render"]["post"]["requestBody"]["content"]["application/json"]
    validator = Draft202012Validator(body["schema"])
    assert list(validator.iter_errors({"gameId": "g", "format": "mp4"})) == []
    (error,) = validator.iter_errors({"format": "mp4"})
    assert "'gameId' is a required property" in error.message
