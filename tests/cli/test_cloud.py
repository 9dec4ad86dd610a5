"""`login URL` and `--cloud`: the operator's view from a laptop (the Jobs docs' `spky jobs
--cloud`). A real controller on loopback; the commands run from a folder with neither a
sp00ky.yml nor a store, so every answer can only have come through the admin API."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from tests.controllers import ADMIN_TOKEN, paused_controller
from tests.helpers import cli


def test_login_then_cloud_jobs_pools_schedules_and_explain(tmp_path: Path) -> None:
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "SPKY_ADMIN_TOKEN": ""}

    def run(*args: str) -> tuple[int, str, str]:
        done = cli(*args, cwd=laptop, env=env)
        return done.returncode, done.stdout, done.stderr

    with paused_controller(tmp_path / "server") as (controller, client):
        code, _, err = run("jobs", "list", "--cloud")
        assert code == 1 and "sp00ky-infra login URL" in err  # not logged in yet
        code, _, err = run("login", controller.admin_url, "--token", "wrong")
        assert code == 1 and "refused the token" in err and "nothing kept" in err
        code, out, _ = run("login", controller.admin_url, "--token", ADMIN_TOKEN)
        assert code == 0 and "logged in" in out
        kept = tmp_path / "config" / "sp00ky" / "login.json"
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        assert json.loads(kept.read_text()) == {"url": controller.admin_url, "token": ADMIN_TOKEN}

        job = client.run("renderer", "/render", {"gameId": "from-the-laptop"})
        code, out, _ = run("jobs", "--cloud", "list", "--json")
        assert code == 0 and [j["id"] for j in json.loads(out)] == [job.id]
        code, out, _ = run("jobs", "get", job.id, "--cloud")
        assert code == 0 and "from-the-laptop" in out and "status      : pending" in out
        code, out, _ = run("explain", job.id, "--cloud")
        assert code == 0 and "paused" in out
        code, out, _ = run("pools", "list", "--cloud", "--json")
        assert code == 0 and [p["name"] for p in json.loads(out)] == ["render"]
        code, out, _ = run("pools", "reset", "render", "--cloud")
        assert code == 0 and out.splitlines() == [
            "render: breaker closed (it was closed already)",
            "render: still paused: `sp00ky-infra pools resume render` undoes it",
        ]
        code, out, _ = run("schedules", "--cloud", "list")
        assert code == 0 and "no schedules" in out
        code, out, _ = run("jobs", "policy", "render_job", "--concurrency", "2", "--cloud")
        assert code == 0 and "render_job: concurrency 2" in out and "admin API" in out
        code, out, _ = run("jobs", "kill", job.id, "--cloud")
        assert code == 0 and "killed" in out
        assert client.store.get(job.id).status == "failed"
        code, out, _ = run("jobs", "retry", job.id, "--cloud", "--json")
        assert code == 0 and json.loads(out)["status"] == "pending"
        code, _, err = run("jobs", "clear", "--cloud", "--yes")
        assert code == 2 and "not over --cloud" in err

        code, out, _ = run("logout")
        assert code == 0 and not kept.exists()
