"""The README's "Your own backend in five minutes", walked literally: its files are written
from its code blocks into a project directory outside the checkout, and its commands are run
there, as written, with the package installed from a wheel, until the job succeeds. A change to
the section's text that breaks the walk fails here."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import suppress
from functools import partial
from pathlib import Path

import pytest

from sp00ky_infra.controller.provisioners.local import session_members
from sp00ky_infra.shared.shipped import NAMES
from sp00ky_infra.store import open_store
from tests.controllers import kill_machines, wait_for
from tests.helpers import ROOT
from tests.installed import install_package, user_env

pytestmark = pytest.mark.slow

SECTION = "## Your own backend in five minutes"
FILE_BLOCK = re.compile(r"^`([\w.]+)`[^\n]*:\n\n```\w*\n(.*?)```", re.S | re.M)
SH_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
Run = Callable[[list[str]], subprocess.CompletedProcess[str]]


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    return readme[start : end if end > 0 else None]


def commands() -> list[tuple[list[str], str]]:
    """Each command of the section's shell blocks, split as a shell would, with its comment."""
    found = []
    for block in SH_BLOCK.findall(section()):
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            found.append((shlex.split(command), comment.strip()))
    return found


def test_the_section_names_its_files_and_commands() -> None:
    files = dict(FILE_BLOCK.findall(section()))
    assert sorted(files) == ["Dockerfile", "app.py", "openapi.yml", "sp00ky.yml"]
    assert [words[:2] for words, _ in commands()] == [
        ["sp00ky-infra", "lint"],
        ["sp00ky-infra", "dev"],
        ["sp00ky-infra", "run"],
        ["sp00ky-infra", "jobs"],
        ["sp00ky-infra", "run"],
    ]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_package(tmp_path_factory.mktemp("install"))


def test_the_wheel_carries_what_the_package_reads(installed: Path) -> None:
    """The agent archive (cloud-init's files in it) and the Pulumi program come from the
    installed package, not from a checkout."""
    probe = (
        "import json, tarfile, io\n"
        "from sp00ky_infra.shared.shipped import SHIPPED, shipped\n"
        "from sp00ky_infra.shared.cloud_init import agent_archive\n"
        f"paths = [str(shipped(name)) for name in {NAMES!r}]\n"
        "names = tarfile.open(fileobj=io.BytesIO(agent_archive())).getnames()\n"
        "print(json.dumps({'shipped': str(SHIPPED), 'paths': paths, 'names': names}))\n"
    )
    done = subprocess.run(
        [str(installed / "python"), "-c", probe],
        cwd=installed.parent,
        env=user_env(installed),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert all(path.startswith(found["shipped"]) for path in found["paths"]), found["paths"]
    assert {"install-agent.sh", "sp00ky-agent.service", "agent/main.py"} <= set(found["names"])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "my-project"
    folder.mkdir()
    for name, text in FILE_BLOCK.findall(section()):
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def dev_processes(project: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """What the walk starts in the background; stopped, with every machine, at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    with suppress(Exception):
        kill_machines(f"sqlite:///{project}/.sp00ky/state.db")


def test_the_readme_walks_to_a_succeeded_job_from_an_installed_package(
    installed: Path, project: Path, dev_processes: list[subprocess.Popen[str]]
) -> None:
    # the README's commands keep their default ports; here they must not meet another test's
    env = user_env(installed, SPKY_POOL_PORT="0", SPKY_ADMIN_PORT="0")

    def run(words: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            words, cwd=project, env=env, capture_output=True, text=True, timeout=120
        )

    job = ""
    for words, comment in commands():
        verb = words[1]
        if verb == "dev":
            log = open(project / "dev.out", "w")  # noqa: SIM115  # closed with the process
            dev = subprocess.Popen(words, cwd=project, env=env, stdout=log, stderr=log, text=True)
            dev_processes.append(dev)
            continue
        words = [job if word.endswith(":...") else word for word in words]
        done = run(words)
        if "exit 1: " in comment:  # a refusal, with the message the comment quotes
            assert done.returncode == 1, done.stdout + done.stderr
            assert comment.split("exit 1: ", 1)[1] in done.stderr
        elif verb == "run":
            assert done.returncode == 0, done.stderr
            job = done.stdout.split()[0]
        elif verb == "jobs":
            shown = wait_for(partial(_succeeded, run, words), timeout=90, what=f"{job} done")
            result = comment.split("result: ", 1)[1]
            assert f"result      : {result}" in shown.stdout, shown.stdout
        else:
            assert done.returncode == 0, done.stdout + done.stderr
            assert "ok" in done.stdout
    assert job.startswith("greet_job:")
    _stop(dev_processes[0], project)


def _succeeded(run: Run, words: list[str]) -> subprocess.CompletedProcess[str] | None:
    """``jobs get``'s answer once it says the job succeeded."""
    shown = run(words)
    status = next((line for line in shown.stdout.splitlines() if line.startswith("status")), "")
    return shown if "success" in status else None


def _no_session(pid: int) -> bool:
    return session_members(pid) == []


def _stop(dev: subprocess.Popen[str], project: Path) -> None:
    """Ctrl-C, as the README says: dev drains, destroys its machines and exits 0, and no
    process of a machine (its agent, its backend) is left."""
    dev.send_signal(signal.SIGINT)
    assert dev.wait(timeout=60) == 0, (project / "dev.out").read_text()[-2000:]
    store = open_store(f"sqlite:///{project}/.sp00ky/state.db")
    try:
        machines = store.machines.recent("greet")
    finally:
        store.close()
    assert machines and {m.state for m in machines} == {"destroyed"}
    sessions = [int(m.provider_id) for m in machines if m.provider_id]
    assert sessions and all(wait_for(partial(_no_session, pid), timeout=10) for pid in sessions)
