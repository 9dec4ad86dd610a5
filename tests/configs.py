"""A valid sp00ky.yml as data, and helpers to vary it, for config and lint tests."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.config import Issue
from sp00ky_infra.config.loader import lint_document, parse_document
from tests.helpers import ROOT

BASE: dict[str, Any] = {
    "mode": "cluster",
    "pools": {
        "render": {
            "provider": "hetzner",
            "machine": {"type": "cx33", "locations": ["fsn1", "nbg1"]},
            "min": 0,
            "autoscale": True,
            "max": 2,
            "idleTimeout": "5m",
        }
    },
    "apps": {
        "renderer": {
            "type": "backend",
            "runOn": {"pool": "render"},
            "spec": "./backend/openapi.yml",
            "method": {"type": "outbox", "table": "render_job"},
            "deploy": {
                "dockerfile": "./backend/Dockerfile",
                "port": 8080,
                "healthcheck": "/health",
            },
        }
    },
}

Change = tuple[str, Any]  # ("pools.render.max", 3) sets; ("pools.render.max", DELETE) removes
DELETE = object()


def varied(*changes: Change) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for dotted, value in changes:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def lint_data(data: dict[str, Any]) -> list[Issue]:
    return lint_document(parse_document(yaml.safe_dump(data, sort_keys=False)))


def errors(issues: list[Issue]) -> list[Issue]:
    return [issue for issue in issues if issue.severity == "error"]


def with_backend_files(folder: Path) -> Path:
    """``folder`` with the files BASE's backend (and the examples') names, which `lint` checks
    are there: the example backend's spec and Dockerfile under ./backend/."""
    shutil.copytree(ROOT / "examples" / "backend", folder / "backend", dirs_exist_ok=True)
    return folder
