"""The rehearsal's machine image, for every test of a rehearsal."""

from __future__ import annotations

import shutil

import pytest

from sp00ky_infra.rehearse.image import Recipe, ensure_image, image_exists
from tests.conftest import need_service


@pytest.fixture(scope="session")
def rehearsal_image(docker_engine: None) -> str:
    """The rehearsal's machine image, built once per machine (scripts/rehearsal-image)."""
    if shutil.which("debootstrap") is None:
        need_service("debootstrap", "apt-get install debootstrap")
    return ensure_image()


@pytest.fixture(scope="session")
def rehearsal_image_without_docker(rehearsal_image: str) -> str:
    """The variant without Docker, when built: its debootstrap takes minutes, so a test run
    does not build it (scripts/rehearsal-image --without-docker does)."""
    variant = Recipe().without_docker().tag
    if not image_exists(variant):
        pytest.skip(
            f"the rehearsal image without Docker ({variant}) is not built: "
            "scripts/rehearsal-image --without-docker"
        )
    return variant
