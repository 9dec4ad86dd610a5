"""The rehearsal's machine image, for every test of a rehearsal."""

from __future__ import annotations

import shutil

import pytest

from sp00ky_infra.rehearse.image import ensure_image
from tests.conftest import need_service


@pytest.fixture(scope="session")
def rehearsal_image(docker_engine: None) -> str:
    """The rehearsal's machine image, built once per machine (scripts/rehearsal-image)."""
    if shutil.which("debootstrap") is None:
        need_service("debootstrap", "apt-get install debootstrap")
    return ensure_image()
