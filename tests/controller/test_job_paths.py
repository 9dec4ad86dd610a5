"""Paths of a job's life that no other test walked, each with a real
controller, real agents and real backends on loopback: a backend answering 5xx, a backend
that hangs up, the agent's deadline, the controller's own pruning tick, a table's
``concurrency``, a backend with no healthcheck, a pause that survives a restart, and two jobs
at once on one two-slot machine."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

from sp00ky_infra.client import Client
from sp00ky_infra.store import Job
from tests.controllers import (
    backend_app,
    backend_events,
    deploys,
    project,
    running_controller,
    wait_for,
)

# A backend for the paths the example cannot take: no /health route at all (404), and a POST
# that is read and then hung up on without an answer (the agent sees a reset connection).
ODD_BACKEND = """
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if os.environ.get("ODD_POST") == "hangup":
            self.close_connection = True
            self.connection.close()
            return
        body = b'{"ok": true}'
        if os.environ.get("ODD_POST") == "big":  # a result over the 1 MiB limit
            body = b'{"blob": "' + b"x" * (2 * 1024 * 1024) + b'"}'
        if os.environ.get("ODD_POST") == "large":  # under 1 MiB, over what a poll carries
            body = b'{"blob": "' + b"x" * (600 * 1024) + b'"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def _odd_backend(folder: Path, post: str, healthcheck: str | None) -> dict[str, Any]:
    script = folder / "odd_backend.py"
    script.write_text(ODD_BACKEND)
    app = backend_app("render", "render_job", folder / "backend.jsonl")
    app["deploy"]["command"] = [sys.executable, str(script)]
    if healthcheck is None:
        del app["deploy"]["healthcheck"]
    else:
        app["deploy"]["healthcheck"] = healthcheck
    app["env"]["ODD_POST"] = post
    return app


def _finished(client: Client, job_id: str, timeout: float = 30) -> Job:
    def done() -> Job | None:
        job = client.store.get(job_id)
        return job if job.status in ("success", "failed") else None

    found: Job = wait_for(done, timeout=timeout, what=f"job {job_id} to finish")
    return found


ONE_MACHINE = {"render": {"min": 0, "autoscale": True, "max": 1}}


def test_a_backend_answering_5xx_fails_the_attempt_with_backend_error(
    tmp_path: Path, sqlite_url: str
) -> None:
    config = project(
        tmp_path,
        ONE_MACHINE,
        {"renderer": backend_app("render", "render_job", tmp_path / "b.jsonl")},
    )
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        job = client.run("renderer", "/render", {"gameId": "g", "fail": True}, max_retries=1)
        failed = _finished(client, job.id)
    assert failed.status == "failed"
    assert [e["code"] for e in failed.errors] == ["backend_error", "backend_error"]  # retried once
    assert failed.errors[-1].get("status") == 500
    assert "render failed (asked to by the payload)" in failed.errors[-1]["reason"]


def test_a_backend_that_hangs_up_fails_the_attempt_with_backend_unreachable(
    tmp_path: Path, sqlite_url: str
) -> None:
    app = _odd_backend(tmp_path, post="hangup", healthcheck=None)
    config = project(tmp_path, ONE_MACHINE, {"renderer": app})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        job = client.run("renderer", "/render", {"gameId": "g"}, max_retries=0)
        failed = _finished(client, job.id)
    assert failed.status == "failed"
    (error,) = failed.errors
    assert error["code"] == "backend_unreachable", error
    assert error["reason"].startswith("POST /render: "), error


def test_the_agents_deadline_fails_a_slow_attempt_with_timeout(
    tmp_path: Path, sqlite_url: str
) -> None:
    log = tmp_path / "b.jsonl"
    config = project(tmp_path, ONE_MACHINE, {"renderer": backend_app("render", "render_job", log)})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        job = client.run(
            "renderer", "/render", {"gameId": "g", "seconds": 30}, timeout=1.5, max_retries=0
        )
        started = time.monotonic()
        failed = _finished(client, job.id, timeout=20)
        took = time.monotonic() - started
    assert failed.status == "failed"
    (error,) = failed.errors
    assert error["code"] == "timeout", error
    assert took < 15  # well before the backend's 30 s: the deadline, not the backend, ended it
    assert [e["event"] for e in backend_events(log) if e["event"] == "end"] == []


def test_the_controllers_own_tick_prunes_by_retention_and_counts_what_it_pruned(
    tmp_path: Path, store_url: str
) -> None:
    """No `jobs prune`: the controller's first tick applies retention (success 6h, failed 14d
    by default), folding what it deletes into the hourly counters."""
    config = project(
        tmp_path,
        ONE_MACHINE,
        {"renderer": backend_app("render", "render_job", tmp_path / "b.jsonl")},
    )
    old = time.time() - 7 * 3600
    with Client(store_url, config) as client:
        store = client.store
        stale = client.run("renderer", "/render", {"gameId": "old"}, now=old)
        (claimed,) = store.claim("render_job", 1, "test", old, 60)
        assert claimed.attempt is not None
        store.complete(stale.id, claimed.attempt, {"url": "u"}, old + 1)
        killed = client.run("renderer", "/render", {"gameId": "old-failed"}, now=old)
        store.kill(killed.id, old + 1)
        recent = client.run("renderer", "/render", {"gameId": "new"})
        (claimed,) = store.claim("render_job", 1, "test", time.time(), 60)
        assert claimed.attempt is not None
        store.complete(recent.id, claimed.attempt, {"url": "u"}, time.time())
        assert store.counters() == []
        with running_controller(tmp_path, config, store_url):
            wait_for(lambda: store.counters(), timeout=20, what="the tick's prune")
        kept = {job.id for job in store.list_jobs(limit=100)}
        counters = store.counters()
    assert kept == {killed.id, recent.id}  # the failed one is within 14 d
    assert [(c.table, c.outcome, c.count) for c in counters] == [("render_job", "success", 1)]


