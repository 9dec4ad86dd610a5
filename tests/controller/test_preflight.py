"""Production misconfiguration is refused at start, with what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sp00ky_infra.controller.preflight import problems
from sp00ky_infra.controller.settings import ControllerSettings
from tests.controllers import backend_app, project
from tests.helpers import ROOT, cli_process

HETZNER_TOKEN = {"HCLOUD_TOKEN": "t"}


def _no_docker() -> str:
    return "connection refused"


def _docker_answers() -> None:
    return None


def _pulumi_on_path(name: str) -> str | None:
    return f"/opt/pulumi/{name}"


def _stack(folder: Path, provider: str | None, stack: str = "prod") -> Path:
    (folder / "stacks").mkdir(parents=True, exist_ok=True)
    (folder / "Pulumi.yaml").write_text("name: p\nruntime: python\nstackConfigDir: stacks\n")
    config = {"sp00ky:configFile": "sp00ky.yml"}
    if provider:
        config["sp00ky:provider"] = provider
    lines = "".join(f"  {key}: {value}\n" for key, value in config.items())
    (folder / "stacks" / f"Pulumi.{stack}.yaml").write_text("config:\n" + lines)
    return folder


def _pulumi(folder: Path, **changes: object) -> ControllerSettings:
    values: dict[str, object] = {
        "provider": "pulumi",
        "project": "shop",
        "public_url": "https://pool.example.com",
        "pulumi_dir": str(folder),
        "pulumi_stack": "prod",
    }
    values.update(changes)
    return ControllerSettings(**values)  # type: ignore[arg-type]


def _lines(settings: ControllerSettings, env: dict[str, str], **probes: object) -> list[str]:
    found = problems(
        settings,
        env,
        docker_probe=probes.get("docker", _docker_answers),  # type: ignore[arg-type]
        which=probes.get("which", _pulumi_on_path),  # type: ignore[arg-type]
    )
    return [problem.line() for problem in found]


def test_a_complete_hetzner_setup_passes(tmp_path: Path) -> None:
    folder = _stack(tmp_path, "hetzner")
    assert _lines(_pulumi(folder), HETZNER_TOKEN) == []
    assert _lines(_pulumi(_stack(tmp_path / "unset", None)), HETZNER_TOKEN) == []
    assert _lines(ControllerSettings(provider="local"), {}, docker=_no_docker) == []


def test_each_missing_piece_is_named_with_what_to_do(tmp_path: Path) -> None:
    folder = _stack(tmp_path, "hetzner")
    found = _lines(
        _pulumi(folder, project="", public_url=""), {}, which=lambda _: None, docker=_no_docker
    )
    assert len(found) == 4, found
    assert "no pulumi CLI is on PATH" in found[0] and "scripts/pulumi-engine --path" in found[0]
    assert found[1].startswith("SPKY_PROJECT is not set: the stack labels its machines")
    assert "SPKY_POOL_PUBLIC_URL is not set" in found[2]
    assert "HCLOUD_TOKEN is not set" in found[3] and "export HCLOUD_TOKEN" in found[3]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9669", "http://localhost:9669", "http://0.0.0.0:9669", "http://[::1]:1"],
)
def test_a_public_url_that_means_this_host_only_is_refused(tmp_path: Path, url: str) -> None:
    found = _lines(_pulumi(_stack(tmp_path, "hetzner"), public_url=url), HETZNER_TOKEN)
    assert len(found) == 1 and "machines elsewhere cannot reach it" in found[0], found


def test_a_url_that_is_no_url_is_refused(tmp_path: Path) -> None:
    found = _lines(_pulumi(_stack(tmp_path, "hetzner"), public_url="pool:9669"), HETZNER_TOKEN)
    assert found and "is not an http(s) URL" in found[0]


def test_a_stack_without_its_config_file_or_project_is_named(tmp_path: Path) -> None:
    folder = _stack(tmp_path, "hetzner")
    found = _lines(_pulumi(folder, pulumi_stack="staging"), HETZNER_TOKEN)
    assert len(found) == 1 and "stack staging has no config file" in found[0], found
    assert "SPKY_PULUMI_STACK" in found[0]
    found = _lines(_pulumi(tmp_path / "nowhere"), HETZNER_TOKEN)
    assert len(found) == 1 and "no Pulumi project at" in found[0] and "SPKY_PULUMI_DIR" in found[0]


def test_docker_machines_need_an_engine_that_answers(tmp_path: Path) -> None:
    found = _lines(_pulumi(_stack(tmp_path, "docker")), {}, docker=_no_docker)
    assert len(found) == 1 and "no Docker engine answers (connection refused)" in found[0]
    assert "HCLOUD_TOKEN" not in found[0]  # a docker stack needs no Hetzner token
    found = _lines(ControllerSettings(provider="docker"), {}, docker=_no_docker)
    assert len(found) == 1 and found[0].startswith("SPKY_POOL_PROVIDER=docker")


def test_the_controller_refuses_to_start_and_says_what_to_do(tmp_path: Path) -> None:
    config = project(
        tmp_path, {"render": {"min": 0}}, {"renderer": backend_app("render", "t", tmp_path / "l")}
    )
    bare = tmp_path / "bin"  # a PATH without pulumi
    bare.mkdir()
    path = f"{bare}:/usr/bin:/bin"
    assert shutil.which("pulumi", path=path) is None
    env = {
        "SPKY_CONFIG": str(config), "SPKY_POOL_PROVIDER": "pulumi", "SPKY_POOL_SECRET": "s",
        "SPKY_PROJECT": "shop", "SPKY_PULUMI_DIR": str(ROOT), "SPKY_PULUMI_STACK": "prod",
        "SPKY_POOL_PUBLIC_URL": "http://127.0.0.1:9669", "HCLOUD_TOKEN": "", "PATH": path,
        "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0",
    }  # fmt: skip
    done = cli_process("controller", cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start with the pulumi provisioner; fix first:" in done.stderr
    for needed in ("no pulumi CLI is on PATH", "machines elsewhere cannot reach it",
                   "HCLOUD_TOKEN is not set"):  # fmt: skip
        assert needed in done.stderr, done.stderr
    assert "Traceback" not in done.stderr

    no_engine = cli_process(
        "controller", cwd=tmp_path, timeout=60,
        env={**env, "SPKY_POOL_PROVIDER": "docker", "DOCKER_HOST": f"unix://{tmp_path}/no.sock"},
    )  # fmt: skip
    assert no_engine.returncode == 2, no_engine.stderr
    assert "no Docker engine answers" in no_engine.stderr
