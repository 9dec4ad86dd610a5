"""Hetzner Cloud's server types: what each one is, where it is sold and what it costs, dated and
sourced entry by entry. Pure data and pure lookups, shared by lint, the prices, the fake API
and the simulator.

Sources (each price below names its own):

- SPECS_2025: "Hetzner Cloud Server Pricing Comparison", last update 2025-10-21,
  https://github.com/tonoid/hcloud-multiregion-mongodb-replicaset/blob/0753c4c/HETZNER_SERVERS.md
  (read 2026-12): cores, memory, disk, cpu type and architecture of the CX, CPX, CCX and CAX
  lines, the locations selling each ("-" = not sold there) and their net prices per location,
  before the 1 April 2026 adjustment; its note "IPv6 toggle ... EUR 0.50/month savings" is
  the primary IPv4's monthly net price.
- The CX prices after the 1 April 2026 adjustment, for fsn1 (cited at each price below).
- Deprecations: Hetzner's changelog "2025-10-16 server types deprecated",
  https://docs.hetzner.cloud/changelog#2025-10-16-server-types-deprecated (cited by
  apricote/hcloud-upload-image#129 and pulumi/pulumi-hcloud#939; the API warns "Server Type
  "cx42" is deprecated in all locations and will no longer be available for order as of
  2025-12-31", hcloud-talos/terraform-hcloud-talos#316): cx22, cx32, cx42 and cx52.

Not known here, and left unknown rather than guessed: gross prices (they are net x the
customer's VAT rate, which the API reports per account), the primary IPv4's hourly price, the
2026 prices of the CPX, CCX and CAX lines and of the CX line outside fsn1 (their 2025 figures
stay, dated), and the specs of cx32, cx42 and cx52 (known here by name and deprecation only).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

CpuType = Literal["shared", "dedicated"]
Architecture = Literal["x86", "arm"]

SPECS_2025 = "tonoid/hcloud-multiregion-mongodb-replicaset HETZNER_SERVERS.md"
DEPRECATION = "Hetzner changelog 2025-10-16, server types deprecated (orderable until 2025-12-31)"
SIN, HEL, EU_DE, US = ("sin",), ("hel1",), ("fsn1", "nbg1"), ("hil", "ash")
EU = ("fsn1", "nbg1", "hel1")
# Which location's price stands for a type when no location is asked for: the default one first.
PREFERENCE = ("fsn1", "nbg1", "hel1", "ash", "hil", "sin")


@dataclass(frozen=True, slots=True)
class LocationPrice:
    """One server type's net price in EUR at one location, with its date and source."""

    location: str
    hourly: float
    monthly: float
    date: str
    source: str


@dataclass(frozen=True, slots=True)
class ServerType:
    name: str
    cores: int
    memory: float  # GB
    disk: int  # GB
    architecture: Architecture
    cpu_type: CpuType
    locations: tuple[str, ...]  # where it is sold
    prices: tuple[LocationPrice, ...] = ()
    deprecated: bool = False
    source: str = SPECS_2025

    def price_at(self, location: str | None = None) -> LocationPrice | None:
        """Its price at ``location``; with none given, the newest-dated price (on a tie, the
        first location of PREFERENCE's). None: no price is known."""
        if location is not None:
            return next((p for p in self.prices if p.location == location), None)
        if not self.prices:
            return None
        newest = max(p.date for p in self.prices)
        dated = [p for p in self.prices if p.date == newest]
        return min(dated, key=lambda p: PREFERENCE.index(p.location))


def _priced(
    name: str,
    spec: tuple[int, float, int, Architecture, CpuType],
    by_group: dict[tuple[str, ...], tuple[float, float]],
) -> ServerType:
    """One SPECS_2025 row: its specs and its (hourly, monthly) net price per location group."""
    cores, memory, disk, arch, cpu = spec
    prices = tuple(
        LocationPrice(location, hourly, monthly, "2025-10-21", SPECS_2025)
        for group, (hourly, monthly) in by_group.items()
        for location in group
    )
    locations = tuple(p.location for p in prices)
    return ServerType(name, cores, memory, disk, arch, cpu, locations, prices)


def _ccx(
    name: str, spec: tuple[int, float, int], sin: float, eu: float, us: float, *hourly: float
) -> ServerType:
    """A CCX type: sold everywhere; fsn1, nbg1 and hel1 at one price, the US and sin at theirs."""
    h_sin, h_eu, h_us = hourly
    groups = {EU_DE: (h_eu, eu), HEL: (h_eu, eu), US: (h_us, us), SIN: (h_sin, sin)}
    return _priced(name, (*spec, "x86", "dedicated"), groups)


