"""Schedules checked against their backends' OpenAPI specs: the route is one of the spec's
POST routes (with a did-you-mean), and the payload is one its request body accepts.

Reads the spec files next to sp00ky.yml, so it is not one of the pure rules (``rules.py``);
the loader runs it with them. A spec that cannot be read is left to ``run`` and the
controller, which name it when a job is written.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from sp00ky_infra.config.document import DocPath, Document

ROUTE_CODE = "SP167"
ROUTE_SUMMARY = "a schedule's route is a POST route of its backend's spec, its payload valid"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@functools.lru_cache(maxsize=32)
def _spec(path: str, modified: int) -> Mapping[str, Any] | None:
    try:
        spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return spec if isinstance(spec, dict) and isinstance(spec.get("paths"), dict) else None


def _load(path: Path) -> Mapping[str, Any] | None:
    try:
        modified = path.stat().st_mtime_ns
    except OSError:
        return None
    return _spec(str(path), modified)


def schedule_route_findings(doc: Document) -> Iterator[tuple[DocPath, str]]:
    """(path, message) for each schedule whose route or payload its backend's spec refuses."""
    data = _mapping(doc.data)
    root = doc.source.parent if doc.source is not None else Path(".")
    apps = _mapping(data.get("apps"))
    for name, schedule in _mapping(data.get("schedules")).items():
        schedule = _mapping(schedule)
        backend, route = schedule.get("backend"), schedule.get("route")
        app = _mapping(apps.get(backend)) if isinstance(backend, str) else {}
        spec_file = app.get("spec")
        if not isinstance(spec_file, str) or not isinstance(route, str):
            continue
        spec = _load(root / spec_file)
        if spec is None or not route.startswith("/"):
            continue
        routes = sorted(
            path for path, ops in spec["paths"].items() if isinstance(ops, dict) and "post" in ops
        )
        if route not in routes:
            close = difflib.get_close_matches(route, routes, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            yield (
                ("schedules", str(name), "route"),
                f"backend {backend!r}'s spec has no POST {route} (its POST routes: "
                f"{', '.join(routes) or 'none'}){hint}",
            )
            continue
        key = _mapping(schedule.get("forEach")).get("key")
        yield from _payload_findings(spec, str(name), route, schedule.get("payload"), key)


def _payload_findings(
    spec: Mapping[str, Any], name: str, route: str, payload: Any, key: Any = None
) -> Iterator[tuple[DocPath, str]]:
    """A fan-out's payload is checked as its rows' jobs carry it: with the key's column
    added, whose value only the query knows (so what the spec says of it is not checked)."""
    if isinstance(key, str) and (payload is None or isinstance(payload, Mapping)):
        payload = {**(payload or {}), key: None}
    operation = _mapping(_mapping(spec["paths"][route]).get("post"))
    body = _mapping(_mapping(_mapping(operation.get("requestBody")).get("content")))
    if "schema" not in _mapping(body.get("application/json")):
        return
    escaped = route.replace("~", "~0").replace("/", "~1")
    pointer = f"#/paths/{escaped}/post/requestBody/content/application~1json/schema"
    validator = Draft202012Validator({**spec, "$ref": pointer})
    for error in sorted(validator.iter_errors(payload), key=lambda e: list(map(str, e.path))):
        if key is not None and list(error.absolute_path)[:1] == [key]:
            continue
        where = "".join(f".{part}" for part in error.absolute_path)
        yield (
            ("schedules", name, "payload", *error.absolute_path),
            f"payload{where}: {error.message} (the spec's POST {route} body)",
        )
