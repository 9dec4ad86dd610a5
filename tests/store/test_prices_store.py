"""The provider's prices in the store (store/prices.py), on real SQLite and real PostgreSQL:
a reading is kept whole with its date and source, replaces the one before at once, and is
read back by the server types asked for."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from sp00ky_infra.policy.server_types import LocationPrice
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.prices import PriceReading, PriceTable
from tests.helpers import across_a_restart

SOURCE = "Hetzner Pricing API (GET /pricing)"
READ_AT = 1_796_500_000.0  # 2026-12-05, UTC


def _price(location: str, hourly: float, monthly: float, date: str = "2026-12-05") -> LocationPrice:
    return LocationPrice(location, hourly, monthly, date, SOURCE)


def reading(read_at: float = READ_AT, **types: tuple[LocationPrice, ...]) -> PriceReading:
    ipv4 = (_price("fsn1", 0.0008, 0.5), _price("hel1", 0.0008, 0.5))
    return PriceReading(read_at, MappingProxyType(types), ipv4)


def test_a_reading_is_kept_whole_with_its_date_and_source(store: SqlStore) -> None:
    table = PriceTable(store)
    assert table.read() is None  # never read: nothing kept, not an empty price list
    cx33 = (_price("fsn1", 0.0088, 5.49), _price("hel1", 0.0088, 5.49))
    table.save(reading(cx33=cx33, cax11=(_price("fsn1", 0.0061, 3.79),)))
    kept = table.read()
    assert kept is not None and kept.read_at == READ_AT
    assert dict(kept.server_types) == {"cx33": cx33, "cax11": (_price("fsn1", 0.0061, 3.79),)}
    assert kept.primary_ipv4 == (_price("fsn1", 0.0008, 0.5), _price("hel1", 0.0008, 0.5))


def test_a_new_reading_replaces_the_last_one_types_gone_included(store: SqlStore) -> None:
    table = PriceTable(store)
    table.save(reading(cx33=(_price("fsn1", 0.0088, 5.49),), cx22=(_price("fsn1", 0.006, 3.79),)))
    later = READ_AT + 86_400
    table.save(reading(later, cx33=(_price("fsn1", 0.0095, 5.99, "2026-12-06"),)))
    kept = table.read()
    assert kept is not None and kept.read_at == later
    assert dict(kept.server_types) == {"cx33": (_price("fsn1", 0.0095, 5.99, "2026-12-06"),)}


def test_a_save_that_fails_leaves_the_last_reading(store: SqlStore) -> None:
    table = PriceTable(store)
    table.save(reading(cx33=(_price("fsn1", 0.0088, 5.49),)))
    twice = (_price("fsn1", 0.01, 6.0), _price("fsn1", 0.02, 7.0))  # one key, two rows
    with pytest.raises(Exception):  # noqa: B017 - each dialect's own integrity error
        table.save(reading(cx33=twice))
    kept = table.read()
    assert kept is not None and dict(kept.server_types) == {"cx33": (_price("fsn1", 0.0088, 5.49),)}


def test_reading_some_types_reads_those_and_the_primary_ipv4(store: SqlStore) -> None:
    table = PriceTable(store)
    table.save(reading(cx33=(_price("fsn1", 0.0088, 5.49),), cax11=(_price("fsn1", 0.0061, 3.79),)))
    some = table.read({"cx33", "ccx13"})
    assert some is not None and set(some.server_types) == {"cx33"}
    assert len(some.primary_ipv4) == 2
    none = table.read(set())
    assert none is not None and dict(none.server_types) == {} and len(none.primary_ipv4) == 2


def test_a_reading_survives_a_restart(store_url: str) -> None:
    kept = across_a_restart(
        store_url,
        lambda store: PriceTable(store).save(reading(cx33=(_price("fsn1", 0.0088, 5.49),))),
        lambda store: PriceTable(store).read(),
    )
    assert kept is not None and kept.server_types["cx33"] == (_price("fsn1", 0.0088, 5.49),)
