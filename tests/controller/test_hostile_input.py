"""Hostile input gets a 4xx (or exit 1/2) with a message naming the field: never a 500, never
a traceback, and never a row the store cannot give back as valid JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sp00ky_infra.client import Client, payload_from_text
from sp00ky_infra.policy import jobs as policy
from sp00ky_infra.store import InvalidJob
from tests.controllers import (
    ADMIN_TOKEN,
    ControllerProcess,
    backend_app,
    paused_controller,
    project,
)
from tests.helpers import cli

DEEP = "[" * 60_000 + "]" * 60_000
HUGE = 10**30


def strict_json(text: str) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControllerProcess, Client]]:
    with paused_controller(tmp_path_factory.mktemp("hostile")) as served:
        yield served


def _admin_raw(controller: ControllerProcess, path: str, body: str) -> requests.Response:
    return requests.post(
        f"{controller.admin_url}{path}",
        data=body.encode(),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        timeout=30,
    )


def _no_server_error(answer: requests.Response) -> None:
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:500])
    assert "Traceback" not in answer.text


@pytest.mark.parametrize("value", ["Bearer ñandú", "Bearer \u00ff\u00fe", "Bearer 令牌"])
def test_a_non_ascii_bearer_is_refused_with_401_on_both_apis(
    served: tuple[ControllerProcess, Client], value: str
) -> None:
    controller, _ = served
    raw = value.encode("utf-8")  # bytes on the wire, as an attacker sends them
    answers = [
        requests.get(f"{controller.admin_url}/pools", headers={"Authorization": raw}, timeout=10),
        requests.post(
            f"{controller.agents_url}/v1/machines/m1/poll",
            json={},
            headers={"Authorization": raw},
            timeout=10,
        ),
        requests.post(
            f"{controller.agents_url}/v1/machines/m1/ready",
            json={"ok": True},
            headers={"Authorization": raw},
            timeout=10,
        ),
    ]
    for answer in answers:
        assert answer.status_code == 401, (answer.status_code, answer.text)
        assert "Authorization: Bearer" in answer.json()["error"]
        assert "server" not in answer.headers  # no software named to whoever asks


@pytest.mark.parametrize(
    "field",
    ["max_retries", "priority", "queuePriority", "delay", "slots", "poolSlots", "timeout"],
)
@pytest.mark.parametrize("value", [HUGE, -HUGE])
def test_admin_start_bounds_every_number(
    served: tuple[ControllerProcess, Client], field: str, value: int
) -> None:
    controller, client = served
    before = client.store.counts()
    answer = controller.admin(
        "POST",
        "/pools/render/jobs",
        json={"path": "/render", "payload": {"gameId": "g"}, field: value},
    )
    assert answer.status_code == 422, (answer.status_code, answer.text)
    assert field in answer.text
    assert client.store.counts() == before


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ('{"path": "/render", "timeout": 1e400, "payload": {"gameId": "g"}}', "timeout"),
        ('{"path": "/render", "timeout": NaN, "payload": {"gameId": "g"}}', "timeout"),
        ('{"path": "/render", "payload": {"gameId": "g", "seconds": NaN}}', "payload.seconds"),
        ('{"path": "/render", "payload": {"gameId": "g", "seconds": Infinity}}', "payload.seconds"),
        ('{"path": "/render", "payload": [1, -Infinity]}', "payload[1]"),
        ('{"path": "/render", "payload": ' + DEEP + "}", "deeper"),
        (DEEP, "deeper"),
    ],
)
def test_admin_start_refuses_non_finite_numbers_and_deep_documents(
    served: tuple[ControllerProcess, Client], body: str, names: str
) -> None:
    controller, client = served
    before = client.store.counts()
    answer = _admin_raw(controller, "/pools/render/jobs", body)
    _no_server_error(answer)
    assert names in answer.text, answer.text[:500]
    assert client.store.counts() == before


def test_an_agents_result_with_nan_or_too_deep_is_refused(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    headers = {"Authorization": f"Bearer {controller.join(client, 'hostile-m1')}"}
    path = f"{controller.agents_url}/v1/machines/hostile-m1/jobs/j/attempts/a/result"
    for body, names in (
        ('{"status": "success", "result": {"score": NaN}}', "result.score"),
        ('{"status": "success", "result": ' + DEEP + "}", "deeper"),
        ('{"status": "success", "posted": Infinity}', "posted"),
    ):
        answer = requests.post(
            path, data=body, headers={**headers, "Content-Type": "application/json"}, timeout=10
        )
        _no_server_error(answer)
        assert names in answer.text, answer.text[:500]


# --- Client.run and `sp00ky-infra run` ---------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path, sqlite_url: str) -> Iterator[Client]:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1, "slots": 4}}, {"renderer": app}
    )
    with Client(sqlite_url, config) as opened:
        yield opened


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_retries", HUGE),
        ("max_retries", -1),
        ("priority", HUGE),
        ("priority", -HUGE),
        ("queue_priority", HUGE),
        ("delay", HUGE),
        ("delay", -1),
        ("slots", HUGE),
        ("pool_slots", HUGE),
        ("timeout", math.inf),
        ("timeout", math.nan),
        ("timeout", float(HUGE)),
    ],
)
def test_client_run_bounds_every_number(client: Client, option: str, value: Any) -> None:
    with pytest.raises(InvalidJob) as refused:
        client.run("renderer", "/render", {"gameId": "g"}, **{option: value})
    assert str(refused.value).startswith(option.split("_")[0]), str(refused.value)
    assert client.store.counts().get("pending", 0) == 0


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        ({"gameId": "g", "seconds": math.nan}, "payload.seconds"),
        ({"gameId": "g", "seconds": math.inf}, "payload.seconds"),
        ([1.0, -math.inf], "payload[1]"),
        ({"gameId": _nested(60_000)}, "deeper"),
    ],
)
def test_client_run_refuses_what_is_not_json(client: Client, payload: Any, names: str) -> None:
    with pytest.raises(InvalidJob) as refused:
        client.run("renderer", "/render", payload)
    assert names in str(refused.value)
    assert client.store.counts().get("pending", 0) == 0


def test_the_payloads_depth_limit_is_exact(client: Client) -> None:
    depth = policy.MAX_JSON_DEPTH
    assert policy.json_problem(_nested(depth - 1), "payload") is None  # the list inside
    assert "deeper" in (policy.json_problem(_nested(depth + 1), "payload") or "")
    assert payload_from_text("[" * (depth - 1) + "]" * (depth - 1)) is not None


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--priority", str(HUGE)], "--priority"),
        (["--queue-priority", str(-HUGE)], "--queue-priority"),
        (["--max-retries", str(HUGE)], "--max-retries"),
        (["--delay", str(HUGE)], "--delay"),
        (["--slots", str(HUGE)], "--slots"),
        (["--pool-slots", str(HUGE)], "--pool-slots"),
        (["--timeout", "1e400"], "--timeout"),
        (["--timeout", "nan"], "--timeout"),
        (["--timeout", "inf"], "--timeout"),
        (["--payload", '{"gameId": "g", "seconds": NaN}'], "payload.seconds"),
        (["--payload", '{"gameId": "g", "seconds": Infinity}'], "payload.seconds"),
        (["--payload", DEEP], "deeper"),
        (["--payload", "1" * 5000], "--payload"),
    ],
)
def test_run_refuses_hostile_options_without_a_traceback(
    tmp_path: Path, sqlite_url: str, args: list[str], names: str
) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"renderer": app}
    )
    payload = [] if "--payload" in args else ["--payload", '{"gameId": "g"}']
    env = {"SPKY_STORE": sqlite_url, "SPKY_CONFIG": str(config)}
    done = cli("run", "renderer", "/render", *payload, *args, cwd=tmp_path, env=env)
    assert done.returncode in (1, 2), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert names in done.stderr, done.stderr[-2000:]
    listed = cli("jobs", "list", "--json", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert strict_json(listed.stdout) == []


def test_jobs_list_json_stays_valid_json_after_every_hostile_input(
    served: tuple[ControllerProcess, Client],
) -> None:
    """After every refused input above (this module's controller and store), and a job
    accepted beside them, ``jobs list --json`` prints what a strict parser reads."""
    controller, _ = served
    accepted = controller.admin(
        "POST",
        "/pools/render/jobs",
        json={"path": "/render", "payload": {"gameId": "ok", "seconds": 3600.0}},
    )
    assert accepted.status_code == 202, accepted.text
    for body in ('{"path": "/render", "payload": {"gameId": "g", "seconds": NaN}}',):
        _admin_raw(controller, "/pools/render/jobs", body)
    env = {"SPKY_STORE": controller.store_url, "SPKY_CONFIG": str(controller.config)}
    listed = cli("jobs", "list", "--json", cwd=controller.folder, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = strict_json(listed.stdout)
    assert [row["id"] for row in rows] == [accepted.json()["queueId"]]


def test_huge_numbers_elsewhere_on_both_apis_are_not_a_server_error(
    served: tuple[ControllerProcess, Client],
) -> None:
    """The numbers beside a job's options: the admin API's event count, a poll's free slots."""
    controller, client = served
    for limit in (HUGE, -HUGE, -1):
        _no_server_error_or_ok(controller.admin("GET", f"/events?limit={limit}"))
    headers = {"Authorization": f"Bearer {controller.join(client, 'hostile-m2')}"}
    base = f"{controller.agents_url}/v1/machines/hostile-m2"
    assert requests.post(f"{base}/ready", json={"ok": True}, headers=headers, timeout=10).ok
    for body in ({"free_slots": HUGE}, {"free_slots": HUGE, "wait": 0}, {"wait": HUGE}):
        _no_server_error_or_ok(
            requests.post(f"{base}/poll", json=body, headers=headers, timeout=10)
        )


def _no_server_error_or_ok(answer: requests.Response) -> None:
    assert answer.status_code < 500, (answer.status_code, answer.text[:500])
