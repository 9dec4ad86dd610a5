"""`rehearse` as a user runs it: the package installed from a wheel with the pulumi extra, run
from a project directory outside the checkout, the pulumi CLI found where scripts/pulumi-engine
builds it (not on PATH). Everything it reads of the repository comes from the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.installed import install_package, user_env
from tests.pulumi_engine import example_config


def test_a_rehearsal_from_an_installed_package_needs_no_checkout(
    tmp_path: Path, pulumi_bin: str, rehearsal_image: str
) -> None:
    installed = install_package(tmp_path / "install", extra="pulumi")
    config = example_config(tmp_path / "project")
    doc = yaml.safe_load(config.read_text())  # the spec beside it, not in the checkout
    shutil.copy(doc["apps"]["renderer"]["spec"], config.parent / "openapi.yml")
    doc["apps"]["renderer"]["spec"] = "./openapi.yml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = user_env(installed, SPKY_PULUMI_ENGINE_DIR=str(Path(pulumi_bin).parent.parent))
    env["PATH"] = os.pathsep.join(  # no pulumi CLI on PATH: the engine's cache is looked in
        entry for entry in env["PATH"].split(os.pathsep) if not (Path(entry) / "pulumi").exists()
    )
    done = subprocess.run(
        [str(installed / "sp00ky-infra"), "rehearse", "sp00ky.yml", "--json", "--jobs", "2",
         "--timings", "idleTimeout=5s,bootTimeout=300s", "--workdir", str(tmp_path / "work")],
        cwd=config.parent, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] and report["jobs"] == {"success": 2}
