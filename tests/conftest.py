"""Shared fixtures: stores on real SQLite and real PostgreSQL, Docker engines, the Pulumi
engine; the markers a test gets from the fixtures it uses; Hypothesis's profiles.

PostgreSQL tests use $SPKY_TEST_POSTGRES_URL (each test in a schema of its own). Without it
they skip, except where $SPKY_TEST_REQUIRE_SERVICES=1 (CI), where they fail.

Every test that uses the host's Docker engine runs in one xdist group (one worker, in turn):
they share image tags, networks and the engine's clean-ups of earlier runs' containers. The
rehearsals' tests are a group of their own: their servers are containers of their own image,
and each rehearsal counts every rehearsal server left on the engine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from sp00ky_infra.controller.provisioners.inline import without_grpc_fork_support
from sp00ky_infra.store import SqlStore, open_store
from tests.helpers import CI

# As the controller does before its first inline program, here before any test imports grpc:
# tests run inline programs in their own process, then fork children that run Python first
without_grpc_fork_support()

POSTGRES_URL = os.environ.get("SPKY_TEST_POSTGRES_URL", "")
REQUIRE_SERVICES = os.environ.get("SPKY_TEST_REQUIRE_SERVICES") == "1"

# CI draws every example a test asks for; a developer's run a fifth of them (tests.helpers.
# examples). No deadline: a worker shares the machine with the others.
settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile("ci" if CI else "dev")

# fixture -> the markers every test that uses it (directly or through another) gets
FIXTURE_MARKERS = {
    "postgres_url": ("postgres",),
    "docker_engine": ("docker",),
    "pulumi_bin": ("engine", "slow"),
    "machine_engine": ("slow",),
    "rehearsal_image": ("slow",),
}
# fixture -> the xdist group of a Docker test that uses it (any other: "docker")
FIXTURE_GROUPS = {"rehearsal_image": "rehearse"}


def _start_order(item: pytest.Item) -> int:
    if item.get_closest_marker("xdist_group"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, markers in FIXTURE_MARKERS.items():
            if fixture in names:
                for marker in markers:
                    item.add_marker(marker)
        if item.get_closest_marker("docker"):
            group = next((g for f, g in FIXTURE_GROUPS.items() if f in names), "docker")
            item.add_marker(pytest.mark.xdist_group(group))
    # The longest first: xdist hands work out in collection order, and a group (a chain of
    # tests on one worker) or a slow test started last would be the whole run's tail.
    items.sort(key=_start_order)
    # scripts/test's two passes: every other test on the workers, then the `alone` ones
    wanted = {"parallel": False, "alone": True}.get(os.environ.get("SPKY_TEST_PASS", ""))
    if wanted is not None:
        alone = {item: bool(item.get_closest_marker("alone")) for item in items}
        config.hook.pytest_deselected(items=[item for item in items if alone[item] != wanted])
        items[:] = [item for item in items if alone[item] == wanted]


def need_service(name: str, why: str) -> None:
    """Skip for lack of a service, or fail where CI requires every service."""
    message = f"{name} is not available: {why}"
    if REQUIRE_SERVICES:
        pytest.fail(message + " (SPKY_TEST_REQUIRE_SERVICES=1: CI must provide it)")
    pytest.skip(message)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL store URL whose tables live in a fresh schema, dropped afterwards."""
    if not POSTGRES_URL:
        need_service("PostgreSQL", "set SPKY_TEST_POSTGRES_URL=postgresql://user:pw@host/db")
    import psycopg

    from sp00ky_infra.store.postgres import scratch_schema

    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(scratch_schema(POSTGRES_URL, "test"))
        except psycopg.OperationalError as exc:
            need_service("PostgreSQL", str(exc))
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    opened = open_store(store_url)
    yield opened
    opened.close()


BASE_IMAGE = "sp00ky-test/python:3"
BACKEND_IMAGE = "sp00ky-dev-pool-renderer"


def docker_available() -> str | None:
    """Why Docker cannot be used here, or None when it can."""
    import shutil
    import subprocess

    if shutil.which("docker") is None:
        return "the docker client is not installed (apt-get install docker.io)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        return f"no Docker engine answers (start dockerd): {info.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """The host's Docker engine, answering."""
    why = docker_available()
    if why:
        need_service("Docker", why)


@pytest.fixture(scope="session")
def docker_images(docker_engine: None) -> str:
    """A real Docker engine with the example backend's image built on a local base image."""
    import subprocess

    from tests.helpers import ROOT

    subprocess.run(
        [str(ROOT / "scripts" / "docker-base-image"), BASE_IMAGE], check=True, timeout=900
    )
    subprocess.run(
        ["docker", "build", "-q", "--build-arg", f"BASE={BASE_IMAGE}", "-t", BACKEND_IMAGE,
         str(ROOT / "examples" / "backend")],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return BACKEND_IMAGE


@pytest.fixture
def machine_engine(docker_images: str) -> Iterator[Any]:
    """A second, empty Docker engine: the machine's own, so an image really has to travel."""
    import shutil

    from tests.engines import second_engine

    if shutil.which("dockerd") is None:
        need_service("dockerd", "apt-get install docker.io")
    with second_engine() as engine:
        yield engine


@pytest.fixture
def image_registry(docker_images: str) -> Iterator[Any]:
    """A Docker registry on 127.0.0.1 with htpasswd credentials (Debian's docker-registry)."""
    import shutil

    from tests.engines import registry

    for binary, package in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils")):
        if shutil.which(binary) is None:
            need_service(binary, f"apt-get install -y {package}")
    with registry(auth=True) as started:
        yield started


@pytest.fixture(scope="session")
def pulumi_bin() -> str:
    """The directory of the Pulumi engine built by scripts/pulumi-engine at the pinned SDK's
    version (the CLI, its Python language host and the dynamic-provider launcher)."""
    import subprocess

    from tests.helpers import ROOT

    found = subprocess.run(
        [str(ROOT / "scripts" / "pulumi-engine"), "--path"], capture_output=True, text=True
    )
    if found.returncode != 0:
        need_service("the Pulumi engine", "build it with scripts/pulumi-engine (Go, ~7 min cold)")
    return found.stdout.strip()
