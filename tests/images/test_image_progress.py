"""Image builds and pulls show their progress on a terminal (build steps,
pulled layers) and print nothing when the output is not a terminal. Against the real dockerd;
no registry outside the machine is reachable, so images start from the local base image."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import re
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import BuildError
from rich.console import Console
from rich.progress import Progress

from sp00ky_infra import engine
from sp00ky_infra.cli.controller import build_tail
from sp00ky_infra.cli.progress import ImageBars
from sp00ky_infra.shared.names import machine_image, pool_image
from tests.conftest import BASE_IMAGE
from tests.controllers import backend_app, project
from tests.engines import REGISTRY_PASSWORD, REGISTRY_USER
from tests.helpers import ROOT, drain_pty

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def backend(docker_images: str) -> Iterator[str]:
    """A backend name of this test's own: its images never clash with another test's."""
    name = f"prog{secrets.token_hex(3)}"
    yield name
    client = docker.from_env()
    for image in (machine_image(name), pool_image(name), f"{name}-pulled:1"):
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image, force=True)
    client.close()


def _context(folder: Path, *, fails: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "server.py").write_text((ROOT / "examples/backend/server.py").read_text())
    run = "RUN false" if fails else "RUN echo step-output"
    (folder / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n{run}\nCOPY server.py /app/server.py\n"
        'CMD ["python3", "/app/server.py"]\n'
    )
    return folder / "Dockerfile"


def test_a_build_tells_each_step_to_the_reporter(tmp_path: Path, backend: str) -> None:
    dockerfile = _context(tmp_path / "backend")
    told: list[tuple[str, Mapping[str, Any]]] = []
    client = docker.from_env()
    try:
        with engine.reporting(lambda what, event: told.append((what, event))):
            command = engine.build_images(
                client, "t", backend, str(dockerfile), str(dockerfile.parent)
            )
        assert command == ["python3", "/app/server.py"]
        steps = [
            (what, str(event["stream"]).strip())
            for what, event in told
            if str(event.get("stream", "")).startswith("Step ")
        ]
        assert (f"building {pool_image(backend)}", "Step 1/6 : FROM " + BASE_IMAGE) in steps
        assert (f"building {pool_image(backend)}", "Step 2/6 : RUN echo step-output") in steps
        assert any(what == f"building {machine_image(backend)}" for what, _ in steps)
        told.clear()
        engine.build_pool_image(client, "t", backend, str(dockerfile), str(dockerfile.parent))
        assert told == []  # outside the context: nobody is told
    finally:
        client.close()


def test_a_failed_build_keeps_its_log(tmp_path: Path, backend: str) -> None:
    """The streamed build raises as docker's own did: BuildError, its log for the refusal."""
    dockerfile = _context(tmp_path / "backend", fails=True)
    client = docker.from_env()
    try:
        with pytest.raises(BuildError) as failed:
            engine.build_pool_image(client, "t", backend, str(dockerfile), str(dockerfile.parent))
        assert "returned a non-zero code: 1" in str(failed.value)
        assert any("Step 2/6 : RUN false" in line for line in build_tail(failed.value))
    finally:
        client.close()


def _bars(events: list[tuple[str, dict[str, Any]]]) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with Progress(console=console, auto_refresh=False) as bar:
        bars = ImageBars(bar)
        for what, event in events:
            bars(what, event)
        bar.refresh()
        return "\n".join(
            f"{task.description} {task.completed:g}/{task.total}" for task in bar.tasks
        )


def test_the_bars_count_build_steps_and_pulled_layers() -> None:
    shown = _bars(
        [
            ("building img", {"stream": "Step 1/3 : FROM base"}),
            ("building img", {"stream": "Step 2/3 : RUN make"}),
            ("pulling r/x:1", {"status": "Pulling from r/x", "id": "1"}),
            ("pulling r/x:1", {"status": "Pulling fs layer", "id": "aa"}),
            ("pulling r/x:1", {"status": "Already exists", "id": "bb"}),
            ("pulling r/x:1", {"status": "Downloading", "id": "aa", "progressDetail": {}}),
        ]
    )
    assert "building img: RUN make 1/3" in shown, shown
    assert "pulling r/x:1: Downloading aa 1/2" in shown, shown  # bb is there, aa on its way
    done = _bars(
        [
            ("building img", {"stream": "Step 3/3 : CMD x"}),
            ("building img", {"stream": "Successfully built 0123abcd\n"}),
            ("pulling r/x:1", {"status": "Pull complete", "id": "aa"}),
            ("pulling r/x:1", {"status": "Status: Downloaded newer image for r/x:1"}),
        ]
    )
    assert "building img: built 3/3" in done and "Status: Downloaded newer image" in done, done


