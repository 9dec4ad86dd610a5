"""A backend's env resolved from its sources, on the controller, at deploy.

Sources, weakest first (a later one wins for the same name):

1. ``envFile:`` one file or a list, relative to sp00ky.yml: ``KEY=VALUE`` lines (``export``
   allowed, ``#`` comments, blank lines; a value in single or double quotes keeps its spaces;
   nothing is interpolated);
2. ``env:`` inline values, written in sp00ky.yml;
3. ``env:`` references: ``{fromEnv: NAME}`` (the controller's environment) and
   ``{fromFile: PATH}`` (a file on the controller, its content less one trailing newline).
   ``{vault: ...}`` is refused, naming the field (lint SP141 says so first).

The values live only in the controller's memory and in the agent's authenticated join reply:
never in the store, a label, a revision (it hashes the references), user-data or a log line.
Every error names the field and never a value.

EnvSourceError (a ConfigError)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sp00ky_infra.config.errors import ConfigError
from sp00ky_infra.config.model import Backend, EnvReference


class EnvSourceError(ConfigError):
    """A source of a backend's env cannot be resolved; the message names the field."""


def resolve_env(backend: Backend, root: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The backend's own env with every source resolved (its values: keep them in memory)."""
    values: dict[str, str] = {}
    for index, file in enumerate(backend.env_files):
        where = f"apps.{backend.name}.envFile" + (
            f"[{index}]" if len(backend.env_files) > 1 else ""
        )
        values.update(read_env_file(_path(root, file), where))
    values.update(backend.env)
    for key, reference in backend.env_references.items():
        values[key] = resolve_reference(reference, f"apps.{backend.name}.env.{key}", root, environ)
    return values


def resolve_reference(
    reference: EnvReference, where: str, root: str, environ: Mapping[str, str]
) -> str:
    if reference.kind == "fromEnv":
        if reference.source not in environ:
            raise EnvSourceError(
                f"{where}: fromEnv {reference.source} is not set in the controller's "
                "environment; set it where the controller runs (e.g. its environment file)"
            )
        return environ[reference.source]
    if reference.kind == "fromFile":
        path = _path(root, reference.source)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EnvSourceError(
                f"{where}: fromFile {path} cannot be read on the controller: "
                f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
            ) from None
        return text[:-1] if text.endswith("\n") else text
    raise EnvSourceError(
        f"{where}: vault references are not supported yet; use fromEnv or fromFile, resolved "
        "on the controller at deploy"
    )


def read_env_file(path: Path, where: str) -> dict[str, str]:
    """``KEY=VALUE`` lines; an error names the file and line, never the value."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvSourceError(
            f"{where}: {path} cannot be read on the controller: "
            f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
        ) from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line.removeprefix("export ").lstrip()
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or not key.isidentifier():
            raise EnvSourceError(
                f"{where}: {path} line {number} is not KEY=VALUE (a variable name, =, a value)"
            )
        values[key] = _unquote(value.strip())
    return values


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if " #" in value:  # an unquoted value ends where a comment starts
        value = value.split(" #", 1)[0].rstrip()
    return value


def _path(root: str, file: str) -> Path:
    path = Path(file).expanduser()
    return path if path.is_absolute() else Path(root) / path
