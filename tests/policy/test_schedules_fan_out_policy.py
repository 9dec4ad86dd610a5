"""A fan-out's pure decisions (policy/schedules.py): a fire's items from its query's rows, an
item's payload, what lint can tell of a query and its key, and a resumed schedule's cursor."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sp00ky_infra.policy.schedules import (
    FanOutRefused,
    Interval,
    due,
    fan_out_items,
    item_payload,
    key_problem,
    query_problem,
    resumed_cursor,
    selected_columns,
)
from tests.helpers import examples


def test_each_row_is_an_item_named_by_its_key() -> None:
    rows = [(7, "acme"), ("t-2", "bolt"), (3.5, "x")]
    assert fan_out_items(("id", "name"), rows, "id", 10) == ("7", '"t-2"', "3.5")
    assert fan_out_items(("id",), [], "id", 10) == ()  # no row: a fire with nothing to fan out


@pytest.mark.parametrize(
    ("columns", "rows", "reason"),
    [
        (
            ("id",),
            [(1,), (2,), (3,)],
            "the query returned more than maxRows (2) rows; narrow it or raise forEach.maxRows",
        ),
        (
            ("tenant_id",),
            [(1,)],
            "the query's rows have no column 'id' (columns: tenant_id); select it or change "
            "forEach.key",
        ),
        (("id",), [(1,), (None,)], "row 2 has no id (null or empty): every row needs one"),
        (("id",), [("",)], "row 1 has no id (null or empty): every row needs one"),
        (("id",), [(1,), (1,)], "id 1 is on more than one row; the key must identify one row"),
    ],
)
def test_rows_that_cannot_be_fanned_out_fail_the_whole_fire(
    columns: tuple[str, ...], rows: list[tuple[object, ...]], reason: str
) -> None:
    assert fan_out_items(columns, rows, "id", 2) == FanOutRefused(reason)


@settings(max_examples=examples(100))
@given(st.lists(st.one_of(st.integers(), st.text(min_size=1)), unique=True, max_size=50))
def test_distinct_keys_make_one_item_each_that_gives_the_key_back(keys: list[object]) -> None:
    made = fan_out_items(("id",), [(key,) for key in keys], "id", 50)
    assert not isinstance(made, FanOutRefused)
    assert [item_payload(None, "id", item)["id"] for item in made] == keys


def test_a_value_json_cannot_carry_is_its_text() -> None:
    class Uuid:
        def __str__(self) -> str:
            return "0b7e"

    assert fan_out_items(("id",), [(Uuid(),)], "id", 5) == (json.dumps("0b7e"),)


def test_an_items_payload_is_the_schedules_with_its_key() -> None:
    assert item_payload(None, "id", "42") == {"id": 42}
    assert item_payload({"full": True}, "id", '"t-1"') == {"full": True, "id": "t-1"}
    assert item_payload({"id": "mine"}, "id", "1") == {"id": 1}  # the row's key wins


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("SELECT id FROM tenant", None),
        ("  select id from tenant ;", None),
        ("WITH t AS (SELECT 1 AS id) SELECT id FROM t", None),
        ("SELECT ';' AS id FROM tenant", None),
        ("", "the query is empty; write one SELECT, like `SELECT id FROM tenant`"),
        ("DELETE FROM tenant", "the query starts with DELETE, not SELECT; it may only read rows"),
        (
            "SELECT id FROM tenant; DELETE FROM tenant",
            "the query holds more than one statement; write a single SELECT",
        ),
    ],
)
def test_what_lint_tells_of_a_query(query: str, problem: str | None) -> None:
    assert query_problem(query) == problem


@pytest.mark.parametrize(
    ("query", "columns"),
    [
        ("SELECT id FROM tenant", ("id",)),
        ("SELECT t.id, name AS label FROM tenant t", ("id", "label")),
        ("SELECT DISTINCT id FROM tenant", ("id",)),
        ('SELECT coalesce(a, b) AS "key" FROM t', ("key",)),
        ("SELECT * FROM tenant", None),  # only the database knows
        ("SELECT count(*) FROM tenant", None),
        ("WITH t AS (SELECT 1 AS id) SELECT id FROM t", None),
    ],
)
def test_the_columns_lint_can_tell(query: str, columns: tuple[str, ...] | None) -> None:
    assert selected_columns(query) == columns


def test_a_key_is_a_column_name() -> None:
    assert key_problem("tenant_id") is None
    assert key_problem("id; drop") == (
        "key 'id; drop' is not a column name; name the column that identifies a row, like id"
    )


def test_fire_times_missed_while_paused_are_not_made() -> None:
    """Paused from 10:00:30 to 10:05:10 (every 1m): the next fire is 10:06, not a catch-up."""
    every = Interval(60.0)
    last_fire, resumed = 600.0, 910.0
    assert due(every, resumed_cursor(last_fire, resumed), 0.0, 911.0) is None
    decision = due(every, resumed_cursor(last_fire, resumed), 0.0, 960.0)
    assert decision is not None and decision.fire_at == 960.0 and decision.missed_since is None
    assert resumed_cursor(last_fire, None) == last_fire  # never paused
    assert resumed_cursor(1000.0, 910.0) == 1000.0  # fired after its resume
    assert resumed_cursor(None, 910.0) == 910.0
