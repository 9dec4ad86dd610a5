from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.config.durations import PATTERN, DurationError, format_duration, parse_duration
from sp00ky_infra.config.schema import load_schema


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5400),
        ("8h", 28800),
        ("14d", 1209600),
        ("1d2h3m4s", 93784),
        ("250ms", 0.25),
        ("1m30s", 90),
        ("0s", 0),
    ],
)
def test_the_docs_forms_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 min", "1.5h", "m", "30m1h", "1h1h", "-5s", "10sec"])
def test_other_text_is_refused_with_how_to_write_it(text: str) -> None:
    with pytest.raises(DurationError, match="is not a duration; write it like 90s, 10m, 1h30m"):
        parse_duration(text)


def test_a_bare_number_gets_a_unit_hint() -> None:
    with pytest.raises(DurationError, match="add a unit: 90s"):
        parse_duration("90")


def test_a_non_string_is_refused() -> None:
    with pytest.raises(DurationError, match="write it as a string"):
        parse_duration(90)  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=10**7))
def test_format_and_parse_round_trip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_schema_pattern_is_the_parser_pattern() -> None:
    assert load_schema()["$defs"]["duration"]["pattern"] == PATTERN
