"""A backend's env from its sources: inline values, env files, and
references resolved on the controller at deploy; never a value in a revision or an error."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.config.env_sources import EnvSourceError, resolve_env
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import Backend, EnvReference
from tests.configs import varied

SECRET = "value-of-the-secret-0123"


def _config(tmp_path: Path, env: dict[str, object], env_file: object = None) -> Path:
    data = varied(("apps.renderer.env", env))
    if env_file is not None:
        data["apps"]["renderer"]["envFile"] = env_file
    path = tmp_path / "sp00ky.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_source_resolves_and_the_later_one_wins(tmp_path: Path) -> None:
    (tmp_path / "render.env").write_text(
        "# the renderer's settings\n"
        "export QUALITY=low\n"
        "FROM_FILE=file-value  # a comment\n"
        "QUOTED='two words'\n"
        "\n"
        "OVERRIDDEN=by-the-file\n"
    )
    (tmp_path / "key.pem").write_text(SECRET + "\n")
    config = load_config(
        _config(
            tmp_path,
            {
                "QUALITY": "high",
                "OVERRIDDEN": "inline",
                "API_TOKEN": {"fromEnv": "RENDER_API_TOKEN"},
                "KEY": {"fromFile": "key.pem"},
            },
            env_file="render.env",
        )
    )
    backend = config.backends["renderer"]
    env = resolve_env(backend, config.root, {"RENDER_API_TOKEN": SECRET})
    assert env == {
        "QUALITY": "high",  # env: wins over the file
        "FROM_FILE": "file-value",
        "QUOTED": "two words",
        "OVERRIDDEN": "inline",
        "API_TOKEN": SECRET,
        "KEY": SECRET,  # less its trailing newline
    }
    assert backend.env == {"QUALITY": "high", "OVERRIDDEN": "inline"}  # no value kept
    assert backend.env_references["API_TOKEN"] == EnvReference("fromEnv", "RENDER_API_TOKEN")


def test_a_missing_source_names_the_field_and_never_a_value(tmp_path: Path) -> None:
    backend = Backend(
        name="renderer",
        env_references={"API_TOKEN": EnvReference("fromEnv", "RENDER_API_TOKEN")},
    )
    with pytest.raises(EnvSourceError) as caught:
        resolve_env(backend, str(tmp_path), {"OTHER": SECRET})
    assert str(caught.value) == (
        "apps.renderer.env.API_TOKEN: fromEnv RENDER_API_TOKEN is not set in the controller's "
        "environment; set it where the controller runs (e.g. its environment file)"
    )
    missing = Backend(name="renderer", env_references={"KEY": EnvReference("fromFile", "no.pem")})
    with pytest.raises(EnvSourceError, match=r"^apps\.renderer\.env\.KEY: fromFile .*no\.pem"):
        resolve_env(missing, str(tmp_path), {})
    (tmp_path / "bad.env").write_text(f"GOOD=1\n{SECRET}\n")
    broken = Backend(name="renderer", env_files=("bad.env",))
    with pytest.raises(EnvSourceError) as caught:
        resolve_env(broken, str(tmp_path), {})
    assert "apps.renderer.envFile: " in str(caught.value) and "line 2 is not KEY=VALUE" in str(
        caught.value
    )
    assert SECRET not in str(caught.value)


def test_a_vault_reference_is_refused_naming_the_field(tmp_path: Path) -> None:
    backend = Backend(
        name="renderer", env_references={"SIGNING_KEY": EnvReference("vault", "secret/x#key")}
    )
    with pytest.raises(EnvSourceError, match=r"^apps\.renderer\.env\.SIGNING_KEY: vault refer"):
        resolve_env(backend, str(tmp_path), {})
    with pytest.raises(Exception, match="SP141"):  # and lint refuses the file first
        load_config(_config(tmp_path, {"SIGNING_KEY": {"vault": "secret/x#key"}}))


def test_the_revision_hashes_references_never_the_values(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, {"API_TOKEN": {"fromEnv": "RENDER_API_TOKEN"}}))
    backend, pool = config.backends["renderer"], config.pools["render"]
    revision = backend.revision(pool)
    resolve_env(backend, config.root, {"RENDER_API_TOKEN": SECRET})
    assert backend.revision(pool) == revision  # the value plays no part
    other = load_config(_config(tmp_path, {"API_TOKEN": {"fromEnv": "OTHER_TOKEN"}}))
    assert other.backends["renderer"].revision(pool) != revision  # the reference does
    plain = load_config(_config(tmp_path, {"A": "b"}))
    inline = plain.backends["renderer"]
    material = {  # the revision as it was before references: a deploy replaces no machine
        "deploy": asdict(inline.deploy),
        "env": {"A": "b"},
        "machine": {
            "provider": pool.provider,
            "type": pool.machine.type,
            "locations": pool.machine.locations,
            "fallback_types": pool.machine.fallback_types,
        },
        "slots": pool.slots,
        "recycle": pool.recycle,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    assert inline.revision(pool) == digest[:12]


def test_a_machines_backend_gets_the_resolved_values_and_nothing_keeps_them(
    tmp_path: Path,
) -> None:
    """Processes: a controller whose environment and files hold the secrets; the backend
    (which dumps its environment) gets them; the store, the logs and the revision do not."""
    from tests.agent.test_machine_isolation import DUMP_AND_SERVE
    from tests.controllers import SERVER, backend_app, project, running_controller, wait_for

    dump = tmp_path / "backend-env.json"
    (tmp_path / "render.env").write_text(f"FROM_ENV_FILE={SECRET}-file\n")
    (tmp_path / "key.pem").write_text(f"{SECRET}-key\n")
    app = backend_app(
        "render", "render_job", tmp_path / "backend.jsonl",
        command=[sys.executable, "-c", DUMP_AND_SERVE, str(SERVER)],
    )  # fmt: skip
    app["env"].update(
        {
            "ENV_DUMP": str(dump),
            "API_TOKEN": {"fromEnv": "RENDER_API_TOKEN"},
            "KEY": {"fromFile": "key.pem"},
        }
    )
    app["envFile"] = "render.env"
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"renderer": app}
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    try:
        with running_controller(tmp_path, config, store_url, RENDER_API_TOKEN=f"{SECRET}-env"):
            job = client.run("renderer", "/render", {"gameId": "env"})
            wait_for(lambda: client.store.get(job.id).status == "success", what="the job")
            machine = client.store.machines.get(client.store.get(job.id).machine or "")
    finally:
        client.close()
    seen = json.loads(dump.read_text())
    assert (seen["API_TOKEN"], seen["KEY"], seen["FROM_ENV_FILE"]) == (
        f"{SECRET}-env", f"{SECRET}-key", f"{SECRET}-file",
    )  # fmt: skip
    assert SECRET not in machine.revision
    kept = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".db", ".log", ".err")]
    kept += [p for p in tmp_path.glob("state.db*") if p.is_file()]  # not state.db.wake/
    assert any(p.suffix == ".log" for p in kept) and any(p.name == "state.db" for p in kept)
    for path in kept:
        assert SECRET.encode() not in path.read_bytes(), f"a secret value in {path}"


def test_an_unresolvable_reference_fails_the_boot_naming_the_field(tmp_path: Path) -> None:
    from tests.controllers import backend_app, project, running_controller, wait_for

    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    app["env"]["API_TOKEN"] = {"fromEnv": "RENDER_API_TOKEN"}
    config = project(tmp_path, {"render": {"min": 1}}, {"renderer": app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    try:
        with running_controller(tmp_path, config, store_url) as controller:
            incident = wait_for(
                lambda: controller.pool("render")["incidents"], timeout=30, what="the breaker"
            )[0]
    finally:
        client.close()
    assert "apps.renderer.env.API_TOKEN: fromEnv RENDER_API_TOKEN is not set" in incident["message"]