def _eu(
    name: str, spec: tuple[int, float, int, Architecture, CpuType], hourly: float, monthly: float
) -> ServerType:
    """A type sold in fsn1, nbg1 and hel1 only, at one price."""
    return _priced(name, spec, {EU_DE: (hourly, monthly), HEL: (hourly, monthly)})


# The CX line after the 1 April 2026 adjustment (fsn1); hourly is the monthly cap / 624 rounded
# as Hetzner rounds it (cx33: 6.49 / 624 = 0.0104, as the API returns it).
CX_2026: Mapping[str, LocationPrice] = MappingProxyType(
    {
        # Hetzner Pricing API (GET /v1/pricing, fsn1) as quoted on 2026-05-27 in
        # github.com/devantler-tech/platform commit cb791c6: cap 6.49, hourly 0.0104.
        "cx33": LocationPrice("fsn1", 0.0104, 6.49, "2026-05-27", "Hetzner Pricing API"),
        # https://docs.vdhome.be/reference/costs (2026-04-15): cx23 3.99 a month, cx53 0.036
        # an hour.
        "cx23": LocationPrice("fsn1", 0.0064, 3.99, "2026-04-15", "docs.vdhome.be cost breakdown"),
        "cx53": LocationPrice("fsn1", 0.0360, 22.49, "2026-04-15", "docs.vdhome.be cost breakdown"),
        # devantler-tech/platform#1784 (2026-05): 1.50 EUR per vCPU a month, 8 vCPU.
        "cx43": LocationPrice("fsn1", 0.0192, 11.99, "2026-05-01", "devantler-tech/platform#1784"),
    }
)


def _cx(name: str, spec: tuple[int, float, int], hourly: float, monthly: float) -> ServerType:
    """A CX type: SPECS_2025's prices, fsn1's replaced by the 2026 one where known."""
    old = _eu(name, (*spec, "x86", "shared"), hourly, monthly)
    new = CX_2026.get(name)
    if new is None:
        return old
    prices = tuple(new if p.location == new.location else p for p in old.prices)
    return ServerType(old.name, *spec, "x86", "shared", old.locations, prices)


def _cpx(
    name: str, spec: tuple[int, float, int], sin: float, eu: float, *hourly: float
) -> ServerType:
    """A current CPX type: sold in fsn1, nbg1 and hel1 at one price, and in sin at its own."""
    h_sin, h_eu = hourly
    groups = {EU_DE: (h_eu, eu), HEL: (h_eu, eu), SIN: (h_sin, sin)}
    return _priced(name, (*spec, "x86", "shared"), groups)


def _us(name: str, spec: tuple[int, float, int], hourly: float, monthly: float) -> ServerType:
    """A previous-generation CPX type, sold in the US locations only."""
    return _priced(name, (*spec, "x86", "shared"), {US: (hourly, monthly)})


# Every row's figures are SPECS_2025's unless its helper says otherwise.
SERVER_TYPES: Mapping[str, ServerType] = MappingProxyType(
    {
        t.name: t
        for t in (
            _cx("cx23", (2, 4.0, 40), 0.0056, 3.49),
            _cx("cx33", (4, 8.0, 80), 0.0088, 5.49),
            _cx("cx43", (8, 16.0, 160), 0.0152, 9.49),
            _cx("cx53", (16, 32.0, 320), 0.0280, 17.49),
            _priced("cpx12", (1, 2.0, 40, "x86", "shared"), {SIN: (0.0104, 6.49)}),
            _cpx("cpx22", (2, 4.0, 80), 12.49, 6.49, 0.0200, 0.0104),
            _cpx("cpx32", (4, 8.0, 160), 25.49, 10.99, 0.0408, 0.0176),
            _cpx("cpx42", (8, 16.0, 320), 43.49, 19.99, 0.0697, 0.0320),
            _cpx("cpx52", (12, 24.0, 480), 60.49, 28.49, 0.0969, 0.0457),
            _cpx("cpx62", (16, 32.0, 640), 77.49, 38.99, 0.1242, 0.0625),
            _us("cpx11", (2, 2.0, 40), 0.0080, 4.99),
            _us("cpx21", (3, 4.0, 80), 0.0153, 9.49),
            _us("cpx31", (4, 8.0, 160), 0.0265, 16.49),
            _us("cpx41", (8, 16.0, 240), 0.0489, 30.49),
            _us("cpx51", (16, 32.0, 360), 0.0970, 60.49),
            _ccx("ccx13", (2, 8.0, 80), 21.50, 12.49, 13.49, 0.0345, 0.0200, 0.0217),
            _ccx("ccx23", (4, 16.0, 160), 39.90, 24.49, 26.49, 0.0639, 0.0392, 0.0425),
            _ccx("ccx33", (8, 32.0, 240), 74.90, 48.49, 50.49, 0.1200, 0.0777, 0.0810),
            _ccx("ccx43", (16, 64.0, 360), 137.50, 96.49, 100.49, 0.2204, 0.1546, 0.1611),
            _ccx("ccx53", (32, 128.0, 600), 294.50, 192.49, 200.49, 0.4720, 0.3085, 0.3213),
            _ccx("ccx63", (48, 192.0, 960), 482.50, 288.49, 300.49, 0.7732, 0.4623, 0.4816),
            _eu("cax11", (2, 4.0, 40, "arm", "shared"), 0.0061, 3.79),
            _eu("cax21", (4, 8.0, 80, "arm", "shared"), 0.0104, 6.49),
            _eu("cax31", (8, 16.0, 160, "arm", "shared"), 0.0200, 12.49),
            _eu("cax41", (16, 32.0, 320, "arm", "shared"), 0.0392, 24.49),
            # deprecated: still answered by the API and still on running servers. The specs
            # are the ones this project's fake API has used; no price is known here.
            ServerType(
                "cx22", 2, 4.0, 40, "x86", "shared", EU, deprecated=True, source=DEPRECATION
            ),
        )
    }
)

