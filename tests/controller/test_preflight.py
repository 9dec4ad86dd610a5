"""Production misconfiguration is refused at start, with what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sp00ky_infra.config.model import Pool
from sp00ky_infra.controller.preflight import problems
from sp00ky_infra.controller.settings import ControllerSettings
from tests.controllers import backend_app, project
from tests.helpers import ROOT, cli_process

HETZNER_TOKEN = {"HCLOUD_TOKEN": "t"}
RENDER = {"render": Pool(name="render")}  # provider hetzner, the default
MIXED = {**RENDER, "thumbs": Pool(name="thumbs", provider="docker")}


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
        "provider": "",
        "project": "shop",
        "public_url": "https://pool.example.com",
        "pulumi_dir": str(folder),
        "pulumi_stack": "prod",
    }
    values.update(changes)
    return ControllerSettings(**values)  # type: ignore[arg-type]


def _lines(
    settings: ControllerSettings,
    env: dict[str, str],
    pools: dict[str, Pool] = RENDER,
    **probes: object,
) -> list[str]:
    found = problems(
        settings,
        env,
        pools,
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
    assert all(line.startswith("pool render (provider hetzner) needs ") for line in found)
    assert "the pulumi CLI" in found[0] and "none is on PATH" in found[0]
    assert "scripts/pulumi-engine --path" in found[0]
    assert "needs SPKY_PROJECT, which is not set: the stack labels its machines" in found[1]
    assert "SPKY_POOL_PUBLIC_URL, which is not set" in found[2]
    assert "HCLOUD_TOKEN (stack prod makes Hetzner servers), which is not set" in found[3]
    assert "export HCLOUD_TOKEN" in found[3]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9669", "http://localhost:9669", "http://0.0.0.0:9669", "http://[::1]:1"],
)
def test_a_public_url_that_means_this_host_only_is_refused(tmp_path: Path, url: str) -> None:
    found = _lines(_pulumi(_stack(tmp_path, "hetzner"), public_url=url), HETZNER_TOKEN)
    assert len(found) == 1 and "machines elsewhere cannot reach it" in found[0], found


def test_a_url_that_is_no_url_is_refused(tmp_path: Path) -> None:
    found = _lines(_pulumi(_stack(tmp_path, "hetzner"), public_url="pool:9669"), HETZNER_TOKEN)
    assert found and "SPKY_POOL_PUBLIC_URL to be an http(s) URL, but it is 'pool:9669'" in found[0]


def test_a_stack_without_its_config_file_or_project_is_named(tmp_path: Path) -> None:
    folder = _stack(tmp_path, "hetzner")
    found = _lines(_pulumi(folder, pulumi_stack="staging"), HETZNER_TOKEN)
    assert len(found) == 1 and "stack staging, but it has no config file" in found[0], found
    assert "SPKY_PULUMI_STACK" in found[0]
    found = _lines(_pulumi(tmp_path / "nowhere"), HETZNER_TOKEN)
    assert len(found) == 1 and "a Pulumi project, but there is none at" in found[0], found
    assert "SPKY_PULUMI_DIR" in found[0]


def test_docker_machines_need_an_engine_that_answers(tmp_path: Path) -> None:
    found = _lines(_pulumi(_stack(tmp_path, "docker")), {}, docker=_no_docker)
    assert len(found) == 1 and "but none answers (connection refused)" in found[0], found
    assert found[0].startswith("pool render (provider hetzner) needs a Docker engine (stack prod")
    assert "HCLOUD_TOKEN" not in found[0]  # a docker stack needs no Hetzner token
    found = _lines(ControllerSettings(provider="docker"), {}, MIXED, docker=_no_docker)
    assert len(found) == 1, found
    assert found[0].startswith("pools render, thumbs (SPKY_POOL_PROVIDER=docker) need a Docker")


def test_each_provider_in_use_is_checked_for_the_pools_it_serves(tmp_path: Path) -> None:
    """A hetzner pool and a docker pool: each provider's needs, named by its pool; a provider
    no pool uses is not checked."""
    folder = _stack(tmp_path, "hetzner")
    found = _lines(_pulumi(folder, project=""), {}, MIXED, docker=_no_docker)
    assert found == [
        "pool render (provider hetzner) needs SPKY_PROJECT, which is not set: the stack labels "
        "its machines with the project, and the guardian reads this controller's heartbeat "
        "under the same name. Set it",
        "pool render (provider hetzner) needs HCLOUD_TOKEN (stack prod makes Hetzner servers), "
        "which is not set: export HCLOUD_TOKEN with a read/write API token of the Hetzner "
        "project",
        "pool thumbs (provider docker) needs a Docker engine (its machines are containers), but "
        "none answers (connection refused): start Docker (or set DOCKER_HOST to one that "
        "runs), or use local processes (SPKY_POOL_PROVIDER=local; dev --machines local)",
    ]
    docker_only = {"thumbs": MIXED["thumbs"]}  # no hetzner pool: no Pulumi setting is needed
    assert _lines(_pulumi(tmp_path / "nowhere", project=""), {}, docker_only) == []
    assert _lines(ControllerSettings(provider="local"), {}, MIXED, docker=_no_docker) == []


def test_the_controller_refuses_to_start_and_says_what_to_do(tmp_path: Path) -> None:
    config = project(
        tmp_path, {"render": {"min": 1}}, {"renderer": backend_app("render", "t", tmp_path / "l")}
    )
    bare = tmp_path / "bin"  # a PATH without pulumi
    bare.mkdir()
    path = f"{bare}:/usr/bin:/bin"
    assert shutil.which("pulumi", path=path) is None
    env = {
        "SPKY_CONFIG": str(config), "SPKY_POOL_SECRET": "s",
        "SPKY_PROJECT": "shop", "SPKY_PULUMI_DIR": str(ROOT), "SPKY_PULUMI_STACK": "prod",
        "SPKY_POOL_PUBLIC_URL": "http://127.0.0.1:9669", "HCLOUD_TOKEN": "", "PATH": path,
        "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0",
    }  # fmt: skip
    done = cli_process("controller", cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start: a pool's provider is not served here; fix first:" in done.stderr
    for needed in (
        "pool render (provider hetzner) needs the pulumi CLI",
        "machines elsewhere cannot reach it",
        "needs HCLOUD_TOKEN (stack prod makes Hetzner servers), which is not set",
    ):
        assert needed in done.stderr, done.stderr
    assert "Traceback" not in done.stderr

    no_engine = cli_process(
        "controller", cwd=tmp_path, timeout=60,
        env={**env, "SPKY_POOL_PROVIDER": "docker", "DOCKER_HOST": f"unix://{tmp_path}/no.sock"},
    )  # fmt: skip
    assert no_engine.returncode == 2, no_engine.stderr
    assert "pool render (SPKY_POOL_PROVIDER=docker) needs a Docker engine" in no_engine.stderr
    assert "but none answers" in no_engine.stderr