def test_a_pull_tells_its_layers(tmp_path: Path, backend: str, image_registry: Any) -> None:
    """A registry on 127.0.0.1: the image's own layer is pulled, the base's exists already."""
    dockerfile = _context(tmp_path / "backend")
    client = docker.from_env()
    try:
        built = engine.build_pool_image(
            client, "t", backend, str(dockerfile), str(dockerfile.parent)
        )
        built.tag(f"{backend}-pulled:1")
        digest = image_registry.push(f"{backend}-pulled:1", f"{backend}:1")
        client.images.remove(pool_image(backend), force=True)
        client.images.remove(f"{backend}-pulled:1", force=True)
        told: list[tuple[str, Mapping[str, Any]]] = []
        reference = f"{image_registry.host}/{backend}@{digest}"
        auth = {"username": REGISTRY_USER, "password": REGISTRY_PASSWORD}
        with engine.reporting(lambda what, event: told.append((what, event))):
            command = engine.pull_images(client, backend, reference, auth)
        assert command == ["python3", "/app/server.py"]
        statuses = {str(e.get("status")) for what, e in told if what == f"pulling {reference}"}
        assert "Pull complete" in statuses and "Already exists" in statuses, statuses
    finally:
        client.close()


def _dev_project(folder: Path, backend: str) -> Path:
    _context(folder / "backend")
    app = backend_app("render", "render_job", folder / "unused.jsonl")
    app["deploy"]["dockerfile"] = "./backend/Dockerfile"
    return project(folder, {"render": {"min": 0, "autoscale": True, "max": 1}}, {backend: app})


def _dev_env(name: str) -> dict[str, str]:
    env = {
        **os.environ, "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms",
        "SPKY_PROJECT": name, "SPKY_POOL_DOCKER_NETWORK": f"sp00ky-{name}", "COLUMNS": "200",
        "TERM": "xterm",
    }  # fmt: skip
    env.pop("SPKY_STORE", None)
    return env


def _remove_network(name: str) -> None:
    client = docker.from_env()
    for network in client.networks.list(names=[f"sp00ky-{name}"]):
        network.remove()
    client.close()


def test_dev_on_a_terminal_shows_the_builds_and_piped_prints_none(
    tmp_path: Path, backend: str
) -> None:
    _dev_project(tmp_path, backend)
    env = _dev_env(backend)
    command = [sys.executable, "-m", "sp00ky_infra", "dev", "sp00ky.yml", "--plain",
               "--machines", "docker"]  # fmt: skip
    leader, follower = pty.openpty()
    # faulthandler: a dev that does not stop is sent SIGABRT and prints where each thread is
    dev = subprocess.Popen(
        command, cwd=tmp_path, env={**env, "PYTHONFAULTHANDLER": "1"}, stdin=follower,
        stdout=follower, stderr=follower, start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 180
        while b"Ctrl-C stops everything" not in seen and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dev.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                dev.wait(timeout=10)
            seen += drain_pty(leader, 0.5)
            raise AssertionError(
                "dev did not stop within 60 s of Ctrl-C; it printed:\n"
                + seen.decode(errors="replace")
            ) from None
        seen += drain_pty(leader, 0.2)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        os.close(leader)
    text = ANSI.sub("", seen.decode(errors="replace"))
    assert "Ctrl-C stops everything" in text, text
    assert f"building {pool_image(backend)}: RUN echo step-output" in text, text
    assert re.search(f"building {pool_image(backend)}: built .{{0,80}} 6/6", text), text
    assert re.search(f"building {machine_image(backend)}: built .{{0,80}} (\\d+)/\\1", text), text

    piped = subprocess.run(
        [*command, "--exit-when-idle"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    _remove_network(backend)
    assert piped.returncode == 0, piped.stdout + piped.stderr
    everything = piped.stdout + piped.stderr
    assert "on Docker containers" in everything
    assert "building" not in everything and "Step" not in everything, everything
    assert "\x1b[" not in everything