def test_a_tables_concurrency_is_honoured_across_machines(tmp_path: Path, sqlite_url: str) -> None:
    """Two ready machines, a table capped at one job in flight: the jobs run one at a time."""
    log = tmp_path / "b.jsonl"
    app = backend_app("render", "render_job", log)
    app["method"]["concurrency"] = 1
    config = project(tmp_path, {"render": {"min": 2}}, {"renderer": app})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        wait_for(
            lambda: (
                len([m for m in client.store.machines.live("render") if m.state == "ready"]) == 2
            ),
            timeout=30,
            what="two ready machines",
        )
        jobs = [
            client.run("renderer", "/render", {"gameId": f"g{i}", "seconds": 0.8}) for i in range(3)
        ]
        finished = [_finished(client, job.id, timeout=40) for job in jobs]
    assert [job.status for job in finished] == ["success"] * 3
    events = backend_events(log)
    spans: dict[str, list[float]] = {}
    for event in events:
        if event["event"] in ("start", "end"):
            spans.setdefault(event["attempt"], []).append(event["t"])
    intervals = sorted((times[0], times[-1]) for times in spans.values())
    assert len(intervals) == 3
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two jobs of the table ran at once: {intervals}"


def test_a_backend_without_a_healthcheck_is_ready_when_its_port_accepts(
    tmp_path: Path, sqlite_url: str
) -> None:
    """The backend answers 404 on every GET (no /health): without `deploy.healthcheck` it is
    ready once its port accepts connections, and runs the job."""
    app = _odd_backend(tmp_path, post="answer", healthcheck=None)
    config = project(tmp_path, ONE_MACHINE, {"renderer": app})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        job = client.run("renderer", "/render", {"gameId": "g"}, max_retries=0)
        done = _finished(client, job.id)
    assert done.status == "success", done.errors
    assert done.result == {"ok": True}


def test_a_deploy_never_unpauses_a_pool_across_a_controller_restart(
    tmp_path: Path, store_url: str
) -> None:
    app = backend_app("render", "render_job", tmp_path / "b.jsonl")
    with deploys(tmp_path, store_url) as deploy:
        first = deploy.start(ONE_MACHINE, {"renderer": app})
        wait_for(first.leader, what="leadership")
        assert first.admin("POST", "/pools/render/pause").json()["paused"] is True
        second = deploy.start(ONE_MACHINE, {"renderer": app})  # a deploy: stop, start
        wait_for(second.leader, what="leadership after the restart")
        assert second.pool("render")["paused"] is True
        with Client(store_url, deploy.current.config) as client:
            job = client.run("renderer", "/render", {"gameId": "g"})
            time.sleep(1.5)  # several ticks (200 ms): a paused pool creates no machine
            assert client.store.machines.live("render") == []
            assert client.store.get(job.id).status == "pending"
            assert second.admin("POST", "/pools/render/resume").json()["paused"] is False
            assert _finished(client, job.id).status == "success"  # it was the pause


def test_two_jobs_run_at_once_on_one_two_slot_machine(tmp_path: Path, sqlite_url: str) -> None:
    log = tmp_path / "b.jsonl"
    pools = {"render": {"min": 0, "autoscale": True, "max": 1, "slots": 2}}
    config = project(tmp_path, pools, {"renderer": backend_app("render", "render_job", log)})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        jobs = [
            client.run("renderer", "/render", {"gameId": f"g{i}", "seconds": 2}) for i in range(2)
        ]
        finished = [_finished(client, job.id, timeout=40) for job in jobs]
        machines = {job.machine for job in finished}
    assert [job.status for job in finished] == ["success", "success"]
    assert len(machines) == 1 and None not in machines
    events = [e for e in backend_events(log) if e["event"] in ("start", "end")]
    starts = [e["t"] for e in events if e["event"] == "start"]
    ends = [e["t"] for e in events if e["event"] == "end"]
    assert len(starts) == 2 and max(starts) < min(ends), "the second waited for the first"
    assert len({e["pid"] for e in events}) == 1  # one backend process, one machine


def test_a_result_over_the_limit_fails_the_attempt_instead_of_sticking(
    tmp_path: Path, sqlite_url: str
) -> None:
    """The backend answers 2 MiB, over the 1 MiB a result may be (docs/jobs.md, "Limits")."""
    app = _odd_backend(tmp_path, post="big", healthcheck=None)
    config = project(tmp_path, ONE_MACHINE, {"renderer": app})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        job = client.run("renderer", "/render", {"gameId": "g"}, max_retries=0)
        failed = _finished(client, job.id, timeout=20)
    (error,) = failed.errors
    assert error["code"] == "backend_error" and "1 MiB" in error["reason"], error


def test_a_large_result_within_the_limit_arrives_whole(tmp_path: Path, sqlite_url: str) -> None:
    """600 KiB: over what a poll's body may carry (256 KiB), under a result's 1 MiB, so the
    agent posts it on its own rather than on a poll the controller would refuse."""
    app = _odd_backend(tmp_path, post="large", healthcheck=None)
    config = project(tmp_path, ONE_MACHINE, {"renderer": app})
    with Client(sqlite_url, config) as client, running_controller(tmp_path, config, sqlite_url):
        jobs = [client.run("renderer", "/render", {"gameId": str(n)}, max_retries=0) for n in "ab"]
        done = [_finished(client, job.id, timeout=30) for job in jobs]
    assert [job.status for job in done] == ["success", "success"], [j.errors for j in done]
    assert all(len(job.result["blob"]) == 600 * 1024 for job in done)
