"""queueTimeout as the Resource pools docs write it: per pool and per job (the job's
wins), seconds or a duration, above zero; an expired claim keeps its queue deadline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.config.loader import lint_document, load_config, parse_document
from sp00ky_infra.config.schema import load_schema
from sp00ky_infra.store import InvalidJob, NewJob, SqlStore
from tests.configs import varied
from tests.helpers import ROOT, cli

T0 = 1_700_000_000.0
LEASE = 90.0


def _new(**fields: Any) -> NewJob:
    base: dict[str, Any] = {"backend": "renderer", "table": "render_job", "path": "/render"}
    return NewJob(**{**base, **fields})


# --- the store: which requeue keeps the deadline -----------------------------------------------


def test_an_expired_claim_keeps_its_first_queue_deadline(store: SqlStore) -> None:
    job = store.enqueue(_new(queue_timeout=100, max_retries=3), T0)
    assert job.queue_deadline == T0 + 100
    assert len(store.claim("render_job", 1, "c", T0 + 1, LEASE, machine="m1")) == 1
    report = store.sweep(T0 + 1 + LEASE + 1)  # the lease ran out at T0 + 91
    assert report.lease_expired == (job.id,)
    again = store.get(job.id)
    assert again.status == "pending" and again.run_after > T0 + 92
    assert again.queue_deadline == T0 + 100  # not run_after + 100
    assert store.sweep(T0 + 99).total == 0
    (second,) = store.claim("render_job", 1, "c", T0 + 99.5, LEASE, machine="m2")
    assert second.attempt_number == 2  # admitted again before its queue deadline


def test_an_expired_claim_past_its_queue_deadline_times_out(store: SqlStore) -> None:
    job = store.enqueue(_new(queue_timeout=100, max_retries=3), T0)
    store.claim("render_job", 1, "c", T0 + 50, LEASE, machine="m1")
    store.sweep(T0 + 50 + LEASE + 1)  # requeued at T0 + 141, past its deadline T0 + 100
    assert store.claim("render_job", 1, "c", T0 + 160, LEASE) == []
    report = store.sweep(T0 + 160)
    assert report.queue_timed_out == (job.id,)
    final = store.get(job.id)
    assert [e["code"] for e in final.errors] == ["lease_expired", "queue_timeout"]


def test_a_retry_after_a_reported_failure_and_a_manual_retry_wait_anew(store: SqlStore) -> None:
    job = store.enqueue(_new(queue_timeout=100, max_retries=3), T0)
    (running,) = store.claim("render_job", 1, "c", T0 + 1, LEASE, machine="m1")
    error: Any = {"code": "backend_error", "reason": "500"}
    assert running.attempt is not None
    failed = store.fail_attempt(job.id, running.attempt, error, T0 + 200)
    assert failed.status == "pending"
    assert failed.queue_deadline == failed.run_after + 100  # a new wait for a slot
    killed = store.kill(job.id, T0 + 300)
    rerun = store.retry(killed.id, T0 + 400)
    assert rerun.queue_deadline == T0 + 500


# --- Client.run: the job's own queueTimeout ------------------------------------------------------


def _project(tmp_path: Path, *changes: tuple[str, Any]) -> Path:
    (tmp_path / "backend").mkdir(exist_ok=True)
    shutil.copy(ROOT / "examples/backend/openapi.yml", tmp_path / "backend/openapi.yml")
    path = tmp_path / "sp00ky.yml"
    path.write_text(yaml.safe_dump(varied(*changes)))
    return path


@pytest.mark.parametrize(
    ("given", "seconds"), [(1800, 1800), ("30m", 1800), ("90", 90), (2.5, 2.5)]
)
def test_the_jobs_own_queue_timeout_wins(
    tmp_path: Path, store: SqlStore, given: Any, seconds: float
) -> None:
    client = Client(store, _project(tmp_path, ("pools.render.queueTimeout", 600)))
    job = client.run("renderer", "/render", {"gameId": "g"}, queue_timeout=given, now=T0)
    assert (job.queue_timeout, job.queue_deadline) == (seconds, T0 + seconds)
    pooled = client.run("renderer", "/render", {"gameId": "g"}, now=T0)
    assert (pooled.queue_timeout, pooled.queue_deadline) == (600, T0 + 600)


@pytest.mark.parametrize("given", [0, -5, "0s", "-1", "soon", "inf", True])
def test_a_queue_timeout_that_cannot_wait_writes_nothing(
    tmp_path: Path, store: SqlStore, given: Any
) -> None:
    client = Client(store, _project(tmp_path))
    with pytest.raises(InvalidJob) as refused:
        client.run("renderer", "/render", {"gameId": "g"}, queue_timeout=given, now=T0)
    assert str(refused.value).startswith("queue_timeout: queueTimeout ")
    assert "give a positive number of seconds (1800) or a duration (30m)" in str(refused.value)
    assert store.counts()["pending"] == 0


# --- sp00ky.yml: seconds or a duration, above zero -----------------------------------------------


def _lint(value: Any) -> list[tuple[str, str, str]]:
    text = yaml.safe_dump(varied(("pools.render.queueTimeout", value)))
    return [
        (issue.path, issue.code, issue.message)
        for issue in lint_document(parse_document(text))
        if issue.path.endswith("queueTimeout")
    ]


@pytest.mark.parametrize(("value", "seconds"), [(1800, 1800), ("30m", 1800), (0.5, 0.5)])
def test_lint_and_the_model_take_seconds_or_a_duration(
    tmp_path: Path, value: Any, seconds: float
) -> None:
    assert _lint(value) == []
    config = load_config(_project(tmp_path, ("pools.render.queueTimeout", value)))
    assert config.pools["render"].queue_timeout == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "queueTimeout is 0, but a job must be able to wait for a slot"),
        (-30, "queueTimeout is -30, but a job must be able to wait for a slot"),
        ("0s", "queueTimeout is '0s', but a job must be able to wait for a slot"),
        ("soon", "queueTimeout 'soon' is not a wait"),
    ],
)
def test_lint_refuses_a_queue_timeout_that_cannot_wait(value: Any, message: str) -> None:
    found = _lint(value)
    assert [(path, code) for path, code, _ in found] == [("pools.render.queueTimeout", "SP123")]
    assert found[0][2].startswith(message)
    assert found[0][2].endswith("give a positive number of seconds (1800) or a duration (30m)")


def test_lint_names_a_wrong_type_once() -> None:
    assert _lint([1]) == [
        ("pools.render.queueTimeout", "SP001", "must be a string or a number, not a list")
    ]


def test_the_schema_pattern_is_the_durations() -> None:
    schema = load_schema()["$defs"]
    assert schema["pool"]["properties"]["queueTimeout"]["pattern"] == schema["duration"]["pattern"]


# --- the command line ----------------------------------------------------------------------------


def test_run_takes_queue_timeout_and_refuses_zero(tmp_path: Path, store_url: str) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project, ignore=shutil.ignore_patterns(".sp00ky"))
    config = yaml.safe_load((project / "sp00ky.yml").read_text())
    config["pools"]["render"]["queueTimeout"] = 1800  # the docs' form, seconds
    (project / "sp00ky.yml").write_text(yaml.safe_dump(config))
    env = {"SPKY_STORE": store_url, "SPKY_CONFIG": ""}
    payload = '{"gameId": "g"}'

    pooled = cli("run", "renderer", "/render", "--payload", payload, "--json", cwd=project, env=env)
    assert pooled.returncode == 0, pooled.stderr
    assert json.loads(pooled.stdout)["queue_timeout"] == 1800
    own = cli(
        "run", "renderer", "/render", "--payload", payload, "--queue-timeout", "5m", "--json",
        cwd=project, env=env,
    )  # fmt: skip
    assert own.returncode == 0, own.stderr
    shown = json.loads(own.stdout)
    assert shown["queue_timeout"] == 300
    assert shown["queue_deadline"] == pytest.approx(shown["created_at"] + 300)

    refused = cli(
        "run", "renderer", "/render", "--payload", payload, "--queue-timeout", "0s",
        cwd=project, env=env,
    )  # fmt: skip
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: queue_timeout: queueTimeout is '0s'")
    listed = cli("jobs", "list", "--json", cwd=project, env=env)
    assert len(json.loads(listed.stdout)) == 2  # the refused one wrote nothing
