"""The small frictions, each run as a user types it (terminals via a pty)."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sp00ky_infra.store import open_store
from tests.configs import with_backend_files
from tests.helpers import ROOT, cli, drain_pty


@pytest.fixture
def project(tmp_path: Path, store_url: str) -> tuple[Path, dict[str, str]]:
    shutil.copytree(ROOT / "examples", tmp_path / "project",
                    ignore=shutil.ignore_patterns(".sp00ky"))  # fmt: skip
    return tmp_path / "project", {"SPKY_STORE": store_url, "SPKY_CONFIG": ""}


def _finished(project: tuple[Path, dict[str, str]], count: int) -> list[str]:
    ids = []
    for n in range(count):
        done = cli("run", "renderer", "/render", "--payload", f'{{"gameId": "g{n}"}}',
                   cwd=project[0], env=project[1])  # fmt: skip
        job_id = done.stdout.strip()
        cli("jobs", "kill", job_id, cwd=project[0], env=project[1])
        ids.append(job_id)
    return ids


def _on_a_terminal(
    project: tuple[Path, dict[str, str]], args: list[str], answer: bytes | None
) -> tuple[int, str]:
    """Run the command with a pty as its terminal; type ``answer`` once it asks."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", *args],
        cwd=project[0], env={**os.environ, **project[1]},
        stdin=follower, stdout=follower, stderr=follower, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
                if answer is not None and b"[y/N]" in seen:
                    os.write(leader, answer)
                    answer = None
        code = proc.wait(timeout=10)
        seen += drain_pty(leader)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return code, seen.decode(errors="replace").replace("\r\n", "\n")


def test_clear_asks_on_a_terminal_and_dry_run_only_counts(
    project: tuple[Path, dict[str, str]],
) -> None:
    _finished(project, 3)
    dry = cli("jobs", "clear", "--dry-run", cwd=project[0], env=project[1])
    assert dry.stdout.strip() == "would delete 3 finished job(s); nothing deleted (--dry-run)"
    dry_json = cli("jobs", "clear", "--dry-run", "--status", "failed", "--limit", "2", "--json",
                   cwd=project[0], env=project[1])  # fmt: skip
    assert json.loads(dry_json.stdout) == {"would_delete": 2, "outcomes": ["failed"]}

    code, text = _on_a_terminal(project, ["jobs", "clear"], b"n\n")
    assert "delete 3 finished job(s)? [y/N]" in text and "nothing deleted" in text
    assert code == 1
    code, text = _on_a_terminal(project, ["jobs", "clear", "--limit", "1"], b"y\n")
    assert "delete 1 finished job(s)? [y/N]" in text and "deleted 1 finished job(s)" in text
    assert code == 0
    code, text = _on_a_terminal(project, ["jobs", "clear", "--yes"], None)
    assert "[y/N]" not in text and "deleted 2 finished job(s)" in text and code == 0
    store = open_store(project[1]["SPKY_STORE"])
    try:
        assert store.counts()["failed"] == 0
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_run_without_a_payload_says_one_is_required(project: tuple[Path, dict[str, str]]) -> None:
    done = cli("run", "renderer", "/render", cwd=project[0], env=project[1])
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: payload: refused by backend renderer's spec (POST /render): a payload is "
        "required and none was given; pass one (run --payload JSON)"
    )


def test_autoscale_yes_please_is_one_error(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "examples" / "sp00ky.yml").read_text())
    config["pools"]["render"]["autoscale"] = "yes please"
    (with_backend_files(tmp_path) / "sp00ky.yml").write_text(yaml.safe_dump(config))
    done = cli("lint", "sp00ky.yml", "--json", cwd=tmp_path)
    errors = [issue for issue in json.loads(done.stdout) if issue["severity"] == "error"]
    assert [(e["path"], e["code"]) for e in errors] == [("pools.render.autoscale", "SP001")]
    assert errors[0]["message"] == "must be true or false, not a string"


def test_lint_json_on_a_missing_file_has_a_code_and_a_severity(tmp_path: Path) -> None:
    done = cli("lint", "missing.yml", "--json", cwd=tmp_path)
    assert done.returncode == 2
    assert json.loads(done.stdout) == [
        {
            "path": "",
            "code": "SP000",
            "message": "missing.yml: no such file; pass the path of your sp00ky.yml as FILE: "
            "sp00ky-infra lint FILE",
            "line": 0,
            "severity": "error",
        }
    ]


def test_pools_takes_admin_url(tmp_path: Path) -> None:
    down = cli("pools", "--admin-url", "http://127.0.0.1:9", "list", cwd=tmp_path,
               env={"SPKY_ADMIN_URL": ""})  # fmt: skip
    assert down.returncode == 1
    assert "cannot reach the admin API at http://127.0.0.1:9 " in down.stderr


def test_shell_completion_as_the_readme_says() -> None:
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(_SP00KY_INFRA_COMPLETE=bash_source sp00ky-infra)"' in readme
    script = cli(env={"_SP00KY_INFRA_COMPLETE": "bash_source"})
    assert "complete -o nosort -F _sp00ky_infra_completion sp00ky-infra" in script.stdout
    words = cli(env={"_SP00KY_INFRA_COMPLETE": "bash_complete", "COMP_WORDS": "sp00ky-infra jo",
                     "COMP_CWORD": "1"})  # fmt: skip
    assert words.stdout.split() == ["plain,jobs"]
