"""`sp00ky-infra run` and `sp00ky-infra jobs` as a user runs them: real processes, real store."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sp00ky_infra.store import open_store
from tests.helpers import ROOT, cli, cli_process


@pytest.fixture
def project(tmp_path: Path, store_url: str) -> tuple[Path, dict[str, str]]:
    shutil.copytree(
        ROOT / "examples", tmp_path / "project", ignore=shutil.ignore_patterns(".sp00ky")
    )
    return tmp_path / "project", {"SPKY_STORE": store_url, "SPKY_CONFIG": ""}


def _run(project: tuple[Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, cwd=project[0], env=project[1])


def test_run_prints_the_id_and_jobs_get_shows_everything(
    project: tuple[Path, dict[str, str]],
) -> None:
    done = _run(
        project,
        "run",
        "renderer",
        "/render",
        "--payload",
        '{"gameId": "g7"}',
        "--max-retries",
        "5",
        "--retry-strategy",
        "exponential",
        "--timeout",
        "60",
        "--delay",
        "250",
        "--priority",
        "2",
        "--assigned-to",
        "game:g7",
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.startswith("render_job:") and "\n" not in job_id

    shown = json.loads(_run(project, "jobs", "get", job_id, "--json").stdout)
    assert shown["id"] == job_id and shown["status"] == "pending"
    assert shown["payload"] == {"gameId": "g7"} and shown["result"] is None
    assert (shown["max_retries"], shown["retry_strategy"], shown["timeout"]) == (
        5,
        "exponential",
        60,
    )
    assert (shown["delay"], shown["priority"], shown["assigned_to"]) == (250, 2, "game:g7")
    assert shown["errors"] == [] and shown["attempts"] == [] and shown["pool"] == "render"

    text = _run(project, "jobs", "get", job_id).stdout
    assert f"id          : {job_id}" in text and 'payload     : {"gameId": "g7"}' in text


def test_list_filters_and_json(project: tuple[Path, dict[str, str]]) -> None:
    ids = [
        _run(
            project, "run", "renderer", "/render", "--payload", f'{{"gameId": "g{n}"}}'
        ).stdout.strip()
        for n in range(3)
    ]
    _run(project, "jobs", "kill", ids[0])
    listed = json.loads(_run(project, "jobs", "list", "--json").stdout)
    assert [job["id"] for job in listed] == ids[::-1]
    assert {"id", "backend", "path", "status", "retries", "created_at"} <= set(listed[0])
    failed = json.loads(_run(project, "jobs", "list", "--status", "failed", "--json").stdout)
    assert [job["id"] for job in failed] == [ids[0]]
    limited = json.loads(_run(project, "jobs", "list", "--limit", "1", "--json").stdout)
    assert [job["id"] for job in limited] == [ids[2]]
    table = _run(project, "jobs", "list", "--status", "pending").stdout
    assert ids[1] in table and ids[0] not in table
    assert (
        _run(project, "jobs", "list", "--status", "success").stdout.strip()
        == "no jobs with status success"
    )


def test_kill_retry_clear_prune(project: tuple[Path, dict[str, str]]) -> None:
    job_id = _run(
        project, "run", "renderer", "/render", "--payload", '{"gameId": "g"}'
    ).stdout.strip()
    killed = _run(project, "jobs", "kill", job_id)
    assert killed.stdout.strip() == f"{job_id}: killed (failed with code cancelled)"
    again = _run(project, "jobs", "kill", job_id)
    assert again.returncode == 1
    assert again.stderr.strip() == f"error: {job_id} already ended (failed); nothing to kill"
    assert (
        _run(project, "jobs", "retry", job_id).stdout.strip()
        == f"{job_id}: pending again (attempt 1 next)"
    )
    refused = _run(project, "jobs", "retry", job_id)
    assert refused.returncode == 1 and "only a finished job can be retried" in refused.stderr
    _run(project, "jobs", "kill", job_id)
    assert _run(project, "jobs", "clear").stdout.strip() == "deleted 1 finished job(s)"
    assert _run(project, "jobs", "prune").stdout.strip() == "pruned 0 job(s)"
    store = open_store(project[1]["SPKY_STORE"])
    try:
        assert [(c.outcome, c.count) for c in store.counters()] == [("failed", 1)]
    finally:
        store.close()


def test_a_killed_running_job_says_where_the_kill_goes(
    project: tuple[Path, dict[str, str]],
) -> None:
    job_id = _run(
        project, "run", "renderer", "/render", "--payload", '{"gameId": "g"}'
    ).stdout.strip()
    store = open_store(project[1]["SPKY_STORE"])
    try:
        store.claim("render_job", 1, "controller", time.time(), 90, machine="render-1")
    finally:
        store.close()
    done = _run(project, "jobs", "kill", job_id)
    assert (
        done.stdout.strip()
        == f"{job_id}: kill sent to machine render-1; it fails with code cancelled"
    )


def test_the_docs_names_queue_priority_and_pool_slots(
    project: tuple[Path, dict[str, str]],
) -> None:
    config = project[0] / "sp00ky.yml"
    config.write_text(config.read_text().replace("    max: 2\n", "    max: 2\n    slots: 4\n"))
    job_id = _run(
        project,
        *("run", "renderer", "/render", "--payload", '{"gameId": "g"}'),
        *("--queue-priority", "7", "--pool-slots", "2"),
    ).stdout.strip()
    shown = json.loads(_run(project, "jobs", "get", job_id, "--json").stdout)
    assert (shown["priority"], shown["slots"]) == (7, 2)
    same = _run(
        project,
        *("run", "renderer", "/render", "--payload", '{"gameId": "g"}', "--json"),
        *("--priority", "3", "--queue-priority", "3", "--slots", "3", "--pool-slots", "3"),
    )
    assert same.returncode == 0, same.stderr
    assert (json.loads(same.stdout)["priority"], json.loads(same.stdout)["slots"]) == (3, 3)
    for args, message in (
        (
            ("--priority", "1", "--queue-priority", "2"),
            "error: --priority (1) and --queue-priority (2) are two names for one setting "
            "and disagree; give one of them",
        ),
        (
            ("--slots", "1", "--pool-slots", "2"),
            "error: --slots (1) and --pool-slots (2) are two names for one setting",
        ),
        (("--pool-slots", "5"), "asks for 5 slots but a machine of pool 'render' has 4"),
    ):
        refused = _run(project, "run", "renderer", "/render", "--payload", '{"gameId": "g"}', *args)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr
    assert len(json.loads(_run(project, "jobs", "list", "--json").stdout)) == 2


def test_ls_and_json_from_kill_retry_and_clear_with_a_limit(
    project: tuple[Path, dict[str, str]],
) -> None:
    ids = [
        _run(project, "run", "renderer", "/render", "--payload", '{"gameId": "g"}').stdout.strip()
        for _ in range(3)
    ]
    assert (
        _run(project, "jobs", "ls", "--json").stdout
        == _run(project, "jobs", "list", "--json").stdout
    )
    killed = json.loads(_run(project, "jobs", "kill", ids[0], "--json").stdout)
    assert killed["id"] == ids[0] and killed["status"] == "failed"
    assert killed["errors"][-1]["code"] == "cancelled"
    retried = json.loads(_run(project, "jobs", "retry", ids[0], "--json").stdout)
    assert (retried["id"], retried["status"]) == (ids[0], "pending")
    for job_id in (ids[1], ids[2], ids[0]):  # finished in this order
        _run(project, "jobs", "kill", job_id)
        time.sleep(0.01)
    cleared = json.loads(_run(project, "jobs", "clear", "--limit", "2", "--json").stdout)
    assert [job["id"] for job in cleared] == [ids[1], ids[2]]  # the oldest finished first
    assert {job["status"] for job in cleared} == {"failed"} and "payload" in cleared[0]
    assert [job["id"] for job in json.loads(_run(project, "jobs", "ls", "--json").stdout)] == [
        ids[0]
    ]
    assert _run(project, "jobs", "clear", "--limit", "5").stdout.strip() == (
        "deleted 1 finished job(s)"
    )
    assert json.loads(_run(project, "jobs", "clear", "--json").stdout) == []
    refused = _run(project, "jobs", "clear", "--limit", "0")
    assert refused.returncode == 2 and "Invalid value for '--limit'" in refused.stderr
    store = open_store(project[1]["SPKY_STORE"])
    try:
        assert [(c.outcome, c.count) for c in store.counters()] == [("failed", 3)]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["run", "renderer", "/render", "--payload", '{"format": "gif"}'],
            1,
            "(POST /render): payload.gameId is required",
        ),
        (
            ["run", "renderer", "/render", "--payload", "{oops"],
            1,
            "error: --payload: not valid JSON",
        ),
        (["run", "nope", "/render"], 1, "error: backend: no backend 'nope' in sp00ky.yml"),
        (
            ["run", "renderer", "/render", "--retry-strategy", "random"],
            2,
            "Invalid value for '--retry-strategy'",
        ),
        (
            ["run", "renderer", "/render", "--max-retries", "-1"],
            2,
            "Invalid value for '--max-retries'",
        ),
        (["jobs", "get", "render_job:missing"], 1, "error: no job 'render_job:missing'"),
        (["jobs", "list", "--status", "done"], 2, "Invalid value for '--status'"),
    ],
)
def test_errors_name_what_is_wrong(
    project: tuple[Path, dict[str, str]], args: list[str], code: int, message: str
) -> None:
    done = _run(project, *args)
    assert done.returncode == code
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_store_url_is_a_clear_error(tmp_path: Path) -> None:
    done = cli("jobs", "list", env={"SPKY_STORE": "mysql://x"}, cwd=tmp_path)
    assert done.returncode == 1
    assert "error: store URL 'mysql://x' is not one this knows" in done.stderr


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_dashboard_refreshes_until_ctrl_c(project: tuple[Path, dict[str, str]]) -> None:
    _run(project, "run", "renderer", "/render", "--payload", '{"gameId": "g"}')
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "jobs", "--refresh", "0.2"],
        cwd=project[0],
        env={**os.environ, **project[1], "COLUMNS": "160", "LINES": "40"},
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
        # as a terminal starts it: Ctrl-C is not ignored (a runner started in the background
        # by a non-interactive shell passes SIGINT on ignored, and Python then keeps it so)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 20
        while b"recent jobs" not in seen or seen.count(b"UTC") < 2:  # drawn, then redrawn
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                seen += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)
        # keep reading while it stops: a full pty would block its last redraw, and its exit
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):
                    seen += os.read(leader, 65536)
        assert proc.wait(timeout=1) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    text = seen.decode(errors="replace")
    assert "jobs by status" in text and "pending" in text and "render_job:" in text
    assert "Traceback" not in text


UNCHECKED = (
    "warning: backend 'renderer' has no `spec`, so this job's payload was written unchecked; "
    "give the backend `spec: PATH` (its OpenAPI document, relative to sp00ky.yml) so that a "
    "payload is checked before its job is written"
)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_run_for_a_backend_without_a_spec_queues_and_says_the_payload_went_unchecked(
    project: tuple[Path, dict[str, str]],
) -> None:
    folder, env = project
    checked = cli_process(
        "run", "renderer", "/render", "--payload", '{"gameId": "g1"}', "--json",
        cwd=folder, env=env,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "spec" not in checked.stderr
    config = folder / "sp00ky.yml"
    config.write_text(config.read_text().replace("    spec: ./backend/openapi.yml\n", ""))

    done = cli_process(
        "run", "renderer", "/render", "--payload", '{"not": "in the spec"}', cwd=folder, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("render_job:") and "\n" not in done.stdout.strip()
    assert done.stderr.splitlines().count(UNCHECKED) == 1, done.stderr
    assert "has no `spec`" not in done.stderr.replace(UNCHECKED, "")

    as_json = cli_process(
        "run", "renderer", "/render", "--payload", '{"not": "in the spec"}', "--json",
        cwd=folder, env=env,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    job = json.loads(as_json.stdout)  # stdout is the job alone, as for a checked payload
    assert set(job) == set(json.loads(checked.stdout))
    assert job["payload"] == {"not": "in the spec"} and job["status"] == "pending"
    assert as_json.stderr.splitlines().count(UNCHECKED) == 1, as_json.stderr
