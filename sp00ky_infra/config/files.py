"""The files a pool backend names (``spec``, ``deploy.dockerfile``, ``envFile``, an env
``fromFile``) exist where the controller will look for them: relative to sp00ky.yml's directory.

Reads the file system, so it is not one of the pure rules (``rules.py``). ``lint`` runs it; a
config is loaded without it, since an env file lives on the controller and a command run
elsewhere (``jobs list`` on a laptop) reads none of these files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sp00ky_infra.config.document import DocPath, render_path
from sp00ky_infra.config.env_sources import _path as env_source_path
from sp00ky_infra.config.model import Config
from sp00ky_infra.config.rules import backends, pool_of

FILE_CODE = "SP171"
FILE_SUMMARY = "the files a pool backend names exist, relative to sp00ky.yml's directory"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _named(backend: Mapping[str, Any]) -> Iterator[tuple[DocPath, str, bool]]:
    """(field, the path written, whether it is an env source) for every file ``backend`` names:
    the controller reads env sources with ``~`` expanded, the spec and the dockerfile as written."""
    yield ("spec",), backend.get("spec"), False
    yield ("deploy", "dockerfile"), _mapping(backend.get("deploy")).get("dockerfile"), False
    env_files = backend.get("envFile")
    if isinstance(env_files, list):
        for index, value in enumerate(env_files):
            yield ("envFile", index), value, True
    else:
        yield ("envFile",), env_files, True
    for key, value in _mapping(backend.get("env")).items():
        yield ("env", str(key), "fromFile"), _mapping(value).get("fromFile"), True


def _problem(field: str, written: str, looked: Path, root: Path) -> str | None:
    if looked.is_file():
        return None
    if looked.is_dir():
        return f"`{field}` names {written!r}, but {looked} is a directory; name the file in it"
    return (
        f"`{field}` names {written!r}, but there is no file at {looked} (a relative path starts "
        f"at the directory of sp00ky.yml, {root}); fix the path, or add the file there"
    )


def file_findings(data: Any, root: Path) -> Iterator[tuple[DocPath, str]]:
    """(path, message) for each file a pool backend names that is not a file under ``root``."""
    for name, backend in backends(_mapping(data)):
        if pool_of(backend) is None:
            continue
        for field, written, env_source in _named(backend):
            if not isinstance(written, str) or not written:
                continue  # absent, or the schema's to report
            resolved = (
                env_source_path(str(root), written)
                if env_source
                else Path(Config(root=str(root)).resolve(written))
            )
            problem = _problem(render_path(field), written, resolved.absolute(), root.absolute())
            if problem is not None:
                yield ("apps", name, *field), problem
