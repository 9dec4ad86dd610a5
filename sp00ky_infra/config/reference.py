"""The configuration reference, generated from the JSON Schema (so the two cannot drift).

It lives in ``docs/configuration.md``, between the ``BEGIN`` and ``END`` markers; from the
repository's root, ``python -m sp00ky_infra.config.reference`` writes it there again (a test
fails while the page and the schema differ)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sp00ky_infra.config.document import DUPLICATE_KEY_CODE
from sp00ky_infra.config.errors import ConfigError
from sp00ky_infra.config.files import FILE_CODE, FILE_SUMMARY
from sp00ky_infra.config.routes import ROUTE_CODE, ROUTE_SUMMARY
from sp00ky_infra.config.rules import RULES
from sp00ky_infra.config.schema import SCHEMA_CODE, load_schema

BEGIN = "<!-- BEGIN config reference (generated: sp00ky-infra schema --markdown) -->"
END = "<!-- END config reference -->"
PAGE = Path("docs") / "configuration.md"  # relative to the repository's root


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    target: dict[str, Any] = schema
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    merged = dict(_resolve(target, schema))
    merged.update({key: value for key, value in node.items() if key not in ("$ref", "properties")})
    # a schema that $refs another and adds properties (a pool backend) has the properties of both
    merged["properties"] = {**merged.get("properties", {}), **node.get("properties", {})}
    return merged


def _type_of(node: dict[str, Any]) -> str:
    node = _resolve(node, load_schema())
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    if "oneOf" in node:
        return " or ".join(_type_of(each) for each in node["oneOf"])
    kind = node.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and "items" in node:
        return f"list of {_type_of(node['items'])}"
    if kind == "string" and node.get("pattern", "").startswith("^(?=\\d)"):
        return "duration"
    return str(kind)


def _rows(
    node: dict[str, Any], prefix: str, schema: dict[str, Any], seen: set[str]
) -> Iterator[str]:
    node = _resolve(node, schema)
    for key, child in node.get("properties", {}).items():
        child = _resolve(child, schema)
        path = f"{prefix}.{key}" if prefix else key
        if path in seen and not child.get("description"):
            continue
        seen.add(path)
        default = f"`{json.dumps(child['default'])}`" if "default" in child else ""
        description = child.get("description", "").replace("|", "\\|")
        yield f"| `{path}` | {_type_of(child)} | {default} | {description} |"
        yield from _rows(child, path, schema, seen)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _rows(extra, f"{prefix}.NAME", schema, seen)
    then = node.get("then")
    if isinstance(then, dict):
        yield from _rows(then, prefix, schema, seen)


def markdown() -> str:
    schema = load_schema()
    lines = [BEGIN, "", "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += list(_rows(schema, "", schema, set()))
    lines += [
        "",
        "Lint rules (`sp00ky-infra lint`):",
        "",
        "| code | rule | severity |",
        "|---|---|---|",
    ]
    lines.append(
        f"| {SCHEMA_CODE} | the file matches the JSON Schema (types, known keys) | error |"
    )
    lines.append(f"| {DUPLICATE_KEY_CODE} | no key appears twice in one mapping | error |")
    lines += [f"| {each.code} | {each.summary} | {each.severity} |" for each in RULES]
    lines.append(f"| {ROUTE_CODE} | {ROUTE_SUMMARY} | error |")  # config/routes.py (reads specs)
    lines.append(f"| {FILE_CODE} | {FILE_SUMMARY} | error |")  # config/files.py (lint only)
    lines += ["", END]
    return "\n".join(lines)


def generated_part(text: str) -> str:
    """The part of ``text`` between the markers, the markers included ("" without them)."""
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def write(page: Path = PAGE) -> bool:
    """Put the reference between the markers of ``page``; True when it changed."""
    text = page.read_text()
    old = generated_part(text)
    if not old:
        raise ConfigError(f"{page}: no {BEGIN} ... {END} markers to write the reference between")
    new = text.replace(old, markdown())
    page.write_text(new)
    return new != text


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PAGE
    print(f"{target}: {'written' if write(target) else 'up to date'}")
