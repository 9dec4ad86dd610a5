"""One store per project: the state directory is next to sp00ky.yml
whatever the working directory, and `run` / `jobs` say when nothing serves the store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sp00ky_infra.config.project import default_store_url, state_dir
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import open_store
from tests.helpers import ROOT, cli

PAYLOAD = '{"gameId": "g", "seconds": 0.2}'
# no store, no config from the environment: the defaults are what is tested
CLEAN = {"SPKY_STORE": "", "SPKY_CONFIG": "", "SPKY_ADMIN_URL": "", "SPKY_ADMIN_TOKEN": ""}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with the example project in examples/, as the docs' commands use it."""
    shutil.copytree(ROOT / "examples", tmp_path / "repo" / "examples",
                    ignore=shutil.ignore_patterns(".sp00ky"))  # fmt: skip
    return tmp_path / "repo"


def test_the_state_directory_follows_the_config_file(tmp_path: Path) -> None:
    assert state_dir("sp00ky.yml") == Path(".sp00ky")
    assert state_dir("examples/sp00ky.yml") == Path("examples/.sp00ky")
    assert default_store_url(tmp_path / "p" / "sp00ky.yml") == (
        f"sqlite:///{tmp_path}/p/.sp00ky/state.db"
    )
    settings = ControllerSettings.from_env({}, config_path="examples/sp00ky.yml")
    assert settings.state_dir == "examples/.sp00ky"
    assert settings.store_url == "sqlite:///examples/.sp00ky/state.db"
    told = ControllerSettings.from_env({"SPKY_STORE": "sqlite:///elsewhere.db"})
    assert told.store_url == "sqlite:///elsewhere.db"  # $SPKY_STORE still wins


def test_run_from_anywhere_writes_the_projects_store_and_says_none_serves_it(
    repo: Path,
) -> None:
    done = cli("run", "renderer", "/render", "--payload", PAYLOAD,
               "--config", "examples/sp00ky.yml", cwd=repo, env=CLEAN)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()  # stdout stays the id alone
    assert (repo / "examples" / ".sp00ky" / "state.db").is_file()
    assert not (repo / ".sp00ky").exists()
    assert done.stderr.strip() == (
        "queued; no controller is running for this store "
        "(sqlite:///examples/.sp00ky/state.db): start one with "
        "`sp00ky-infra dev examples/sp00ky.yml`"
    )
    # the same project from its own directory: the same store
    listed = cli("jobs", "list", "--json", cwd=repo / "examples", env=CLEAN)
    assert [job["id"] for job in json.loads(listed.stdout)] == [job_id]
    assert "note: jobs are pending and no controller is running for this store" in listed.stderr
    shown = cli("jobs", "get", job_id, "--json", env={**CLEAN, "SPKY_CONFIG": str(
        repo / "examples" / "sp00ky.yml")}, cwd=repo.parent)  # fmt: skip
    assert json.loads(shown.stdout)["status"] == "pending"


def test_a_missing_config_names_the_flag(repo: Path) -> None:
    done = cli("run", "renderer", "/render", "--payload", PAYLOAD, cwd=repo, env=CLEAN)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: sp00ky.yml: no such file; pass the path of your sp00ky.yml with "
        "--config FILE (or set SPKY_CONFIG)"
    )
    linted = cli("lint", "nowhere.yml", cwd=repo, env=CLEAN)
    assert linted.returncode == 2
    assert "pass the path of your sp00ky.yml as FILE: sp00ky-infra lint FILE" in linted.stderr


@pytest.fixture
def dev_from_the_root(repo: Path) -> Iterator[subprocess.Popen[str]]:
    """`dev examples/sp00ky.yml` from the repository's root, as the docs' commands run it."""
    env = {**os.environ, **CLEAN, "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0",
           "SPKY_TICK": "200ms"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "dev", "examples/sp00ky.yml",
         "--plain", "--machines", "local",
         "--timings", "idleTimeout=1s"],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_jobs_written_from_the_project_run_under_dev_started_from_the_root(
    repo: Path, dev_from_the_root: subprocess.Popen[str]
) -> None:
    examples = repo / "examples"
    store = open_store(f"sqlite:///{examples}/.sp00ky/state.db")
    lock = store.leader_lock()
    try:
        deadline = time.monotonic() + 30
        while lock.try_acquire():  # free: dev has not led yet
            lock.release()
            assert dev_from_the_root.poll() is None, dev_from_the_root.stdout
            assert time.monotonic() < deadline, "dev never led its store"
            time.sleep(0.1)
    finally:
        lock.release()
        store.close()
    done = cli("run", "renderer", "/render", "--payload", PAYLOAD, cwd=examples, env=CLEAN)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # a controller serves this store: nothing to say
    job_id = done.stdout.strip()
    deadline = time.monotonic() + 60
    while True:
        shown = json.loads(cli("jobs", "get", job_id, "--json", cwd=examples, env=CLEAN).stdout)
        if shown["status"] == "success":
            break
        assert shown["status"] in ("pending", "processing"), shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.3)
    assert not (repo / ".sp00ky" / "state.db").exists()


def test_the_hint_for_a_store_named_elsewhere_keeps_its_password(
    repo: Path, postgres_url: str
) -> None:
    password = postgres_url.split("//", 1)[1].split("@", 1)[0].partition(":")[2]
    done = cli("run", "renderer", "/render", "--payload", PAYLOAD, "--store", postgres_url,
               cwd=repo / "examples", env=CLEAN)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("queued; no controller is running for this store (postgresql://")
    assert done.stderr.strip().endswith(
        "start one with `sp00ky-infra dev sp00ky.yml` with --store (or SPKY_STORE) naming "
        "this store"
    )
    assert ":***@" in done.stderr and f":{password}@" not in done.stderr
