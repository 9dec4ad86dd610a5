"""The pool view shows the queue: GET /pools/NAME and `pools get` list the
waiting entries in admission order and the recent terminal ones; the `jobs` dashboard shows
the pool tables. A real controller process, the commands as a user types them."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.controllers import ADMIN_TOKEN, backend_app, project, running_controller
from tests.helpers import cli


def test_the_pool_view_lists_the_queue_and_cancels_from_it(tmp_path: Path, store_url: str) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path,
        {"render": {"autoscale": True, "min": 0, "max": 1, "slots": 2}},
        {"renderer": backend_app("render", "render_job", log)},
    )
    with running_controller(tmp_path, config, store_url) as controller:
        admin = {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}
        user = {"SPKY_CONFIG": str(config), "SPKY_STORE": store_url, **admin}
        assert cli("pools", "pause", "render", env=admin).returncode == 0  # nothing is admitted

        def run(*options: str) -> str:
            done = cli("run", "renderer", "/render", "--payload", '{"gameId": "g"}', *options,
                       env=user)  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        low = run()
        high = run("--priority", "5", "--slots", "2")
        later = run()
        delayed = run("--delay", "600000", "--priority", "9")
        shown = json.loads(cli("pools", "get", "render", "--json", env=admin).stdout)
        waiting = shown["waiting"]
        assert [entry["key"] for entry in waiting] == [high, low, later, delayed]
        head = waiting[0]
        assert (head["priority"], head["slots"]) == (5, 2)
        assert head["queue_deadline"] == head["due_at"] + 3600
        assert head["cancel"] == f"POST /pools/render/queue/{high}/cancel"
        assert waiting[3]["due_at"] > time.time() + 500  # due later, so behind the due ones

        text = cli("pools", "get", "render", env=admin).stdout
        assert "waiting, in admission order (4 shown of 4; cancel one with " in text
        assert "`sp00ky-infra pools cancel render KEY`" in text
        lines = [line for line in text.splitlines() if "render_job:" in line]
        assert [line.split()[0] for line in lines] == [high, low, later, delayed]

        cancelled = cli("pools", "cancel", "render", low, env=admin)
        assert cancelled.stdout.strip() == f"{low}: cancelled (failed with code cancelled)"
        after = json.loads(cli("pools", "get", "render", "--json", env=admin).stdout)
        assert [entry["key"] for entry in after["waiting"]] == [high, later, delayed]
        assert after["recent"][0]["key"] == low
        assert (after["recent"][0]["status"], after["recent"][0]["code"]) == ("failed", "cancelled")
        text = cli("pools", "get", "render", env=admin).stdout
        assert "recent terminal entries, last finished first:" in text
        assert any(line.split()[:3] == [low, "failed", "cancelled"] for line in text.splitlines())

        again = cli("pools", "cancel", "render", low, env=admin)
        assert again.returncode == 1
        assert f"job {low} is failed, not waiting" in again.stderr

        # the manual start takes the job's own queueTimeout (seconds or a duration) too
        started = controller.admin(
            "POST",
            "/pools/render/jobs",
            json={"path": "/render", "payload": {"gameId": "g"}, "queueTimeout": "30m"},
        )
        assert started.status_code == 202, started.text
        own = json.loads(cli("jobs", "get", started.json()["queueId"], "--json", env=user).stdout)
        assert own["queue_timeout"] == 1800
        refused = controller.admin(
            "POST", "/pools/render/jobs", json={"path": "/render", "payload": {"gameId": "g"},
                                               "queueTimeout": 0},
        )  # fmt: skip
        assert refused.status_code == 409
        assert "queueTimeout is 0, but a job must be able to wait" in refused.json()["error"]

        screen = _dashboard(tmp_path, user)
        assert "pools" in screen and "waiting, in admission order" in screen
        assert "paused" in screen and high in screen
        assert "sp00ky-infra pools cancel POOL KEY" in screen


def _dashboard(folder: Path, env: dict[str, str]) -> str:
    """Bare `jobs` on a terminal: what it draws before Ctrl-C."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "jobs", "--refresh", "0.2"],
        cwd=folder, env={**os.environ, **env, "COLUMNS": "200", "LINES": "60"},
        stdin=follower, stdout=follower, stderr=follower, close_fds=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 20
        while b"recent jobs" not in seen or seen.count(b"UTC") < 2:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([leader], [], [], 0.5)[0]:
                seen += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    seen += os.read(leader, 65536)
        assert proc.wait(timeout=1) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return seen.decode(errors="replace")
