"""The shipped JSON Schema (draft 2020-12) and its errors as lint issues."""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from sp00ky_infra.config.document import DocPath
from sp00ky_infra.config.durations import DurationError, parse_duration

SCHEMA_CODE = "SP001"
_JSON_TYPES = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
}


@functools.cache
def load_schema() -> dict[str, Any]:
    text = resources.files("sp00ky_infra.config").joinpath("sp00ky.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    Draft202012Validator.check_schema(schema)
    return schema


@functools.cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema())


def _type_name(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true/false"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _expected(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(_JSON_TYPES.get(name, name) for name in names)


# Schema errors about a value itself; when a lint rule spoke about the same value, its message
# says more and the schema's is dropped. Structural errors (unknown keys, names) always stand.
VALUE_CHECKS = frozenset({"type", "enum", "const", "pattern", "minimum", "maximum"})


# A schema's map of other spellings to the key they mean ("environment" -> "env"), for hints that
# difflib alone cannot give.
DID_YOU_MEAN = "x-did-you-mean"


def _known_keys(subschema: dict[str, Any]) -> set[str]:
    """The keys an object schema declares, with those of the schemas it ``$ref``s (whose
    properties count as evaluated for ``unevaluatedProperties``)."""
    known = set(subschema.get("properties", {}))
    ref = subschema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = load_schema()
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        known |= _known_keys(target)
    return known


def schema_findings(data: Any) -> Iterator[tuple[DocPath, str, bool]]:
    """(path, message, about_the_value) for every way ``data`` breaks the schema, once each
    (a pool backend's method and deploy are checked by two subschemas, the backend's and the
    closed one that $refs it)."""
    seen: set[tuple[DocPath, str]] = set()
    for error in sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.path))):
        about_value = error.validator in VALUE_CHECKS and "propertyNames" not in error.schema_path
        for path, message in _explain(error):
            if (path, message) not in seen:
                seen.add((path, message))
                yield path, message, about_value


def _explain(error: ValidationError) -> Iterator[tuple[DocPath, str]]:
    path: DocPath = tuple(error.absolute_path)
    value: Any = error.instance
    kind = error.validator
    expected: Any = error.validator_value  # typed loosely by jsonschema (it may be "unset")
    subschema: Any = error.schema
    if kind in ("additionalProperties", "unevaluatedProperties") and isinstance(value, dict):
        known = sorted(_known_keys(subschema))
        meant: dict[str, str] = {**{key: key for key in known}, **subschema.get(DID_YOU_MEAN, {})}
        for key in sorted(set(value) - set(known), key=str):
            close = difflib.get_close_matches(str(key), list(meant), n=1)
            hint = (
                f"; did you mean {meant[close[0]]!r}?"
                if close
                else f"; known keys: {', '.join(known)}"
            )
            yield (*path, str(key)), f"unknown key {key!r}{hint}"
    elif kind == "required":
        missing = [key for key in expected if key not in value]
        for key in missing:
            yield (*path, key), f"`{key}` is required here"
    elif "propertyNames" in error.schema_path:
        yield (
            (*path, str(value)),
            (
                f"name {value!r} must be lowercase letters, digits and dashes, start with a "
                "letter, and be at most 40 characters"
            ),
        )
    elif kind == "type":
        yield path, f"must be {_expected(expected)}, not {_type_name(value)}"
    elif kind == "enum":
        options = ", ".join(map(str, expected))
        yield path, f"{value!r} is not allowed here; use one of: {options}"
    elif kind == "pattern" and expected == load_schema()["$defs"]["duration"]["pattern"]:
        try:
            parse_duration(value)
        except DurationError as exc:
            yield path, str(exc)
    elif kind in ("minimum", "maximum"):
        word = "at least" if kind == "minimum" else "at most"
        yield path, f"must be {word} {expected} (it is {value})"
    elif kind == "oneOf" and path and path[-1] == "command":
        yield path, "must be a command line (one string) or a list of strings"
    else:
        yield path, error.message
