"""`sp00ky-infra dev`, `controller` and `pools` as a user runs them."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from sp00ky_infra.store import open_store
from tests.controllers import ADMIN_TOKEN, backend_app, project, running_controller, wait_for
from tests.helpers import ROOT, cli, cli_process, drain_pty


def _processing(db: Path) -> int:
    """Jobs of the example's render table that are running now (0 before the table exists)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'processing'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0])


def _agents_of(folder: Path) -> list[int]:
    """Agent and backend processes whose working directory is ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if Path(os.readlink(entry / "cwd")) == folder and "python" in os.readlink(
                    entry / "exe"
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _dev_burst(
    tmp_path: Path, burst: int, seconds: float, server_type: str = "cx33"
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``dev`` on a copy of the examples (its pool of ``server_type``): a burst of jobs on
    local machines, until the pool is idle again."""
    shutil.copytree(
        ROOT / "examples", tmp_path / "project", ignore=shutil.ignore_patterns(".sp00ky")
    )
    folder = tmp_path / "project"
    config = folder / "sp00ky.yml"
    config.write_text(config.read_text().replace("type: cx33", f"type: {server_type}"))
    env = {"SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms", "SPKY_STORE": ""}
    done = cli_process(
        "dev", "sp00ky.yml", "--machines", "local", "--burst", str(burst), "--path", "/render",
        "--payload", json.dumps({"gameId": "g", "seconds": seconds}),
        "--timings", "idleTimeout=1s", "--exit-when-idle", "--plain",
        cwd=folder, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, done


def test_dev_runs_a_burst_and_returns_to_zero(tmp_path: Path) -> None:
    folder, done = _dev_burst(tmp_path, 3, 0.5)
    out = done.stdout
    assert "3 job(s) queued" in out and "3 of 3 job(s) succeeded, 0 failed" in out
    for event in ("scale_up", "ready", "drain", "destroyed"):
        assert f"render {event}:" in out
    assert _agents_of(folder) == []
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        assert store.counts()["success"] == 3 and store.machines.live() == []
    finally:
        store.close()


def test_dev_says_the_cost_is_unknown_for_a_type_with_no_known_price(tmp_path: Path) -> None:
    _, done = _dev_burst(tmp_path, 1, 0.1, server_type="cx22")  # no known price
    assert "1 of 1 job(s) succeeded" in done.stdout
    assert "pool render: cost unknown as cx22 (no known price)" in done.stdout


def test_dev_never_prints_the_store_urls_password(tmp_path: Path, postgres_url: str) -> None:
    shutil.copytree(
        ROOT / "examples", tmp_path / "project", ignore=shutil.ignore_patterns(".sp00ky")
    )
    password = postgres_url.split("//", 1)[1].split("@", 1)[0].partition(":")[2]
    assert password, "the test store's URL carries a password"
    env = {"SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms", "SPKY_STORE": ""}
    done = cli_process(
        "dev", "sp00ky.yml", "--machines", "local", "--store", postgres_url, "--burst", "1",
        "--path", "/render",
        "--payload", '{"gameId": "g"}', "--timings", "idleTimeout=1s", "--exit-when-idle",
        "--plain", cwd=tmp_path / "project", env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert ":***@" in done.stdout  # the banner names the store, without its password
    assert f":{password}@" not in done.stdout + done.stderr


def test_dev_ctrl_c_stops_everything_and_leaves_no_process(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "examples", tmp_path / "project", ignore=shutil.ignore_patterns(".sp00ky")
    )
    folder = tmp_path / "project"
    leader, follower = pty.openpty()
    env = {**os.environ, "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "COLUMNS": "140"}
    env.pop("SPKY_STORE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "dev", "sp00ky.yml", "--machines", "local",
         "--burst", "2", "--path",
         "/render", "--payload", '{"gameId": "g", "seconds": 30}'],
        cwd=folder, env=env, stdin=follower, stdout=follower, stderr=follower, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"is ready" not in seen or len(_agents_of(folder)) < 4:  # 2 agents, 2 backends
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)
        assert b"pools" in seen and b"want" in seen  # the live view is drawn
        while _processing(folder / ".sp00ky" / "state.db") < 2:  # both jobs dispatched
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)  # Ctrl-C, with two 30 s jobs running: it drains
        while b"stopping: 2 machines, 2 jobs running" not in seen:
            assert time.monotonic() < deadline + 15, seen.decode(errors="replace")
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)  # Ctrl-C again: abort
        assert proc.wait(timeout=30) == 130
        seen += drain_pty(leader)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert b"aborted: 2 machine(s) destroyed, 2 job(s) back in the queue" in seen, seen.decode(
        errors="replace"
    )
    assert _agents_of(folder) == []


