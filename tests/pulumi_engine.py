"""The real Pulumi engine (scripts/pulumi-engine) on a throwaway copy of this project's program.

A ``StackProject`` is a directory with the repository's Pulumi.yaml (its virtualenv pointing at
this checkout's .venv) and __main__.py, a ``file://`` state backend and a passphrase, and the
environment every run gets: the engine first on PATH, automatic plugin downloads off, no update
check, a PULUMI_HOME of its own. Nothing reaches the network but what the test points it at.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import ROOT

PASSPHRASE = "test-passphrase"


def example_config(folder: Path, healthcheck: str = "/health", **pool: Any) -> Path:
    """The example's sp00ky.yml with ``pool`` settings, its backend built from the locally made
    base image (no registry is reachable here)."""
    from tests.conftest import BASE_IMAGE

    doc = yaml.safe_load((ROOT / "examples" / "sp00ky.yml").read_text())
    doc["pools"]["render"].update(pool)
    app = doc["apps"]["renderer"]
    app["spec"] = str(ROOT / "examples" / "backend" / "openapi.yml")
    app["method"].pop("schema", None)
    backend = folder / "backend"
    backend.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "backend" / "server.py", backend / "server.py")
    (backend / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY server.py /app/server.py\n"
        "ENV HOST=0.0.0.0 PORT=8080 PYTHONUNBUFFERED=1\n"
        'CMD ["python3", "/app/server.py"]\n'
    )
    app["deploy"]["dockerfile"] = str(backend / "Dockerfile")
    app["deploy"]["command"] = ["python3", str(backend / "server.py")]
    app["deploy"]["healthcheck"] = healthcheck
    path = folder / "sp00ky.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def engine_env(bin_dir: str, state: Path, home: Path) -> dict[str, str]:
    """What every run of the engine gets (the Automation API's runs too)."""
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_HOME": str(home),
        "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "true",
    }


@dataclass
class StackProject:
    dir: Path
    stack: str
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, folder: Path, bin_dir: str, stack: str, env: dict[str, str]) -> StackProject:
        project = folder / "project"
        (project / "stacks").mkdir(parents=True)
        (folder / "state").mkdir()
        (folder / "home").mkdir()
        meta = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
        meta["runtime"]["options"]["virtualenv"] = str(ROOT / ".venv")
        (project / "Pulumi.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        shutil.copy(ROOT / "__main__.py", project / "__main__.py")
        full = {**os.environ, **engine_env(bin_dir, folder / "state", folder / "home"), **env}
        full.pop("PYTHONPATH", None)
        made = cls(project, stack, full)
        made.pulumi("stack", "init")
        return made

    def pulumi(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """One CLI command on this stack; a failure raises with what the engine printed."""
        done = subprocess.run(
            ["pulumi", *args, "--stack", self.stack, "--non-interactive"],
            cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(
                f"pulumi {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def config(self, key: str, value: str, secret: bool = False) -> None:
        self.pulumi("config", "set", *(["--secret"] if secret else []), key, value)

    def machines(self, wanted: dict[str, dict[str, str]]) -> None:
        """What the controller writes: sp00ky:machines, {pool: {machine: revision}}."""
        self.config("sp00ky:machines", json.dumps(wanted))

    def up(self) -> dict[str, Any]:
        """`pulumi up`; the change summary ({"create": 2, ...})."""
        self.pulumi("up", "--yes", "--skip-preview")
        return self.last_changes()

    def last_changes(self) -> dict[str, Any]:
        history = json.loads(self.pulumi("stack", "history", "--json").stdout)
        changes: dict[str, Any] = history[0].get("resourceChanges", {})
        return changes

    def resources(self) -> list[dict[str, Any]]:
        """The stack's state: every resource Pulumi believes exists."""
        exported = json.loads(self.pulumi("stack", "export").stdout)
        found: list[dict[str, Any]] = exported["deployment"].get("resources") or []
        return found

    def named(self, kind: str) -> dict[str, dict[str, Any]]:
        """The resources of one dynamic kind (the provider's module name in the URN is not
        there: dynamic resources share one type), by their logical name."""
        return {
            r["urn"].rsplit("::", 1)[-1]: r
            for r in self.resources()
            if r["type"] == "pulumi-python:dynamic:Resource" and kind in r["urn"]
        }
