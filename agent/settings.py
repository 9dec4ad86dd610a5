"""The agent's own settings: who it is and where its controller is."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.errors import SettingsError


@dataclass(frozen=True, slots=True)
class Settings:
    controller_url: str
    machine: str
    join_token: str
    runtime: str = "process"  # process | docker
    workdir: str = "."
    image: str = ""  # the docker runtime's image; default: the one the controller names
    docker_socket: str = "/var/run/docker.sock"  # DOCKER_HOST (unix://...) names another
    command: tuple[str, ...] = ()  # the process runtime's command; default: deploy.command
    # Run when out of contact too long; on a VM cloud-init sets ["systemctl", "poweroff"].
    # Empty: the agent only exits (under Docker or as a local process).
    poweroff: tuple[str, ...] = ()
    # Where the machine credential of the first join is kept (0600), to rejoin with after a
    # reboot; on a VM /etc/sp00ky/credential. Default: "credential" next to the settings file;
    # empty (no settings file): the agent keeps none and can only join.
    credential_file: str = ""
    # Names of the agent's environment the process runtime's backend inherits besides PATH,
    # HOME and the locale: on a machine that is a container, the image's ENV (the docker
    # provisioner lists them). Nothing else of the agent's environment reaches the backend.
    inherit_env: tuple[str, ...] = ()
    # Where the agent unpacks the archives it upgrades to and names the one it runs
    # (agent/upgrade.py). Default: where it was installed from its archive (/opt/sp00ky on a
    # VM); empty when it was not (a checkout, a machine image): it then never upgrades.
    agent_home: str = ""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Settings:
        """From SPKY_AGENT_SETTINGS_FILE (JSON, written by cloud-init), then the environment."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        path = env.get("SPKY_AGENT_SETTINGS_FILE")
        if path:
            try:
                values.update(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as exc:
                raise SettingsError(f"SPKY_AGENT_SETTINGS_FILE {path}: {exc}") from exc
            values.setdefault("credential_file", str(Path(path).parent / "credential"))
        for key, name in (
            ("controller_url", "SPKY_AGENT_CONTROLLER_URL"),
            ("machine", "SPKY_AGENT_MACHINE"),
            ("join_token", "SPKY_AGENT_JOIN_TOKEN"),
            ("runtime", "SPKY_AGENT_RUNTIME"),
            ("workdir", "SPKY_AGENT_WORKDIR"),
            ("image", "SPKY_AGENT_IMAGE"),
            ("credential_file", "SPKY_AGENT_CREDENTIAL_FILE"),
            ("agent_home", "SPKY_AGENT_HOME"),
        ):
            if env.get(name):
                values[key] = env[name]
        for key, name in (
            ("command", "SPKY_AGENT_COMMAND"),
            ("poweroff", "SPKY_AGENT_POWEROFF"),
            ("inherit_env", "SPKY_AGENT_INHERIT_ENV"),
        ):
            if env.get(name):
                try:
                    values[key] = json.loads(env[name])
                except ValueError as exc:
                    raise SettingsError(f"{name}: not a JSON list ({exc})") from exc
        if env.get("DOCKER_HOST", "").startswith("unix://"):
            values["docker_socket"] = env["DOCKER_HOST"].removeprefix("unix://")
        for key in ("command", "poweroff", "inherit_env"):
            if key in values:
                values[key] = _command(key, values[key])
        missing = [
            key for key in ("controller_url", "machine", "join_token") if not values.get(key)
        ]
        if missing:
            raise SettingsError(
                "missing "
                + ", ".join(missing)
                + " (SPKY_AGENT_CONTROLLER_URL, SPKY_AGENT_MACHINE, "
                "SPKY_AGENT_JOIN_TOKEN, or SPKY_AGENT_SETTINGS_FILE)"
            )
        if values.get("runtime", "process") not in ("process", "docker"):
            raise SettingsError(f"SPKY_AGENT_RUNTIME: {values['runtime']!r}; use process or docker")
        return cls(**values)  # type: ignore[arg-type]


def _command(key: str, value: object) -> tuple[str, ...]:
    """A command line given as a list of strings (JSON in the environment or the file)."""
    if not isinstance(value, list | tuple) or not all(isinstance(part, str) for part in value):
        raise SettingsError(f'{key}: must be a list of strings, like ["systemctl", "poweroff"]')
    return tuple(value)
