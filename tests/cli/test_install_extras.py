"""The package as a user installs it: a wheel of this checkout in a fresh virtualenv without any
extra, at the versions of requirements.lock, run from a project directory outside the checkout.
The core commands work there; those that need an extra say which one to install."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.installed import install_package, user_env

pytestmark = pytest.mark.slow

Run = Callable[..., subprocess.CompletedProcess[str]]
EXTRA_MODULES = ("pulumi", "grpc", "fabric", "paramiko", "mcp")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh virtualenv holding the wheel and its core dependencies."""
    return install_package(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user") / "project"
    shutil.copytree(ROOT / "examples", folder)
    return folder


@pytest.fixture(scope="module")
def spooky(installed: Path, project: Path) -> Run:
    env = user_env(installed)

    def run(*args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(installed / "sp00ky-infra"), *args],
            cwd=project,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


def test_the_core_install_holds_no_extra(installed: Path) -> None:
    probe = (
        "import importlib.util, json\n"
        f"print(json.dumps([m for m in {EXTRA_MODULES!r} if importlib.util.find_spec(m)]))"
    )
    done = subprocess.run(
        [str(installed / "python"), "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert json.loads(done.stdout) == [], done.stderr


def test_lint_run_and_jobs_work_without_extras(spooky: Run) -> None:
    linted = spooky("lint", "sp00ky.yml")
    assert linted.returncode == 0, linted.stderr
    assert "sp00ky.yml: ok." in linted.stdout
    queued = spooky("run", "renderer", "/render", "--payload", '{"gameId": "g1"}')
    assert queued.returncode == 0, queued.stderr
    job = queued.stdout.split()[0]
    assert job.startswith("render_job:")
    listed = spooky("jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(j["id"], j["status"]) for j in json.loads(listed.stdout)] == [(job, "pending")]
    refused = spooky("run", "renderer", "/render", "--payload", '{"format": "mp4"}')
    assert refused.returncode == 1 and "payload.gameId is required" in refused.stderr


def test_dev_runs_a_burst_on_local_processes_without_extras(spooky: Run) -> None:
    done = spooky(
        "dev", "sp00ky.yml", "--store", "sqlite:///.sp00ky/dev.db", "--machines", "local",
        "--burst", "2", "--path", "/render", "--payload", '{"gameId": "g1", "seconds": 0}',
        "--timings", "idleTimeout=1s", "--exit-when-idle", "--plain", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 job(s) succeeded, 0 failed" in done.stdout


def test_simulate_works_without_extras(spooky: Run) -> None:
    done = spooky(
        "simulate", "--config", "sp00ky.yml", "--rate", "6", "--hours", "2", "--duration", "exp:4m"
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "command", "extra"),
    [
        (["mcp"], "sp00ky-infra mcp", "mcp"),
        (["guardian", "install", "--host", "ops.invalid"], "sp00ky-infra guardian install",
         "fabric"),
        (["rehearse"], "sp00ky-infra rehearse", "pulumi"),
    ],
)  # fmt: skip
def test_a_command_that_needs_an_extra_names_it(
    spooky: Run, args: list[str], command: str, extra: str
) -> None:
    done = spooky(*args, HCLOUD_TOKEN="t")
    assert done.returncode == 2
    assert done.stderr == (
        f"error: {command} needs the {extra} extra, which is not installed: "
        f"pip install 'sp00ky-infra[{extra}]'\n"
    )


def test_the_pulumi_controller_names_its_extra(spooky: Run) -> None:
    done = spooky("controller", "--config", "sp00ky.yml", SPKY_POOL_PROVIDER="pulumi")
    assert done.returncode == 2
    assert (
        "  - pool render (provider hetzner) needs the Pulumi SDK (a stack makes its machines), "
        "but the pulumi extra is not installed: pip install 'sp00ky-infra[pulumi]'\n" in done.stderr
    )
    assert "Traceback" not in done.stderr
