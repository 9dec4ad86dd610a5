"""The package as a user installs it: a wheel built from a copy of this checkout (what
``pip install .`` builds), installed in a fresh virtualenv at the versions of
requirements.lock, outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sp00ky_infra.shared.shipped import NAMES
from tests.helpers import ROOT

INSTALL_SECONDS = 300  # a cold package cache downloads the core set once
# what the build reads: the package's metadata, its packages and the files setup.py ships
SOURCES = ("pyproject.toml", "setup.py", "README.md", "sp00ky_infra", "agent", *NAMES)


def _check(*args: str | Path, cwd: Path) -> None:
    subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=INSTALL_SECONDS,
    )


def install_package(work: Path, extra: str = "") -> Path:
    """The bin directory of a fresh virtualenv under ``work`` holding the wheel and its core
    dependencies, and those of ``extra`` when one is named."""
    source = work / "source"  # a copy: the build leaves build/ and egg-info beside its sources
    source.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source / name)
    python = sys.executable
    _check(python, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--no-build-isolation", "--wheel-dir", work / "dist", source, cwd=work)  # fmt: skip
    (wheel,) = (work / "dist").glob("sp00ky_infra-*.whl")
    # uv installs from its cache of wheels: seconds once the locked versions are in it
    _check(python, "-m", "uv", "venv", "--quiet", "--python", python, work / "venv", cwd=work)
    _check(python, "-m", "uv", "pip", "install", "--quiet", "--python", work / "venv/bin/python",
           "--constraint", ROOT / "requirements.lock", f"{wheel}[{extra}]" if extra else wheel,
           cwd=work)  # fmt: skip
    return work / "venv/bin"


def user_env(installed: Path, **extra: str) -> dict[str, str]:
    """A user's environment: the installed bin first on PATH, none of this checkout's settings
    (no SPKY_ variable, no PYTHONPATH)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPKY_")}
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{installed}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}
