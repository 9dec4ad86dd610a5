"""A payload's check against its backend's spec: jsonschema-rs (compiled) stands in for
jsonschema where the schema uses only keywords the two agree on, and accepts; whatever it
does not accept, and every other schema, jsonschema decides and names. The verdict is
jsonschema's in every case: property-tested on generated payloads against a spec with $refs,
unions, numeric bounds and big integers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from sp00ky_infra.client import (
    _fast_validator,
    _payload_document,
    _spec_version,
    check_payload,
)
from sp00ky_infra.store import InvalidJob
from tests.helpers import ROOT

BIG = 9_007_199_254_740_993  # 2**53 + 1: no float is it
ORDER = {
    "type": "object",
    "required": ["id", "items"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": BIG},
        "note": {"type": ["string", "null"], "maxLength": 5},
        "kind": {"enum": ["a", "b", 1, None]},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {"$ref": "#/components/schemas/Item"},
        },
        "price": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10.5},
        "flag": {"const": True},
        "choice": {"oneOf": [{"type": "string", "minLength": 2}, {"type": "integer"}, {}]},
        "meta": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 2,
            "additionalProperties": {"type": "number"},
        },
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}]},
        "never": {"not": {}},
        "x": {"allOf": [{"type": "integer"}, {"minimum": 0}], "description": "annotated"},
    },
}
ITEM = {
    "type": "object",
    "required": ["sku"],
    "properties": {
        "sku": {"type": "string", "minLength": 1, "format": "uuid"},
        "qty": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
    },
}


def _spec(schema: dict[str, Any], components: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"required": True, "content": {"application/json": {"schema": schema}}}
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {"/order": {"post": {"requestBody": body}}},
    }
    if components:
        spec["components"] = {"schemas": components}
    return spec


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("spec") / "openapi.yml"
    spec = _spec({"$ref": "#/components/schemas/Order"}, {"Order": ORDER, "Item": ITEM})
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _accepted(spec_path: str, route: str, payload: Any) -> bool:
    try:
        check_payload(spec_path, "b", route, payload)
    except InvalidJob:
        return False
    return True


def _reference(spec_path: str, route: str, payload: Any) -> bool:
    document = _payload_document(spec_path, _spec_version(spec_path), route)
    return not any(Draft202012Validator(document).iter_errors(payload))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, BIG - 1, BIG, BIG + 1, 2**53, 2**64])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, 10.5, 10.499999, 1e-9, 1.0])
    | st.text(alphabet="ab1-", max_size=7),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["sku", "qty", "n", "a"]), children, max_size=3)
    ),
    max_leaves=12,
)
numbers = st.integers(-5, 12) | st.floats(-1, 11, allow_nan=False) | st.sampled_from([0, 10.5])
valid_items = st.lists(
    st.fixed_dictionaries(
        {"sku": st.text(alphabet="ab-", min_size=1, max_size=3)},
        optional={"qty": st.none() | st.integers(0, 3), "other": json_values},
    ),
    min_size=1,
    max_size=3,
)
valid_orders = st.fixed_dictionaries(
    {"id": st.integers(1, 3) | st.sampled_from([BIG - 1, BIG]), "items": valid_items},
    optional={
        "note": st.none() | st.text(alphabet="ab", max_size=5),
        "kind": st.sampled_from(["a", "b", 1, 1.0, None]),
        "price": st.floats(0, 10.5, allow_nan=False, exclude_min=True, exclude_max=True),
        "flag": st.just(True),
        # exactly one of its three: neither a string of two or more nor an integer
        "choice": st.none() | st.booleans() | st.text("ab", max_size=1) | st.just(1.5),
        "meta": st.dictionaries(st.text("ab", max_size=2), numbers, min_size=1, max_size=2),
        "pair": st.tuples(st.text("ab", max_size=2), numbers).map(list),
        "x": st.integers(0, 3) | st.sampled_from([0.0, 2.0]),
    },
)
# Each field's values at and past its bounds (and of its neighbouring types)
EDGES: dict[str, list[Any]] = {
    "id": [0, 1, BIG, BIG + 1, 2**64, -1, 1.0, 1.5, "1", True, None],
    "note": ["abcde", "abcdef", None, 5, ""],
    "kind": ["a", "c", 1, 1.0, True, None, 0, []],
    "price": [0, 0.0, -0.0, 1e-300, 10.5, 10.499999, 11, True, "1", None],
    "flag": [True, 1, 1.0, False, None],
    "choice": ["a", "ab", 1, 1.5, True, None, [], {}],
    "meta": [{}, {"a": 1}, {"a": 1, "b": 2.5}, {"a": 1, "b": 2, "c": 3}, {"a": "x"}, {"a": True}],
    "pair": [[], ["a"], ["a", 1], [1, "a"], ["a", 1, None], ["a", True], ["a", 1.5]],
    "never": [None, 0, {}, False],
    "x": [0, -1, 1.0, 1.5, True, "0", None],
    "items": [
        [],
        [{}],
        [{"sku": ""}],
        [{"sku": "a"}] * 4,
        [{"sku": "a", "qty": -1}],
        [{"sku": "a", "qty": None}],
        [{"sku": "a", "qty": 1.0}],
        [{"sku": "a", "qty": 2**64}],
        [{"sku": 1}],
        [{"sku": "a", "extra": [1]}],
        ["a"],
    ],
    "other": [1, None],
}
orders_payloads = (
    valid_orders
    | st.tuples(
        valid_orders, st.sampled_from([(key, v) for key, vs in EDGES.items() for v in vs])
    ).map(lambda t: {**t[0], t[1][0]: t[1][1]})
    | st.tuples(valid_orders, st.sampled_from([*EDGES]), json_values).map(
        lambda t: {**t[0], t[1]: t[2]}
    )
    | json_values
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=orders_payloads)
def test_every_verdict_is_jsonschemas(orders: str, payload: Any) -> None:
    assert _fast_validator(orders, _spec_version(orders), "/order") is not None  # in use
    assert _accepted(orders, "/order", payload) == _reference(orders, "/order", payload)


@settings(max_examples=400, deadline=None)
@given(
    payload=st.fixed_dictionaries(
        {"gameId": st.text(alphabet="g1", max_size=3) | json_values},
        optional={
            "format": st.sampled_from(["mp4", "gif", "avi"]) | json_values,
            "seconds": st.floats(-1, 3601, allow_nan=False) | st.sampled_from([0, 3600, True]),
            "fail": json_values,
            "colour": json_values,
        },
    )
    | json_values
)
def test_the_example_backends_payloads_get_jsonschemas_verdict(payload: Any) -> None:
    spec = str(ROOT / "examples/backend/openapi.yml")
    assert _fast_validator(spec, _spec_version(spec), "/render") is not None
    assert _accepted(spec, "/render", payload) == _reference(spec, "/render", payload)


def test_integers_past_2_53_are_judged_exactly(orders: str) -> None:
    base = {"items": [{"sku": "s"}]}
    assert _accepted(orders, "/order", {**base, "id": BIG})
    assert not _accepted(orders, "/order", {**base, "id": BIG + 1})
    assert not _accepted(orders, "/order", {**base, "id": 2**64})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^a$"},  # another regular-expression dialect
        {"type": "number", "multipleOf": 0.01},  # another float arithmetic
        {"type": "object", "patternProperties": {"^x": {}}},
        {"type": "array", "uniqueItems": True},
        {"$ref": "https://example.invalid/schema.json"},  # never fetched
        {"$id": "https://example.invalid/s", "type": "object"},
        {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/Nope"}}},
    ],
)
def test_a_schema_with_a_keyword_they_may_disagree_on_is_jsonschemas_alone(
    tmp_path: Path, schema: dict[str, Any]
) -> None:
    path = tmp_path / "openapi.yml"
    path.write_text(yaml.safe_dump(_spec(schema)))
    assert _fast_validator(str(path), _spec_version(str(path)), "/order") is None


def test_a_refused_payload_is_named_by_jsonschema(orders: str) -> None:
    with pytest.raises(InvalidJob) as refused:
        check_payload(orders, "shop", "/order", {"id": 0, "items": [{}], "extra": 1})
    text = str(refused.value)
    assert "refused by backend shop's spec (POST /order)" in text
    assert "payload.id: 0 is less than the minimum of 1" in text
    assert "payload.items[0].sku is required" in text
    assert "payload.extra is not a field of this route" in text