def test_pools_commands(tmp_path: Path) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": {"min": 1}}, {"renderer": backend_app("render", "render_job", log)}
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    with running_controller(tmp_path, config, store_url) as controller:
        env = {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}
        machine = wait_for(
            lambda: next(
                (
                    m["name"]
                    for m in controller.pool("render")["machine_list"]
                    if m["state"] == "ready"
                ),
                None,
            ),
            what="a ready machine",
        )
        listed = json.loads(cli("pools", "list", "--json", env=env).stdout)
        assert listed[0]["name"] == "render" and listed[0]["machines"] == {"ready": 1}
        table = cli("pools", "list", env=env).stdout
        assert "render" in table and "1 ready" in table
        shown = cli("pools", "get", "render", env=env).stdout
        assert "render: backend renderer on local (hetzner in sp00ky.yml); desired 1" in shown
        assert machine in shown
        got = json.loads(cli("pools", "get", "render", "--json", env=env).stdout)
        assert (got["provider"], got["provisioner"], got["declared_provider"]) == (
            "local",
            "local",
            "hetzner",
        )
        assert cli("pools", "pause", "render", env=env).stdout.strip() == "render: paused"
        assert json.loads(cli("pools", "get", "render", "--json", env=env).stdout)["paused"] is True
        assert cli("pools", "resume", "render", env=env).stdout.strip() == "render: resumed"
        assert cli("pools", "drain", machine, env=env).stdout.strip() == f"{machine}: draining"
        missing = cli("pools", "get", "nope", env=env)
        assert missing.returncode == 1 and "error: no pool 'nope' (pools: render)" in missing.stderr
        wrong = cli("pools", "list", env={**env, "SPKY_ADMIN_TOKEN": "wrong"})
        assert wrong.returncode == 1 and "admin token" in wrong.stderr
    down = cli("pools", "list", env={"SPKY_ADMIN_URL": "http://127.0.0.1:9"})
    assert (
        down.returncode == 1 and "cannot reach the admin API at http://127.0.0.1:9" in down.stderr
    )


def test_controller_refuses_bad_settings_naming_the_variable(tmp_path: Path) -> None:
    config = project(
        tmp_path, {"render": {"min": 1}}, {"renderer": backend_app("render", "t", tmp_path / "l")}
    )
    for env, message in (
        ({"SPKY_POOL_PORT": "eighty"}, "SPKY_POOL_PORT: 'eighty' is not a whole number"),
        ({"SPKY_TICK": "2 seconds"}, "SPKY_TICK: '2 seconds' is not a duration"),
        ({"SPKY_POOL_TIMINGS": "lease=fast"}, "SPKY_POOL_TIMINGS: lease: 'fast' is not a duration"),
        ({"SPKY_POOL_TIMINGS": "speed=3s"}, "SPKY_POOL_TIMINGS: unknown timing 'speed'"),
        ({"SPKY_POOL_PROVIDER": "aws"}, "SPKY_POOL_PROVIDER: 'aws' is not a provisioner"),
        (
            {"SPKY_POOL_PROVIDER": "pulumi", "SPKY_POOL_SECRET": "s"},
            "pool render (provider hetzner) needs SPKY_PROJECT, which is not set: the stack "
            "labels its machines with the project",
        ),
    ):
        # in process: each is refused before the controller opens anything
        done = cli("controller", cwd=tmp_path, env={"SPKY_CONFIG": str(config), **env})
        assert done.returncode == 2 and message in done.stderr, (env, done.stderr)
    invalid = project(
        tmp_path / "bad",
        {"render": {"min": 0}},
        {"renderer": backend_app("render", "t", tmp_path / "l")},
    )
    done = cli("controller", cwd=tmp_path, env={"SPKY_CONFIG": str(invalid)})
    assert done.returncode == 1 and "pools.render.min" in done.stderr
