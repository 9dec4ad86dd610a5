"""The files a pool backend names (``spec``, ``deploy.dockerfile``, ``envFile``, an env
``fromFile``) exist where the controller will look for them: relative to sp00ky.yml's directory.

Reads the file system, so it is not one of the pure rules (``rules.py``). ``lint`` runs it; a
config is loaded without it, since an env file lives on the controller and a command run
elsewhere (``jobs list`` on a laptop) reads none of these files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
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


def _as_written(root: Path, written: str) -> Path:
    """A spec or a dockerfile: as the controller opens it (``Config.resolve``, no ``~``)."""
    return Path(Config(root=str(root)).resolve(written))


def _env_source(root: Path, written: str) -> Path:
    """An env file or ``fromFile``: as the controller reads it at deploy, ``~`` expanded."""
    return env_source_path(str(root), written)


Resolve = Callable[[Path, str], Path]


def _named(backend: Mapping[str, Any]) -> Iterator[tuple[DocPath, Any, Resolve]]:
    """(field, the value written, how the controller resolves it) for every file ``backend``
    names; a value that is no path is the schema's to report."""
    yield ("spec",), backend.get("spec"), _as_written
    yield ("deploy", "dockerfile"), _mapping(backend.get("deploy")).get("dockerfile"), _as_written
    env_files = backend.get("envFile")
    if isinstance(env_files, list):
        for index, value in enumerate(env_files):
            yield ("envFile", index), value, _env_source
    else:
        yield ("envFile",), env_files, _env_source
    for key, value in _mapping(backend.get("env")).items():
        yield ("env", str(key), "fromFile"), _mapping(value).get("fromFile"), _env_source


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
    """(path, message) for each file a pool backend names that is not a file where the
    controller looks for it, ``root`` being sp00ky.yml's directory. A dockerfile is checked
    beside a ``deploy.image`` too: the local stack builds its machines from it."""
    for name, backend in backends(_mapping(data)):
        if pool_of(backend) is None:
            continue
        for field, written, resolve in _named(backend):
            if not isinstance(written, str) or not written:
                continue  # absent, or the schema's to report
            looked = resolve(root, written).absolute()
            problem = _problem(render_path(field), written, looked, root.absolute())
            if problem is not None:
                yield ("apps", name, *field), problem
