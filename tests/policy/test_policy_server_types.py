"""The catalog of server types: every current x86 line is there with its locations and dated
prices, lookups name the closest current types, and the prices are the catalog's."""

from __future__ import annotations

import re

from sp00ky_infra.policy import server_types as catalog
from sp00ky_infra.policy.cost import HETZNER_PRICES, Price, price_of


def test_every_current_x86_line_and_the_arm_types_are_in_the_catalog() -> None:
    names = set(catalog.SERVER_TYPES)
    assert {"cx23", "cx33", "cx43", "cx53"} <= names
    assert {"cpx22", "cpx32", "cpx42", "cpx52", "cpx62"} <= names
    assert {"ccx13", "ccx23", "ccx33", "ccx43", "ccx53", "ccx63"} <= names
    assert {"cax11", "cax21", "cax31", "cax41"} <= names


def test_every_entry_is_dated_sourced_and_sold_somewhere() -> None:
    for kind in catalog.SERVER_TYPES.values():
        assert kind.source and kind.locations, kind.name
        assert kind.architecture == ("arm" if kind.name.startswith("cax") else "x86")
        for price in kind.prices:
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", price.date) and price.source, kind.name
            assert price.location in kind.locations and 0 < price.hourly < price.monthly


def test_a_price_per_location_and_the_reference_price_is_fsn1s_newest() -> None:
    cx33 = catalog.SERVER_TYPES["cx33"]
    assert cx33.price_at() == cx33.price_at("fsn1")
    assert (cx33.price_at("fsn1").monthly, cx33.price_at("fsn1").date) == (6.49, "2026-05-27")  # type: ignore[union-attr]
    assert cx33.price_at("ash") is None  # not sold there
    assert catalog.SERVER_TYPES["ccx13"].price_at("sin").monthly == 21.50  # type: ignore[union-attr]
    assert price_of("ccx13", location="sin").monthly == 21.50
    assert price_of("ccx13").monthly == 12.49  # fsn1's
    assert price_of("ccx13", {"ccx13": Price(1.0, 2.0)}, location="sin") == Price(1.0, 2.0)


def test_the_price_table_is_the_catalogs_and_leaves_out_what_is_unknown() -> None:
    assert HETZNER_PRICES["cx33"].monthly == 6.49 and HETZNER_PRICES["cpx42"].monthly == 19.99
    assert "cx22" not in HETZNER_PRICES  # deprecated, no price known: never free
    assert set(HETZNER_PRICES) == {n for n, t in catalog.SERVER_TYPES.items() if t.prices}


def test_closest_and_replacements() -> None:
    assert catalog.closest("cx24") == ["cx23", "cx33", "cx43"]
    assert all(not catalog.is_deprecated(n) for n in catalog.closest("cpx43"))
    assert catalog.replacements("cx42") == ("cx43",) and catalog.is_deprecated("cx22")
    assert not catalog.is_deprecated("cx23") and catalog.offered("cx23") == ("fsn1", "nbg1", "hel1")
    assert "cax21" not in catalog.current("x86") and "cax21" in catalog.current("arm")