# Deprecated types known by name only (no specs sourced here), and what replaces each one.
REPLACEMENTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"cx22": ("cx23",), "cx32": ("cx33",), "cx42": ("cx43",), "cx52": ("cx53",)}
)

# The primary IPv4 a server gets is billed on top of the server (SPECS_2025's note); its
# hourly price is not known here.
PRIMARY_IPV4_MONTHLY = LocationPrice("", 0.0, 0.50, "2025-10-21", SPECS_2025)

# A GB of snapshot a month, net (``monthly``; no hourly price is published): "~0.0119 EUR /
# GB / month", hetsnap.com/docs/snapshots (read 2026-12), the price before the 1 April 2026
# adjustment, which made "volumes and snapshots 30 % more expensive" (cloudtally.eu, "The
# Hetzner Cloud costs you're probably missing", reviewed 2026-04-18) at a figure not known
# here. GET /pricing's ``image.price_per_gb_month`` is the current one.
SNAPSHOT_SOURCE = "hetsnap.com/docs/snapshots, before the 2026-04-01 adjustment"
SNAPSHOT_GB_MONTHLY = LocationPrice("", 0.0, 0.0119, "2026-03-31", SNAPSHOT_SOURCE)


CATALOG_DATE = max(p.date for t in SERVER_TYPES.values() for p in t.prices)


def server_type(name: str) -> ServerType | None:
    return SERVER_TYPES.get(name)


def is_deprecated(name: str) -> bool:
    known = SERVER_TYPES.get(name)
    return name in REPLACEMENTS or (known is not None and known.deprecated)


def current(architecture: Architecture | None = None) -> list[str]:
    """The current (not deprecated) types, of one architecture if given."""
    return [
        t.name
        for t in SERVER_TYPES.values()
        if not t.deprecated and (architecture is None or t.architecture == architecture)
    ]


def closest(name: str, architecture: Architecture | None = "x86", n: int = 3) -> list[str]:
    """The current types nearest ``name``: of its line (cx, cpx, ...) the nearest in number
    (cx24: cx23, cx33, ...); for a name of no known line, the nearest in spelling."""
    found = re.fullmatch(r"([a-z]+)(\d+)", name)
    candidates = current(architecture)
    if found is not None:
        line, number = found.group(1), int(found.group(2))
        same = [(c, int(c[len(line) :])) for c in candidates if re.fullmatch(line + r"\d+", c)]
        if same:
            return [c for c, size in sorted(same, key=lambda cs: (abs(cs[1] - number), cs[1]))][:n]
    return difflib.get_close_matches(name, candidates, n=n, cutoff=0.4)


def replacements(name: str) -> tuple[str, ...]:
    """What replaces a deprecated type (its successor in the same line)."""
    return REPLACEMENTS.get(name, ())


def offered(name: str) -> tuple[str, ...]:
    """The locations selling ``name`` (none for a type unknown here)."""
    known = SERVER_TYPES.get(name)
    return known.locations if known is not None else ()
