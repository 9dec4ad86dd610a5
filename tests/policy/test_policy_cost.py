"""Hetzner's billing rule: per started hour, never more than the monthly price."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.policy.cost import (
    HETZNER_PRICES,
    MONTH,
    Price,
    UnknownPrice,
    billed_hours,
    idle_euros,
    machine_euros,
    parse_price,
    price_of,
)

CX33 = HETZNER_PRICES["cx33"]


@pytest.mark.parametrize(
    ("seconds", "hours"), [(0, 0), (1, 1), (3599, 1), (3600, 1), (3601, 2), (7200, 2)]
)
def test_every_started_hour_is_billed(seconds: float, hours: int) -> None:
    assert billed_hours(seconds) == hours


def test_a_few_minutes_cost_one_hour_and_a_month_costs_the_monthly_price() -> None:
    assert machine_euros(CX33, 300) == pytest.approx(0.0104)
    assert machine_euros(CX33, 25 * 3600) == pytest.approx(25 * 0.0104)
    assert machine_euros(CX33, 700 * 3600) == pytest.approx(6.49)  # 700 h x 0.0104 > 6.49
    assert machine_euros(CX33, 0) == 0.0


@given(st.floats(min_value=0, max_value=3 * MONTH), st.floats(min_value=0, max_value=3600))
def test_the_bill_grows_with_time_and_never_beats_the_cap(seconds: float, more: float) -> None:
    price = Price(0.0104, 6.49)
    assert machine_euros(price, seconds) <= machine_euros(price, seconds + more) + 1e-9
    months = -(-seconds // MONTH) if seconds else 0
    assert machine_euros(price, seconds) <= max(1, months) * price.monthly + 1e-9


def test_idle_euros_are_the_idle_share_of_the_bill() -> None:
    assert idle_euros(1.0, 100.0, 25.0) == pytest.approx(0.25)
    assert idle_euros(1.0, 100.0, 200.0) == 1.0 and idle_euros(1.0, 0.0, 5.0) == 0.0


def test_local_and_docker_machines_are_free_and_unknown_types_say_how_to_price_them() -> None:
    assert price_of("cx33", provider="docker") == Price(
        0.0, 0.0, price_of("x", provider="docker").source
    )
    assert price_of("cpx42", {"cpx42": Price(0.03, 18.0)}).monthly == 18.0
    with pytest.raises(UnknownPrice) as found:
        price_of("cx22")  # deprecated: in the catalog, with no known price
    assert "--price cx22=HOURLY/MONTHLY" in str(found.value)


def test_a_price_on_the_command_line() -> None:
    assert parse_price("cpx42=0.0304/18.99") == (
        "cpx42",
        Price(0.0304, 18.99, "given on the command line"),
    )
    with pytest.raises(ValueError, match="write TYPE=HOURLY/MONTHLY in EUR"):
        parse_price("cpx42=cheap")
