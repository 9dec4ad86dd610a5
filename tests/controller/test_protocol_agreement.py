"""The agent and the controller agree on protocol v1, message by message.

The controller declares the messages as pydantic models (sp00ky_infra/controller/protocol.py),
the agent as standard-library dataclasses (agent/protocol.py). Here both sides must declare the
same messages with the same fields, optional fields and defaults, and every message built on
one side, sent as JSON and parsed on the other must arrive field by field as it was built, in
both directions: with every field set, with every nullable field null, and with only the
required fields (the defaults then fill in).
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import pytest
from pydantic import BaseModel

from agent import protocol as agent_side
from sp00ky_infra.controller import protocol as controller_side

T = TypeVar("T")
Variant = Literal["full", "nulls", "minimal"]
VARIANTS: tuple[Variant, ...] = ("full", "nulls", "minimal")


def _declared(module: types.ModuleType, base: type[T]) -> dict[str, type[T]]:
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, base)
        and value is not base
        and value.__module__ == module.__name__
    }


CONTROLLER = _declared(controller_side, BaseModel)
AGENT = _declared(agent_side, agent_side.Message)


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: Any  # the annotation, resolved
    required: bool
    default: Any  # when not required


def _fields(cls: type) -> list[Field]:
    """Either side's fields, in declaration order."""
    if issubclass(cls, BaseModel):
        return [
            Field(
                name,
                info.annotation,
                info.is_required(),
                None if info.is_required() else info.get_default(call_default_factory=True),
            )
            for name, info in cls.model_fields.items()
        ]
    hints = get_type_hints(cls)
    found = []
    for each in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = each.default is dataclasses.MISSING
        default = None if required else each.default
        found.append(Field(each.name, hints[each.name], required, default))
    return found


def _nullable(kind: Any) -> bool:
    return get_origin(kind) in (Union, types.UnionType) and type(None) in get_args(kind)


def _plain(value: Any) -> Any:
    """A value as comparable JSON-like data, each scalar with its type (so 1 != 1.0 != True)."""
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, agent_side.Message):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}  # type: ignore[arg-type]
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return (type(value).__name__, value)


# --- building a message on either side from its own annotations ------------------------------


def _build(cls: type, variant: Variant) -> Any:
    values = {
        field.name: _sample(field.kind, variant, field.name)
        for field in _fields(cls)
        if field.required or variant != "minimal"
    }
    return cls(**values)


def _sample(kind: Any, variant: Variant, name: str) -> Any:
    """A value of ``kind`` unlike any default: non-zero, non-empty, true, the last choice."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return {"gameId": name, "frames": [1, 2.5, None, True], "note": "é"}
    if origin in (Union, types.UnionType):
        if variant == "nulls":
            return None
        (inner,) = (arg for arg in args if arg is not type(None))
        return _sample(inner, variant, name)
    if origin is Literal:
        return args[-1]
    if origin in (list, tuple):
        items = [_sample(args[0], variant, f"{name}{i}") for i in (1, 2)]
        return items if origin is list else tuple(items)
    if origin in (dict, Mapping):
        return {f"{name.upper()}_A": f"{name}-a", f"{name.upper()}_B": ""}
    if isinstance(kind, type) and issubclass(kind, BaseModel | agent_side.Message):
        return _build(kind, variant)
    samples: dict[Any, Any] = {bool: True, int: 7, float: 2.5, str: f"{name}-1"}
    return samples[kind]


def _assert_same(name: str, agent_message: Any, controller_message: Any) -> None:
    for field in _fields(AGENT[name]):
        mine = _plain(getattr(agent_message, field.name))
        theirs = _plain(getattr(controller_message, field.name))
        assert mine == theirs, f"{name}.{field.name}: agent {mine!r}, controller {theirs!r}"


# --- the tests -------------------------------------------------------------------------------


def test_both_sides_declare_the_same_messages() -> None:
    assert sorted(AGENT) == sorted(CONTROLLER)
    assert len(AGENT) >= 15  # guards the discovery above against passing vacuously


@pytest.mark.parametrize("name", sorted(CONTROLLER))
def test_both_sides_declare_the_same_fields_optional_fields_and_defaults(name: str) -> None:
    agent_fields = {field.name: field for field in _fields(AGENT[name])}
    controller_fields = {field.name: field for field in _fields(CONTROLLER[name])}
    assert list(agent_fields) == list(controller_fields), f"{name}: the field sets differ"
    for field_name, theirs in controller_fields.items():
        mine = agent_fields[field_name]
        where = f"{name}.{field_name}"
        assert mine.required == theirs.required, f"{where}: required on one side only"
        assert _nullable(mine.kind) == _nullable(theirs.kind), f"{where}: nullable on one side"
        assert _plain(mine.default) == _plain(theirs.default), f"{where}: defaults differ"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(CONTROLLER))
def test_built_by_the_agent_the_controller_reads_it_field_by_field(
    name: str, variant: Variant
) -> None:
    sent = _build(AGENT[name], variant)
    wire = json.dumps(sent.to_json())
    _assert_same(name, sent, CONTROLLER[name].model_validate_json(wire))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(CONTROLLER))
def test_built_by_the_controller_the_agent_reads_it_field_by_field(
    name: str, variant: Variant
) -> None:
    sent = _build(CONTROLLER[name], variant)
    wire = sent.model_dump_json()
    _assert_same(name, AGENT[name].from_json(json.loads(wire)), sent)


@pytest.mark.parametrize("name", sorted(CONTROLLER))
def test_a_message_without_its_optional_fields_gets_the_same_defaults_on_both_sides(
    name: str,
) -> None:
    required = {field.name for field in _fields(AGENT[name]) if field.required}
    full = _build(AGENT[name], "full").to_json()
    wire = json.dumps({key: value for key, value in full.items() if key in required})
    agent_message = AGENT[name].from_json(json.loads(wire))
    _assert_same(name, agent_message, CONTROLLER[name].model_validate_json(wire))


def test_the_samples_differ_from_the_defaults() -> None:
    # guards the round trips above: a field left at its default on both sides proves little
    for name, cls in AGENT.items():
        full = _build(cls, "full")
        for field in _fields(cls):
            if not field.required:
                value = _plain(getattr(full, field.name))
                assert value != _plain(field.default), f"{name}.{field.name}"


def test_the_agent_bounds_a_result_as_the_controller_does() -> None:
    """agent/jobs.py mirrors the result limits (it cannot import the controller's policy)."""
    from agent import jobs as agent_jobs
    from sp00ky_infra.policy import jobs as policy_jobs

    assert agent_jobs.MAX_RESULT_BYTES == policy_jobs.MAX_RESULT_BYTES
    assert agent_jobs.MAX_JSON_DEPTH == policy_jobs.MAX_JSON_DEPTH
