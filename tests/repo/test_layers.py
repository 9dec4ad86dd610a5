"""What the import-linter contracts (.importlinter, run by scripts/test) cannot see.

The contracts check the imports written in sp00ky_infra and agent: the layers, no cycles, pure
policy and config values, an agent that imports nothing of sp00ky_infra. Here: what a pure
module pulls in at run time through third-party code, and the agent's allow-list (the standard
library and requests, nothing else), which a list of forbidden packages could not express.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

PURE = [
    "sp00ky_infra.policy",
    "sp00ky_infra.config.model",
    "sp00ky_infra.config.rules",
    "sp00ky_infra.config.durations",
    "sp00ky_infra.config.errors",
]
FORBIDDEN = [
    "pulumi",
    "pulumi_hcloud",
    "pulumi_docker",
    "requests",
    "urllib3",
    "docker",
    "fabric",
    "paramiko",
    "sqlite3",
    "psycopg",
    "socket",
    "http",
    "urllib.request",
    "subprocess",
    "asyncio",
    "hcloud",
    "fastapi",
    "uvicorn",
    "yaml",
    "jsonschema",
]


def _imported_after(module: str) -> set[str]:
    code = f"import sys; import {module}; print('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    loaded = _imported_after(module)
    bad = sorted(
        name for name in loaded if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    )
    assert bad == [], f"{module} pulls in {bad}"


def test_the_check_itself_sees_io_modules() -> None:
    # guards the test above against passing vacuously
    assert "sqlite3" in _imported_after("sqlite3")
    assert "socket" in _imported_after("sp00ky_infra.config.schema") | _imported_after("socket")


def _imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_agent_uses_the_standard_library_and_requests_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"requests", "agent"}
    for path in (ROOT / "agent").rglob("*.py"):
        outside = _imports_of(path) - allowed
        assert outside == set(), f"{path.relative_to(ROOT)} imports {sorted(outside)}"
